"""Contracts of rlkit.llm's public functions at their edges.

Bad arguments raise TypeError/ValueError naming the argument; empty batches (B = 0) and empty
responses (T = 0) give empty results; masked-out padding never puts NaN into values or gradients.
Values are compared with independent computations written here: a full forward pass with an
explicit log-softmax and gather, a slow per-row top-k/top-p filter, and a one-row-at-a-time
greedy decoder without the KV cache.
"""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn as nn

import rlkit
from rlkit.llm import (
    ADDITION,
    GPT,
    CharTokenizer,
    GPTConfig,
    Problem,
    Task,
    TinyGRULM,
    call_model,
    evaluate,
    get_task,
    numeric_close,
    sample,
    sampling_logprobs,
    token_logprobs,
)
from rlkit.llm.pretrain import CorpusConfig, TrainConfig
from rlkit.plots import mean_band, smooth


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    """One torch thread, as the chapters use; restored afterwards."""
    prev, _ = torch.get_num_threads(), torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def gpt():
    """A random GPT (the default vocabulary) with weights 5x the init, so outputs differ per token."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_embd=32, n_head=4, n_layer=2))
    with torch.no_grad():
        torch._foreach_mul_(list(model.parameters()), 5.0)
    return model.eval()


class TableLM(nn.Module):
    """A protocol model whose logits at position t are ``table[t] + offset[t]``; ``offset`` may
    hold NaN or inf (a model misbehaving at padded positions) while the gradient w.r.t. ``table``
    is the identity."""

    def __init__(self, T, V, bad_from=None, bad=float("nan")):
        super().__init__()
        torch.manual_seed(1)
        self.table = nn.Parameter(torch.randn(T, V))
        offset = torch.zeros(T, V)
        if bad_from is not None:
            offset[bad_from:] = bad
        self.register_buffer("offset", offset)

    def forward(self, ids):
        return (self.table + self.offset)[: ids.shape[1]].expand(ids.shape[0], -1, -1)


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


def raises(err, match, fn, *args, **kw):
    with pytest.raises(err, match=match):
        fn(*args, **kw)


# ------------------------------------------------------------------------------- GPTConfig, GPT

@pytest.mark.parametrize("field", ["vocab_size", "block_size", "n_layer", "n_head", "n_embd"])
def test_gpt_config_names_the_field(field):
    for bad, err in ((0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError), ("4", TypeError),
                     (10 ** 7, ValueError)):
        raises(err, rf"GPTConfig\.{field} must be an int", GPTConfig, **{field: bad})


def test_gpt_forward_contracts(gpt, tok):
    V = tok.vocab_size
    raises(TypeError, "ids must be a torch.Tensor of dtype int64", gpt, torch.zeros(2, 3))
    raises(TypeError, "ids must be a torch.Tensor", gpt, [[1, 2]])
    raises(ValueError, "ids must have 2 dimension", gpt, torch.zeros(3, dtype=torch.long))
    raises(ValueError, rf"ids must lie in \[0, {V}\)", gpt, torch.tensor([[2, V]]))
    raises(ValueError, rf"ids must lie in \[0, {V}\)", gpt, torch.tensor([[-1, 2]]))
    ids = torch.full((2, 3), 5)
    raises(TypeError, "attention_mask must be a bool", gpt, ids, attention_mask=torch.ones(2, 3))
    raises(ValueError, "attention_mask has shape", gpt, ids, attention_mask=torch.ones(2, 4, dtype=torch.bool))
    raises(TypeError, "cache must be a KVCache", gpt, ids, cache={})
    raises(ValueError, "more than block_size", gpt, torch.zeros(1, 33, dtype=torch.long))
    raises(ValueError, "ids has 2 items but cache has 3", gpt, ids, cache=gpt.new_cache(3))
    raises(ValueError, "more than the cache's max_len", gpt, ids, cache=gpt.new_cache(2, 2))
    raises(ValueError, "batch must be >= 0", gpt.new_cache, -1)
    raises(ValueError, r"max_len must be an int in \[1, 32\]", gpt.new_cache, 2, 0)
    raises(ValueError, r"max_len must be an int in \[1, 32\]", gpt.new_cache, 2, 33)
    # edges: empty batch, empty sequence, through the cache too
    assert gpt(torch.zeros(0, 4, dtype=torch.long)).shape == (0, 4, V)
    assert gpt(torch.zeros(3, 0, dtype=torch.long)).shape == (3, 0, V)
    cache = gpt.new_cache(0, 4)
    assert gpt(torch.zeros(0, 4, dtype=torch.long), cache=cache).shape == (0, 4, V) and cache.length == 4


def test_gru_contracts(tok):
    g = TinyGRULM(tok.vocab_size, hidden=8)
    assert g(torch.zeros(3, 0, dtype=torch.long)).shape == (3, 0, tok.vocab_size)
    assert g(torch.zeros(0, 2, dtype=torch.long)).shape == (0, 2, tok.vocab_size)
    raises(ValueError, "vocab_size must be >= 2", TinyGRULM, 1)
    raises(ValueError, r"ids must lie in \[0, 56\)", g, torch.tensor([[60]]))


# ------------------------------------------------------------------------------- tokenizer

def test_tokenizer_contracts(tok):
    raises(TypeError, "chars must be a non-empty str", CharTokenizer, "")
    raises(ValueError, r"chars must not repeat items, repeated: \['a'\]", CharTokenizer, "aba")
    raises(ValueError, "chars must not contain the reserved", CharTokenizer, "ab\n")
    raises(TypeError, "text must be a str", tok.encode, 12)
    raises(TypeError, "eos must be a bool", tok.encode, "12", eos=1)
    raises(ValueError, "text: character '#' at position 1", tok.encode, "1#")
    raises(TypeError, r"ids\[1\] must be an int", tok.decode, [3, 2.5])
    raises(ValueError, r"ids\[0\] must be an int in \[0, 55\]", tok.decode, [56])
    raises(TypeError, "ids must be a torch.Tensor of dtype int64", tok.decode, torch.tensor([3.0]))
    raises(ValueError, "ids must have 1 dimension", tok.decode, torch.zeros(1, 2, dtype=torch.long))
    raises(ValueError, "ids must have 2 dimension", tok.decode_batch, torch.zeros(2, dtype=torch.long))
    raises(TypeError, "texts must be a list of str", tok.encode_batch, "1+2=")
    raises(TypeError, r"texts\[1\] must be a str", tok.encode_batch, ["1", 2])
    raises(ValueError, r"texts\[0\] is empty", tok.encode_batch, ["", "1"])
    ids, mask = tok.encode_batch([])
    assert ids.shape == mask.shape == (0, 0) and ids.dtype == torch.long and mask.dtype == torch.bool
    assert tok.decode_batch(torch.zeros(0, 5, dtype=torch.long)) == []
    assert tok.decode_batch(torch.zeros(2, 0, dtype=torch.long)) == ["", ""]
    assert tok.decode([]) == "" and tok.encode("") == []


# ------------------------------------------------------------------------------- sampling_logprobs

def slow_filtered(z, temperature, top_k, top_p):
    """q over one row of logits, with plain Python: softmax(z / T), keep the top k, renormalise,
    keep tokens in order while the mass before them is below p, renormalise."""
    w = [math.exp(v / temperature) for v in z.tolist()]
    s = sum(w)
    p = [x / s for x in w]
    order = sorted(range(len(p)), key=lambda i: -p[i])
    keep = set(order[:top_k] if top_k else order)
    s = sum(p[i] for i in keep)
    p = [p[i] / s if i in keep else 0.0 for i in range(len(p))]
    if top_p is not None:
        kept, before = set(), 0.0
        for i in order:
            if i in keep and (before < top_p or not kept):
                kept.add(i)
            before += p[i]
        s = sum(p[i] for i in kept)
        p = [p[i] / s if i in kept else 0.0 for i in range(len(p))]
    return torch.tensor(p, dtype=torch.float64)


@pytest.mark.parametrize("kw", [dict(temperature=0.7), dict(top_k=3), dict(top_p=0.6),
                                dict(temperature=1.5, top_k=5, top_p=0.8)])
def test_sampling_logprobs_equals_a_slow_reference(kw):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 9, generator=g, dtype=torch.float64) * 2
    got = sampling_logprobs(logits, **kw).exp()
    full = {**dict(temperature=1.0, top_k=None, top_p=None), **kw}
    for b in range(6):
        assert torch.allclose(got[b], slow_filtered(logits[b], **full), atol=1e-9)


@pytest.mark.parametrize("kw,err,msg", [
    (dict(temperature=0.0), ValueError, "temperature must be a finite number in"),
    (dict(temperature=-1.0), ValueError, "temperature must be a finite number in"),
    (dict(temperature=math.inf), ValueError, "temperature must be a finite number in"),
    (dict(temperature=math.nan), ValueError, "temperature must be a finite number in"),
    (dict(temperature="1"), TypeError, "temperature must be a real number"),
    (dict(top_k=0), ValueError, "top_k must be >= 1"),
    (dict(top_k=2.0), TypeError, "top_k must be an int"),
    (dict(top_k=True), TypeError, "top_k must be an int"),
    (dict(top_p=0.0), ValueError, "top_p must be a finite number in"),
    (dict(top_p=1.5), ValueError, "top_p must be a finite number in"),
    (dict(top_p=math.nan), ValueError, "top_p must be a finite number in"),
])
def test_sampling_logprobs_names_bad_filters(kw, err, msg):
    raises(err, msg, sampling_logprobs, torch.zeros(2, 4), **kw)


def test_sampling_logprobs_edges():
    raises(TypeError, "logits must have a floating dtype", sampling_logprobs, torch.zeros(2, 4, dtype=torch.long))
    raises(ValueError, "logits must have at least one category", sampling_logprobs, torch.zeros(2, 0))
    assert sampling_logprobs(torch.zeros(0, 4), top_k=2, top_p=0.5).shape == (0, 4)
    assert sampling_logprobs(torch.zeros(3, 4, dtype=torch.bfloat16)).dtype == torch.float32


# ------------------------------------------------------------------------------- token_logprobs

def test_token_logprobs_equals_log_softmax_gather_of_a_full_forward_pass(gpt, tok):
    ids, pmask = tok.encode_batch(["37+45=", "1+2=", "99*9="])
    g = torch.Generator().manual_seed(0)
    resp = torch.randint(2, tok.vocab_size, (3, 4), generator=g)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float32)
    lp, ent = token_logprobs(gpt, ids, pmask, resp, mask, with_entropy=True)
    for b in range(3):                               # one row at a time, without its padding
        row = torch.cat([ids[b][pmask[b]], resp[b]])[None]
        logits = gpt(row)[0]
        start = int(pmask[b].sum()) - 1
        for t in range(4):
            ref = torch.log_softmax(logits[start + t], -1)
            want_lp = ref[resp[b, t]] if mask[b, t] else torch.tensor(0.0)
            want_ent = -(ref.exp() * ref).sum() if mask[b, t] else torch.tensor(0.0)
            assert torch.isclose(lp[b, t], want_lp, atol=1e-4), (b, t)
            assert torch.isclose(ent[b, t], want_ent, atol=1e-4), (b, t)


def test_token_logprobs_edges(gpt, tok):
    ids, pmask = tok.encode_batch(["1+2=", "37+45="])
    assert token_logprobs(gpt, ids, pmask, torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0)).shape == (2, 0)
    e = torch.zeros(0, 3, dtype=torch.long)
    lp, ent = token_logprobs(gpt, torch.zeros(0, 2, dtype=torch.long), None, e, torch.zeros(0, 3),
                             with_entropy=True)
    assert lp.shape == ent.shape == (0, 3)
    # an all-false mask: zeros, and a zero gradient
    m = TableLM(8, tok.vocab_size)
    lp = token_logprobs(m, ids, pmask, torch.full((2, 2), 5), torch.zeros(2, 2, dtype=torch.bool))
    lp.sum().backward()
    assert torch.equal(lp, torch.zeros(2, 2)) and torch.equal(m.table.grad, torch.zeros(8, tok.vocab_size))


def test_token_logprobs_padding_never_yields_nan(tok):
    """NaN (or inf) logits at masked positions leave values AND gradients finite; so does the
    entropy of a top-k distribution, whose 0 log 0 terms are excluded from the gradient."""
    P, T, V = 3, 4, 6
    ids = torch.ones(2, P, dtype=torch.long)
    resp = torch.ones(2, T, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.float32)
    for bad in (float("nan"), float("inf"), -float("inf")):
        m = TableLM(P + T, V, bad_from=P - 1 + 3, bad=bad)           # response position 3 is padding
        lp, ent = token_logprobs(m, ids, None, resp, mask, with_entropy=True)
        (lp.sum() + ent.sum()).backward()
        assert torch.isfinite(lp).all() and torch.isfinite(ent).all() and torch.isfinite(m.table.grad).all()
        assert (lp[mask == 0] == 0).all() and (ent[mask == 0] == 0).all()
    m = TableLM(P + T, V)
    _, ent = token_logprobs(m, ids, None, resp, mask, with_entropy=True, top_k=2)
    ent.sum().backward()
    assert torch.isfinite(m.table.grad).all()
    # the value still equals the entropy of the renormalised top-2 distribution
    z = m.table.detach()[P - 1]
    q = torch.softmax(z, -1).topk(2).values
    q = q / q.sum()
    assert torch.isclose(ent[0, 0], -(q * q.log()).sum(), atol=1e-5)


def test_token_logprobs_and_sample_name_bad_arguments(gpt, tok):
    ids, pmask = tok.encode_batch(["1+2=", "37+45="])
    resp, mask = torch.full((2, 3), 5), torch.ones(2, 3)
    raises(TypeError, "prompt_ids must be a torch.Tensor of dtype int64", token_logprobs, gpt, ids.float(), pmask,
           resp, mask)
    raises(ValueError, "the prompt length prompt_ids.shape", token_logprobs, gpt, ids[:, :0], pmask[:, :0],
           resp, mask)
    raises(TypeError, "prompt_mask must be a bool", token_logprobs, gpt, ids, pmask.float(), resp, mask)
    raises(ValueError, "prompt_mask must be LEFT-padded", token_logprobs, gpt, ids, pmask.flip(1), resp, mask)
    raises(ValueError, "response_ids has 1 items but prompt_ids has 2", token_logprobs, gpt, ids, pmask,
           resp[:1], mask[:1])
    raises(ValueError, r"response_ids must lie in \[0, 56\)", token_logprobs, gpt, ids, pmask, resp + 60, mask)
    raises(ValueError, "mask has shape", token_logprobs, gpt, ids, pmask, resp, mask[:, :2])
    raises(ValueError, "mask must hold only 0 and 1", token_logprobs, gpt, ids, pmask, resp, mask * 0.5)
    raises(TypeError, "with_entropy must be a bool", token_logprobs, gpt, ids, pmask, resp, mask, with_entropy=1)
    raises(ValueError, "top_k must be >= 1", token_logprobs, gpt, ids, pmask, resp, mask, top_k=0)
    # sample
    raises(TypeError, "prompt_ids must be a torch.Tensor of dtype int64", sample, gpt, ids.float(),
           max_new_tokens=2)
    raises(ValueError, "the prompt length prompt_ids.shape", sample, gpt, ids[:, :0], max_new_tokens=2)
    raises(ValueError, "LEFT-padded", sample, gpt, torch.tensor([[5, 6, 0]]), torch.tensor([[True, True, False]]),
           max_new_tokens=2)
    raises(ValueError, "LEFT-padded", sample, gpt, torch.tensor([[5, 6, 7]]), torch.tensor([[True, False, True]]),
           max_new_tokens=2)
    raises(ValueError, "max_new_tokens must be >= 1", sample, gpt, ids, pmask, max_new_tokens=0)
    raises(TypeError, "max_new_tokens must be an int", sample, gpt, ids, pmask, max_new_tokens=2.0)
    raises(ValueError, "eos_id must be >= 0", sample, gpt, ids, pmask, max_new_tokens=2, eos_id=-1)
    raises(TypeError, "greedy must be a bool", sample, gpt, ids, pmask, max_new_tokens=2, greedy=None)
    raises(TypeError, "generator must be a Generator", sample, gpt, ids, pmask, max_new_tokens=2, generator=0)
    raises(ValueError, "temperature must be a finite number", sample, gpt, ids, pmask, max_new_tokens=2,
           temperature=0.0)
    raises(ValueError, "more than the model's block_size", sample, gpt, ids, pmask, max_new_tokens=40)


def test_sample_of_an_empty_batch_is_an_empty_rollout(gpt):
    for use_cache in (True, False):
        ro = sample(gpt, torch.zeros(0, 3, dtype=torch.long), max_new_tokens=4, use_cache=use_cache)
        assert len(ro) == 0 and ro.response_ids.shape == ro.mask.shape == ro.logprobs.shape == (0, 0)
        assert ro.model_logprobs.shape == (0, 0) and ro.finished.shape == (0,) and ro.lengths.shape == (0,)


def test_call_model_contracts(tok):
    m = TableLM(5, 4)
    raises(TypeError, "ids must be a torch.Tensor of dtype int64", call_model, m, torch.zeros(1, 2))
    raises(ValueError, "attention_mask has shape", call_model, m, torch.zeros(1, 2, dtype=torch.long),
           torch.ones(1, 3, dtype=torch.bool))

    class Wrong(nn.Module):
        def forward(self, ids):
            return ids.float()

    raises(TypeError, r"model must map ids \(1, 2\) to logits", call_model, Wrong(),
           torch.zeros(1, 2, dtype=torch.long))
    assert call_model(m, torch.zeros(0, 2, dtype=torch.long)).shape == (0, 2, 4)


# ------------------------------------------------------------------------------- evaluate, tasks

def slow_greedy(model, tok, prompt, max_new_tokens):
    """Greedy decoding of one prompt, rerunning the whole sequence at every step (no cache)."""
    ids = tok.encode(prompt)
    out = []
    for _ in range(max_new_tokens):
        nxt = int(model(torch.tensor([ids + out]))[0, -1].argmax())
        if nxt == tok.eos_id:
            break
        out.append(nxt)
    return tok.decode(out)


def test_evaluate_equals_a_slow_greedy_decoder(gpt, tok):
    probs = ADDITION.problems(12, seed=3, split="test") + [Problem("5+5=", "10")]
    r = evaluate(gpt, tok, ADDITION, probs, batch_size=5)
    want = [slow_greedy(gpt, tok, p.prompt, ADDITION.max_new_tokens) for p in probs]
    assert r["responses"] == want
    assert r["accuracy"] == pytest.approx(sum(w == p.answer for w, p in zip(want, probs)) / len(probs))


def test_evaluate_names_bad_arguments(gpt, tok):
    probs = ADDITION.problems(2, seed=0)
    raises(ValueError, r"len\(problems\) must be >= 1", evaluate, gpt, tok, ADDITION, [])
    raises(TypeError, "problems must be a list of Problem", evaluate, gpt, tok, ADDITION, "1+2=")
    raises(TypeError, r"problems\[1\] must be a Problem", evaluate, gpt, tok, ADDITION, [probs[0], "x"])
    raises(TypeError, "task must be a Task", evaluate, gpt, tok, "addition", probs)
    raises(TypeError, "tok must be a CharTokenizer", evaluate, gpt, None, ADDITION, probs)
    raises(ValueError, "batch_size must be >= 1", evaluate, gpt, tok, ADDITION, probs, batch_size=0)
    raises(ValueError, "checker must be one of", evaluate, gpt, tok, ADDITION, probs, checker="nope")
    gpt.train()
    raises(ValueError, "top_p must be", evaluate, gpt, tok, ADDITION, probs, greedy=False, top_p=2.0)
    assert gpt.training                                 # a refused call leaves the mode as it was
    gpt.eval()


def test_task_contracts():
    gen = ADDITION._generate
    raises(TypeError, "name must be a non-empty str", Task, "", gen)
    raises(TypeError, "generate must be callable", Task, "t", 3)
    raises(TypeError, "check must be callable", Task, "t", gen, check="exact")
    raises(ValueError, "max_new_tokens must be >= 1", Task, "t", gen, max_new_tokens=0)
    raises(ValueError, r"heldout_fraction must be a finite number in \[0.0, 1.0\)", Task, "t", gen,
           heldout_fraction=1.0)
    raises(ValueError, "heldout_fraction must be a finite number", Task, "t", gen, heldout_fraction=math.nan)
    raises(TypeError, r"checkers\['x'\] must be callable", Task, "t", gen, checkers={"x": 1})
    raises(TypeError, "Problem or \\(prompt, answer\\)", Task("t", lambda rng: 3).generate, random.Random(0))
    raises(TypeError, "rng must be a Random", ADDITION.generate, 0)
    raises(ValueError, "split must be one of", ADDITION.problems, 3, split="dev")
    raises(ValueError, "n must be >= 0", ADDITION.problems, -1)
    raises(TypeError, "seed must be a int or random.Random", ADDITION.problems, 2, seed="a")
    assert ADDITION.problems(0) == []
    p = ADDITION.problems(2, seed=0)
    raises(ValueError, "responses has 1 items but problems has 2", ADDITION.score, ["1"], p)
    raises(TypeError, "responses must be a list of str", ADDITION.score, "12", p[:1])
    raises(TypeError, r"problems\[0\] must be a Problem", ADDITION.score, ["1"], ["1+1="])
    raises(ValueError, "checker must be one of", ADDITION.score, ["1", "2"], p, checker="sloppy")
    empty = ADDITION.score([], [])
    assert empty.shape == (0,) and empty.dtype == torch.float32
    raises(ValueError, "name must be one of", get_task, "division")
    raises(ValueError, "tolerance must be a finite number", numeric_close, -1.0)
    assert numeric_close(0.5)("10.4", Problem("", "10")) == 1.0 and numeric_close(0.5)("x", Problem("", "1")) == 0.0


# ------------------------------------------------------------------------------- small modules

def test_pretrain_configs_and_plots_and_show_name_bad_arguments():
    raises(ValueError, r"CorpusConfig\.carry_forget must be a finite number", CorpusConfig, carry_forget=1.5)
    raises(ValueError, r"CorpusConfig\.n_lines must be >= 1", CorpusConfig, n_lines=0)
    raises(ValueError, r"TrainConfig\.lr must be a finite number", TrainConfig, lr=0.0)
    raises(ValueError, r"TrainConfig\.lr must be a finite number", TrainConfig, lr=math.nan)
    raises(TypeError, r"TrainConfig\.steps must be an int", TrainConfig, steps=10.0)
    raises(ValueError, "window must be >= 1", smooth, [1.0, 2.0], window=0)
    # smooth: a trailing mean, checked against numpy-free arithmetic
    assert smooth([1.0, 2.0, 3.0, 10.0], window=2).tolist() == [1.0, 1.5, 2.5, 6.5]
    assert smooth([], window=3).shape == (0,)
    raises(ValueError, "band must be one of", mean_band, None, [0, 1], [[1.0, 2.0]], band="iqr")
    raises(ValueError, "the number of seeds", mean_band, None, [0, 1], np.zeros((0, 2)))
    raises(TypeError, "obj must be a function, method or class", rlkit.show, 3)
