"""The Hugging Face bridge (rlkit.llm.hf): tiny randomly initialised GPT-2 and LLaMA-style models built
from a config, no hub download.

Independent computations: the adapter's log-probs against a direct ``transformers`` forward pass and a
hand-written log-softmax; cached against uncached sampling; a padded batch against each row run alone;
the tiny GPT against the HF GPT-2 holding its weights; sampling-time against loss-time log-probs for
prompts of different lengths in one batch.
"""
from __future__ import annotations

import copy
import math
import os

import pytest
import torch
import torch.nn.functional as F

os.environ["HF_HUB_OFFLINE"] = "1"           # no hub access, ever
os.environ["TRANSFORMERS_OFFLINE"] = "1"

if os.environ.get("CI"):
    import transformers  # noqa: F401  (CI installs the hf extra: a missing transformers is a failure there)
else:
    transformers = pytest.importorskip("transformers", reason='rlkit.llm.hf needs transformers: pip install -e ".[hf]"')

from rlkit.llm import (
    ADDITION,
    CharTokenizer,
    KLPenalty,
    RLConfig,
    Task,
    encode_prompts,
    load_pretrained,
    sample,
    token_logprobs,
    train,
)
from rlkit.llm.hf import (
    UNMAPPABLE,
    HFCache,
    HFCausalLM,
    HFTokenizer,
    char_tokenizer_to_hf,
    gpt_to_hf,
    position_ids,
)

TOK = CharTokenizer()


def tiny_gpt2(seed=0):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=TOK.vocab_size, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     bos_token_id=TOK.eos_id, eos_token_id=TOK.eos_id, pad_token_id=TOK.pad_id)
    return GPT2LMHeadModel(cfg).eval()


def tiny_llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                      bos_token_id=None, eos_token_id=TOK.eos_id, pad_token_id=TOK.pad_id)
    return LlamaForCausalLM(cfg).eval()


BUILDERS = {"gpt2": tiny_gpt2, "llama": tiny_llama}


def padded_prompts(n=6, seed=3):
    probs = ADDITION.problems(n, seed=seed, split="test")
    probs[0] = type(probs[0])("7+8=", "15")             # shorter: the batch is left-padded
    probs[1] = type(probs[1])("3+4=", "7")
    return probs, *encode_prompts(probs, TOK)


def test_position_ids_count_real_tokens_only():
    mask = torch.tensor([[False, False, True, True], [True, True, True, True]])
    assert position_ids(mask).tolist() == [[0, 0, 0, 1], [0, 1, 2, 3]]
    assert position_ids(mask, torch.tensor([5, 0])).tolist() == [[4, 4, 5, 6], [0, 1, 2, 3]]
    with pytest.raises(TypeError, match="mask"):
        position_ids(mask.long())
    with pytest.raises(ValueError, match="start"):
        position_ids(mask, torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_logprobs_equal_a_direct_forward_pass(arch):
    hf = BUILDERS[arch]()
    lm = HFCausalLM(hf)
    _, ids, mask = padded_prompts()
    resp = torch.randint(2, TOK.vocab_size, (ids.shape[0], 4), generator=torch.Generator().manual_seed(1))
    rmask = torch.ones_like(resp, dtype=torch.float)
    rmask[0, 2:] = 0
    lp = token_logprobs(lm, ids, mask, resp, rmask)
    # direct: transformers with explicit position ids from the mask, log-softmax by hand
    full = torch.cat([ids, resp], 1)
    att = torch.cat([mask, torch.ones_like(resp, dtype=torch.bool)], 1)
    pos = (att.long().cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = hf(input_ids=full, attention_mask=att.long(), position_ids=pos).logits
    P = ids.shape[1]
    ref = F.log_softmax(logits[:, P - 1:-1].double(), -1).gather(-1, resp[..., None]).squeeze(-1) * rmask
    assert torch.allclose(lp.double(), ref, atol=1e-5)
    # and each row alone (no padding at all) gives the same log-probs as the padded batch
    for b in range(ids.shape[0]):
        row = full[b][att[b]][None]
        with torch.no_grad():
            one = F.log_softmax(hf(input_ids=row).logits[0, -resp.shape[1] - 1:-1].double(), -1)
        alone = one.gather(-1, resp[b][:, None]).squeeze(-1) * rmask[b]
        assert torch.allclose(lp[b].double(), alone, atol=1e-5), b


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_cached_and_uncached_sampling_agree(arch):
    lm = HFCausalLM(BUILDERS[arch]())
    _, ids, mask = padded_prompts()
    kw = dict(max_new_tokens=8, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
    a = sample(lm, ids, mask, generator=torch.Generator().manual_seed(0), **kw)
    b = sample(lm, ids, mask, generator=torch.Generator().manual_seed(0), use_cache=False, **kw)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.mask, b.mask)
    assert torch.allclose(a.model_logprobs, b.model_logprobs, atol=1e-5)
    g1 = sample(lm, ids, mask, greedy=True, **kw)
    g2 = sample(lm, ids, mask, greedy=True, use_cache=False, **kw)
    assert torch.equal(g1.response_ids, g2.response_ids)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_sampling_and_loss_logprobs_agree_for_prompts_of_different_lengths(arch):
    """Issue 14: the loss must score a left-padded prompt at the positions it was sampled at."""
    hf = BUILDERS[arch]()
    lm = HFCausalLM(hf)
    _, ids, mask = padded_prompts()
    assert not bool(mask.all())                          # the batch really has different lengths
    ro = sample(lm, ids, mask, max_new_tokens=6, eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                generator=torch.Generator().manual_seed(2))
    lp = token_logprobs(lm, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
    assert float((lp.detach() - ro.model_logprobs).abs().max()) < 1e-5
    if arch == "gpt2":
        # the independent check that the test can fail: a loss pass WITHOUT position ids (TRL's)
        # scores the padded rows at shifted absolute positions and disagrees
        full = torch.cat([ro.prompt_ids, ro.response_ids], 1)
        att = torch.cat([ro.prompt_mask, torch.ones_like(ro.response_ids, dtype=torch.bool)], 1)
        with torch.no_grad():
            logits = hf(input_ids=full, attention_mask=att.long()).logits
        P = ids.shape[1]
        shifted = F.log_softmax(logits[:, P - 1:-1], -1).gather(-1, ro.response_ids[..., None]).squeeze(-1) * ro.mask
        padded_rows = ~mask.all(1)
        assert float((shifted - ro.model_logprobs)[padded_rows].abs().max()) > 1e-3


def test_tiny_gpt_weights_map_onto_gpt2_with_the_same_logits():
    gpt, tok = load_pretrained()
    hf = gpt_to_hf(gpt)
    lm = HFCausalLM(hf)
    _, ids, mask = padded_prompts()
    with torch.no_grad():
        a, b = gpt(ids, attention_mask=mask), lm(ids, attention_mask=mask)
    assert float((a - b)[mask].abs().max()) < 1e-4
    kw = dict(max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id)
    ga, gb = sample(gpt, ids, mask, greedy=True, **kw), sample(lm, ids, mask, greedy=True, **kw)
    assert torch.equal(ga.response_ids, gb.response_ids)
    with pytest.raises(ValueError, match="RMSNorm"):
        gpt_to_hf(gpt, arch="llama")
    assert "rotary" in UNMAPPABLE["llama"]
    with pytest.raises(TypeError, match="model"):
        gpt_to_hf(hf)


def test_hf_tokenizer_matches_the_char_tokenizer_ids():
    htok = HFTokenizer(char_tokenizer_to_hf(TOK))
    assert (htok.pad_id, htok.eos_id, htok.vocab_size) == (TOK.pad_id, TOK.eos_id, TOK.vocab_size)
    texts = ["37+45=", "1+2=", "a b?", "1+2=", "37+45=", "1+2="]     # repeats: each distinct text is encoded once
    for x, y in zip(htok.encode_batch(texts), TOK.encode_batch(texts)):
        assert torch.equal(x, y)
    ids = torch.tensor([[5, 6, TOK.eos_id, 7], [8, TOK.pad_id, 9, TOK.eos_id]])
    assert htok.decode_batch(ids) == TOK.decode_batch(ids)
    assert htok.encode("12", eos=True) == TOK.encode("12", eos=True)
    stop = HFTokenizer(char_tokenizer_to_hf(TOK), stop_strings=[" "], prompt_template="q:{}")
    assert stop.decode(TOK.encode("12 34")) == "12"
    assert stop.encode_batch(["1"])[0].tolist() == [TOK.encode("q:1")]
    with pytest.raises(ValueError, match="prompt_template"):
        HFTokenizer(char_tokenizer_to_hf(TOK), prompt_template="no slot")
    with pytest.raises(TypeError, match="tokenizer"):
        HFTokenizer(object())


def test_stop_ids_merge_into_eos():
    lm = HFCausalLM(tiny_gpt2(), eos_id=TOK.eos_id, stop_ids=[5, 6])
    plain = HFCausalLM(copy.deepcopy(lm.hf))
    ids = torch.tensor([[7, 8, 9]])
    with torch.no_grad():
        z, z0 = lm(ids), plain(ids)
    p, p0 = z.softmax(-1), z0.softmax(-1)
    assert torch.allclose(p[..., TOK.eos_id], p0[..., [TOK.eos_id, 5, 6]].sum(-1), atol=1e-6)
    assert bool((p[..., [5, 6]] == 0).all())
    other = [i for i in range(TOK.vocab_size) if i not in (TOK.eos_id, 5, 6)]
    assert torch.allclose(p[..., other], p0[..., other], atol=1e-6)
    with pytest.raises(ValueError, match="eos_id"):
        HFCausalLM(tiny_gpt2(), stop_ids=[5])


def test_adapter_validates_and_handles_empty_batches():
    lm = HFCausalLM(tiny_gpt2())
    assert lm(torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3, TOK.vocab_size)
    with pytest.raises(ValueError):
        lm(torch.full((1, 2), TOK.vocab_size))
    with pytest.raises(ValueError, match="block_size"):
        lm(torch.zeros(1, 40, dtype=torch.long))
    cache = lm.new_cache(2, 4)
    assert isinstance(cache, HFCache) and cache.length == 0
    with pytest.raises(ValueError, match="max_len"):
        lm(torch.ones(2, 5, dtype=torch.long), cache=cache)
    with pytest.raises(TypeError, match="dtype"):
        HFCausalLM(tiny_gpt2(), dtype="float16")
    assert lm(torch.ones(1, 2, dtype=torch.long)).dtype == torch.float32
    bf = HFCausalLM(tiny_gpt2(), dtype=torch.bfloat16)
    assert next(bf.hf.parameters()).dtype == torch.bfloat16
    assert bf(torch.ones(1, 2, dtype=torch.long)).dtype == torch.float32      # logits come back as float32


SMALL = dict(steps=2, prompts_per_step=4, group_size=4, eval_every=2, eval_problems=16, seed=0)
# a random model never answers an addition right, so every group's rewards would be equal (no gradient);
# this reward varies within groups: 1 for an odd number of response characters
ODD = Task("odd-length", ADDITION._generate, lambda response, problem: float(len(response) % 2),
           max_new_tokens=5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("algo", ["grpo", "dr_grpo", "dapo", "ppo"])
def test_trainers_run_on_an_hf_model(arch, algo):
    lm = HFCausalLM(BUILDERS[arch]())
    before = [p.detach().clone() for p in lm.parameters()]
    res = train(lm, TOK, ODD, RLConfig(algo=algo, **SMALL), hooks=[KLPenalty(0.01)] if algo == "grpo" else [])
    assert len(res.history["loss"]) == 2 and all(math.isfinite(x) for x in res.history["loss"])
    assert res.evals["step"] == [0, 2]
    assert any(not torch.equal(a, b) for a, b in zip(before, lm.parameters()))
    if algo == "ppo":
        assert res.critic is not None


def test_grpo_on_mapped_weights_matches_the_tiny_gpt_step_for_step():
    gpt, tok = load_pretrained()
    lm = HFCausalLM(gpt_to_hf(gpt))
    cfg = RLConfig(algo="grpo", **SMALL)
    a = train(copy.deepcopy(gpt), tok, ADDITION, cfg)
    b = train(lm, HFTokenizer(char_tokenizer_to_hf(tok)), ADDITION, cfg)
    assert a.history["reward"] == b.history["reward"]
    assert all(abs(x - y) < 1e-4 for x, y in zip(a.history["loss"], b.history["loss"]))
