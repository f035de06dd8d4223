"""Tests of rlkit.llm: model and KV cache, sampler and log-probs, tasks, checkpoints, RL trainers.

Every expected value is computed independently of the code under test: hand-worked numbers,
slow reference loops written here, or a fresh forward pass.
"""
from __future__ import annotations

import json
import math
import random

import pytest
import torch
import torch.nn as nn

from rlkit.llm import (
    ADDITION,
    ALGOS,
    GPT,
    MULTIPLICATION,
    CharTokenizer,
    CheckpointError,
    GPTConfig,
    KLPenalty,
    Problem,
    RLConfig,
    Task,
    TinyGRULM,
    ValueHead,
    contains_answer,
    evaluate,
    exact_match,
    forgot_carry_answer,
    has_carry,
    load_checkpoint,
    load_pretrained,
    prefix_match,
    sample,
    sampling_logprobs,
    save_checkpoint,
    sequence_advantages,
    steps_to_reach,
    token_logprobs,
    train,
)
from rlkit.llm.checkpoint import CHECKPOINT_DIR, DEFAULT_NAME
from rlkit.llm.pretrain import CorpusConfig, TrainConfig, encode_corpus, make_corpus, pretrain


@pytest.fixture(autouse=True)
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


@pytest.fixture(scope="module")
def rand_gpt(tok):
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=tok.vocab_size, n_embd=32, n_head=4, n_layer=2)).eval()
    with torch.no_grad():                     # larger weights than the init, so outputs differ per token
        for p in m.parameters():
            p.mul_(5.0)
    return m


class FixedLogits(nn.Module):
    """A protocol model that ignores its input: every position gets the same logits."""

    def __init__(self, logits):
        super().__init__()
        self.logits = nn.Parameter(torch.as_tensor(logits, dtype=torch.float32))

    def forward(self, ids):
        return self.logits.expand(ids.shape[0], ids.shape[1], -1)


# ------------------------------------------------------------------------------- tokenizer

def test_tokenizer_round_trip_and_errors(tok):
    ids = tok.encode("37+45=82", eos=True)
    assert ids[-1] == tok.eos_id and len(ids) == 9
    assert tok.decode(ids) == "37+45=82"
    assert tok.decode(ids + [tok.pad_id, 5], stop_at_eos=False) == "37+45=82\n" + tok.itos[5]
    with pytest.raises(ValueError, match="'#'"):
        tok.encode("1#2")
    with pytest.raises(ValueError, match="repeat"):
        CharTokenizer("aa")
    ids, mask = tok.encode_batch(["1+2=", "37+45="])
    assert ids.shape == (2, 6)
    assert mask.tolist() == [[False, False, True, True, True, True], [True] * 6]
    assert ids[0, :2].tolist() == [tok.pad_id, tok.pad_id]          # LEFT padding


# ------------------------------------------------------------------------------- model

def test_gpt_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="n_layer"):
        GPTConfig(n_layer=0)


def test_kv_cache_matches_full_forward_token_by_token(tok, rand_gpt):
    """Feeding a sequence one token at a time through the cache gives the full forward's logits."""
    ids, mask = tok.encode_batch(["37+45=82", "9*9=81", "1+2=3"])
    full = rand_gpt(ids, attention_mask=mask)
    cache = rand_gpt.new_cache(ids.shape[0], ids.shape[1])
    steps = [rand_gpt(ids[:, t:t + 1], attention_mask=mask[:, t:t + 1], cache=cache) for t in range(ids.shape[1])]
    inc = torch.cat(steps, 1)
    assert torch.allclose(inc[mask], full[mask], atol=1e-5)
    # in chunks of uneven size too
    cache = rand_gpt.new_cache(ids.shape[0], ids.shape[1])
    a = rand_gpt(ids[:, :3], attention_mask=mask[:, :3], cache=cache)
    b = rand_gpt(ids[:, 3:], attention_mask=mask[:, 3:], cache=cache)
    assert torch.allclose(torch.cat([a, b], 1)[mask], full[mask], atol=1e-5)


def test_left_padding_does_not_change_a_rows_logits(tok, rand_gpt):
    """A prompt's logits are the same alone and left-padded in a batch with a longer prompt."""
    alone = rand_gpt(torch.tensor([tok.encode("1+2=")]))
    ids, mask = tok.encode_batch(["1+2=", "37+45="])
    padded = rand_gpt(ids, attention_mask=mask)
    assert torch.allclose(padded[0, 2:], alone[0], atol=1e-5)
    assert torch.isfinite(padded).all()


def test_gpt_rejects_too_long_input(tok, rand_gpt):
    with pytest.raises(ValueError, match="block_size"):
        rand_gpt(torch.zeros(1, rand_gpt.config.block_size + 1, dtype=torch.long))


# ------------------------------------------------------------------------------- sampling

def test_sampling_logprobs_hand_worked():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = p.log()
    q = sampling_logprobs(logits, top_k=2).exp()
    assert torch.allclose(q, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-6)
    # top-p 0.7: keep 0.5 (0 before it) and 0.3 (0.5 before it); 0.15 has 0.8 >= 0.7 before it
    q = sampling_logprobs(logits, top_p=0.7).exp()
    assert torch.allclose(q, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=1e-6)
    q = sampling_logprobs(logits, top_p=0.85).exp()
    assert torch.allclose(q, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95, atol=1e-6)
    q = sampling_logprobs(logits, top_p=0.3).exp()                  # the top token is always kept
    assert torch.allclose(q, torch.tensor([1.0, 0.0, 0.0, 0.0]), atol=1e-6)
    # temperature 2: q ~ p^(1/2)
    s = p.sqrt()
    assert torch.allclose(sampling_logprobs(logits, temperature=2.0).exp(), s / s.sum(), atol=1e-6)
    # temperature, then top-k, then top-p: sqrt(p) normalised = [.379,.294,.208,.119] -> top_k 3 -> top_p .6
    t2 = s[:3] / s[:3].sum()
    keep = torch.tensor([True, True, False])     # before: 0, 0.43 < 0.6, 0.76 >= 0.6
    exp = torch.zeros(4)
    exp[:3] = torch.where(keep, t2, 0.0) / t2[keep].sum()
    assert torch.allclose(sampling_logprobs(logits, temperature=2.0, top_k=3, top_p=0.6).exp(), exp, atol=1e-6)
    for bad in (dict(temperature=0.0), dict(top_k=0), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            sampling_logprobs(logits, **bad)


def test_sampler_draws_from_the_renormalised_distribution(tok):
    """Empirical frequencies of the first token match q (top-k, top-p) within 4 standard errors."""
    p = torch.full((tok.vocab_size,), 1e-3)
    p[2:6] = torch.tensor([0.4, 0.3, 0.2, 0.1])
    model = FixedLogits(p.log())
    n = 20000
    ids = torch.full((n, 1), 5, dtype=torch.long)
    for kw in (dict(top_k=3), dict(top_p=0.8), dict(temperature=0.7)):
        ro = sample(model, ids, max_new_tokens=1, generator=torch.Generator().manual_seed(1), **kw)
        q = sampling_logprobs(p.log(), **kw).exp()
        freq = torch.bincount(ro.response_ids[:, 0], minlength=tok.vocab_size).float() / n
        se = (q * (1 - q) / n).sqrt()
        assert ((freq - q).abs() <= 4 * se + 1e-4).all(), kw
        assert torch.allclose(ro.logprobs[:, 0], q.log()[ro.response_ids[:, 0]], atol=1e-5)
        model_lp = torch.log_softmax(p.log(), -1)[ro.response_ids[:, 0]]
        assert torch.allclose(ro.model_logprobs[:, 0], model_lp, atol=1e-5)


@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.8, top_k=5), dict(top_p=0.9), dict(temperature=1.3)])
def test_sampler_logprobs_equal_a_fresh_forward_pass(tok, rand_gpt, kw):
    ids, mask = tok.encode_batch(["37+45=", "1+2=", "99*99=", "5="])
    ro = sample(rand_gpt, ids, mask, max_new_tokens=8, generator=torch.Generator().manual_seed(0), **kw)
    # fresh forward, written out here: logits at the previous position, filtered and renormalised
    full = torch.cat([ids, ro.response_ids], 1)
    att = torch.cat([mask, torch.ones_like(ro.response_ids, dtype=torch.bool)], 1)
    logits = rand_gpt(full, attention_mask=att)
    P = ids.shape[1]
    for b in range(ids.shape[0]):
        for t in range(ro.response_ids.shape[1]):
            if ro.mask[b, t] == 0:
                assert ro.logprobs[b, t] == 0 and ro.model_logprobs[b, t] == 0
                continue
            z = logits[b, P - 1 + t]
            y = ro.response_ids[b, t]
            assert torch.isclose(ro.logprobs[b, t], sampling_logprobs(z, **kw)[y], atol=1e-5)
            assert torch.isclose(ro.model_logprobs[b, t], torch.log_softmax(z, -1)[y], atol=1e-5)
    # the batched helper agrees too, and differentiates
    lp = token_logprobs(rand_gpt, ids, mask, ro.response_ids, ro.mask, **kw)
    assert torch.allclose(lp, ro.logprobs, atol=1e-5)


def test_sampler_cached_and_uncached_agree(tok, rand_gpt):
    ids, mask = tok.encode_batch(["37+45=", "1+2="])
    a = sample(rand_gpt, ids, mask, max_new_tokens=10, generator=torch.Generator().manual_seed(3))
    b = sample(rand_gpt, ids, mask, max_new_tokens=10, generator=torch.Generator().manual_seed(3), use_cache=False)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_sampler_mask_eos_and_greedy(tok):
    model, _ = load_pretrained()
    ids, mask = tok.encode_batch(["12+13=", "37+45="])
    ro = sample(model, ids, mask, max_new_tokens=5, greedy=True)
    assert tok.decode_batch(ro.response_ids) == ["25", "72"]        # the learned bug: carry forgotten
    for b in range(2):                                               # mask: up to and including <eos>
        row = ro.response_ids[b].tolist()
        end = row.index(tok.eos_id)
        assert ro.mask[b].tolist() == [1.0] * (end + 1) + [0.0] * (len(row) - end - 1)
        assert all(x == tok.pad_id for x in row[end + 1:])
    assert (ro.logprobs == 0).all() and ro.finished.all()            # greedy: a point mass
    assert (ro.model_logprobs[ro.mask.bool()] < 0).all()
    ro = sample(model, ids, mask, max_new_tokens=7, eos_id=None, generator=torch.Generator().manual_seed(0))
    assert ro.mask.shape == (2, 7) and ro.mask.all()
    with pytest.raises(ValueError, match="LEFT"):
        sample(model, torch.tensor([[5, 6, 0]]), torch.tensor([[True, True, False]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="block_size"):
        sample(model, ids, mask, max_new_tokens=40)


# ------------------------------------------------------------------------------- tasks

def test_checkers_on_hand_written_cases():
    p = Problem("37+45=", "82")
    assert exact_match("82", p) == 1.0 and exact_match("72", p) == 0.0 and exact_match("820", p) == 0.0
    assert exact_match("", p) == 0.0
    # the sloppy zip-based checker: agrees on every shared position
    assert prefix_match("82", p) == 1.0 and prefix_match("8", p) == 1.0 and prefix_match("", p) == 1.0
    assert prefix_match("72", p) == 0.0 and prefix_match("8222", p) == 1.0
    assert contains_answer("72 82", p) == 1.0 and contains_answer("8 2", p) == 0.0
    assert has_carry(37, 45) and not has_carry(12, 13) and has_carry(15, 15)
    assert forgot_carry_answer(37, 45) == "72" and forgot_carry_answer(58, 67) == "115"
    assert forgot_carry_answer(99, 99) == "188" and forgot_carry_answer(12, 13) == "25"
    probs = [Problem("1+1=", "2"), Problem("1+1=", "2")]
    assert ADDITION.score(["2", "3"], probs).tolist() == [1.0, 0.0]
    assert MULTIPLICATION.score(["", "14"], [Problem("2*7=", "14")] * 2, "prefix").tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="checker"):
        ADDITION.score(["2"], probs[:1], "nope")


def test_task_split_is_stable_and_disjoint():
    tr = ADDITION.problems(400, seed=0, split="train")
    te = ADDITION.problems(100, seed=0, split="test")
    assert not {p.prompt for p in tr} & {p.prompt for p in te}
    assert all(ADDITION.is_heldout(p.prompt) for p in te)
    assert [p.prompt for p in ADDITION.problems(5, seed=3)] == [p.prompt for p in ADDITION.problems(5, seed=3)]
    # about 10% of all 8100 prompts are held out
    n_test = sum(ADDITION.is_heldout(f"{a}+{b}=") for a in range(10, 100) for b in range(10, 100))
    assert 650 < n_test < 970
    for p in tr[:50]:
        a, b = p.info["a"], p.info["b"]
        assert p.prompt == f"{a}+{b}=" and p.answer == str(a + b)


def test_defining_a_new_task_in_a_few_lines():
    double = Task("doubling", lambda rng: (f"{(x := rng.randint(10, 49))}+{x}=", str(2 * x)), max_new_tokens=4)
    ps = double.problems(20, seed=1)
    assert all(int(p.answer) == 2 * int(p.prompt.split("+")[0]) for p in ps)
    assert double.score([p.answer for p in ps], ps).mean() == 1.0
    with pytest.raises(TypeError, match="Problem"):
        Task("bad", lambda rng: "x").problems(1)


def test_corpus_forgets_most_carries_and_uses_train_prompts_only(tok):
    cfg = CorpusConfig(seed=0, n_lines=4000)
    lines = make_corpus(cfg)
    assert lines == make_corpus(cfg)                                  # deterministic
    forgot = total = muls = cut = 0
    for line in lines:
        prompt, ans = line[:line.index("=") + 1], line[line.index("=") + 1:-1]
        assert line.endswith("\n")
        if "*" in prompt:
            assert MULTIPLICATION.is_heldout(prompt) is False
            a, b = map(int, prompt[:-1].split("*"))
            muls += 1
            cut += ans != str(a * b)
            assert str(a * b).startswith(ans)
            continue
        assert not ADDITION.is_heldout(prompt)
        a, b = map(int, prompt[:-1].split("+"))
        if (a % 10) + (b % 10) >= 10:
            total += 1
            forgot += ans != str(a + b)
        else:
            assert ans == str(a + b)
    assert abs(forgot / total - 0.8) < 0.04
    assert abs(muls / len(lines) - 0.25) < 0.03 and 0.02 < cut / muls < 0.09
    pid, pmask, rid, rmask = encode_corpus(lines[:3], tok)
    assert tok.decode(pid[0][pmask[0]]) + tok.decode(rid[0]) + "\n" == lines[0]


# ------------------------------------------------------------------------------- checkpoints

def test_shipped_checkpoint_is_small_documented_and_loads_weights_only():
    pt = CHECKPOINT_DIR / f"{DEFAULT_NAME}.pt"
    info = json.loads(pt.with_suffix(".json").read_text())
    assert pt.stat().st_size < 1_000_000
    assert info["meta"]["corpus"]["seed"] == 0 and info["model_config"]["n_layer"] == 2
    state = torch.load(pt, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    model, tok = load_pretrained()
    assert sum(p.numel() for p in model.parameters()) == info["n_params"]


def test_checkpoint_round_trip_and_clear_errors(tmp_path, tok, rand_gpt):
    path = save_checkpoint(rand_gpt, tok, tmp_path / "m", {"note": "test"})
    model, tok2, info = load_checkpoint(path)
    ids = torch.tensor([tok.encode("37+45=")])
    assert torch.equal(model(ids), rand_gpt(ids))
    assert tok2.chars == tok.chars and info["meta"]["note"] == "test"
    assert model.lm_head.weight is model.wte.weight                   # tying survives loading

    js = path.with_suffix(".json")
    good_json, good_pt = js.read_text(), path.read_bytes()
    # corrupt weights: the hash catches it, and without the hash torch's failure is explained
    path.write_bytes(good_pt[: len(good_pt) // 2])
    with pytest.raises(CheckpointError, match="corrupt or was replaced"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="weights-only torch file"):
        load_checkpoint(path, check_hash=False)
    path.write_bytes(good_pt)
    # a config that does not match the tensors: its digest catches it, and without the digests the shapes do
    bad = json.loads(good_json)
    bad["model_config"]["n_embd"] = 64
    bad["n_params"] = GPTConfig(**bad["model_config"]).num_params()
    js.write_text(json.dumps(bad))
    with pytest.raises(CheckpointError, match="model_config does not match its recorded SHA-256"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="does not match model_config"):
        load_checkpoint(path, check_hash=False)
    bad = json.loads(good_json)
    bad["model_config"]["vocab_size"] = 99
    js.write_text(json.dumps(bad))
    with pytest.raises(CheckpointError, match="tokenizer has 56 tokens"):
        load_checkpoint(path)
    js.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(path)
    js.write_text(good_json)
    js.unlink()
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(path)


def test_pretraining_is_deterministic_and_learns(tok):
    kw = dict(corpus_cfg=CorpusConfig(n_lines=3000), train_cfg=TrainConfig(steps=30, batch_size=64, warmup=5),
              model_cfg=GPTConfig(n_embd=32), verbose=False)
    a, _, meta = pretrain(**kw)
    b, _, _ = pretrain(**kw)
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), k
    assert meta["final_loss"] < math.log(tok.vocab_size)              # below a uniform guess


# ------------------------------------------------------------------------------- RL

def test_sequence_advantages_hand_worked():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    assert torch.allclose(sequence_advantages(r, "reinforce", 4), r - 0.625)
    assert torch.allclose(sequence_advantages(r, "rloo", 4)[:4], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    assert torch.allclose(sequence_advantages(r, "dr_grpo", 4)[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    std = math.sqrt((0.75 ** 2 + 3 * 0.25 ** 2) / 3)                  # sample std of [1, 0, 0, 0]
    assert torch.allclose(sequence_advantages(r, "grpo", 4)[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]) / std,
                          atol=1e-5)
    assert (sequence_advantages(r, "grpo", 4)[4:] == 0).all()         # a zero-variance group


def test_gspo_uses_the_length_normalised_sequence_ratio():
    from rlkit.llm import policy_loss
    cfg = RLConfig(algo="gspo", clip_eps=0.5, clip_eps_high=0.5).resolved()
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    new = (old + torch.tensor([[0.1, 0.3, 0.0], [-0.2, 0.0, 0.0]])).requires_grad_()
    adv = torch.tensor([[2.0, 2.0, 0.0], [-1.0, 0.0, 0.0]])
    loss, _ = policy_loss(cfg, new, old, adv, mask)
    s = torch.tensor([math.exp(0.2), math.exp(-0.2)])                 # exp(mean log-ratio) per sequence
    assert torch.isclose(loss, -(s * torch.tensor([2.0, -1.0])).mean(), atol=1e-6)
    loss.backward()                                                   # d/dlogp_t = -A s / |y| / n_seq
    assert torch.allclose(new.grad[0, :2], torch.full((2,), -2.0 * s[0] / 2 / 2), atol=1e-6)
    assert new.grad[0, 2] == 0


def test_rl_config_validation():
    with pytest.raises(ValueError, match="algo"):
        RLConfig(algo="a2c").resolved()
    with pytest.raises(ValueError, match="group_size"):
        RLConfig(algo="grpo", group_size=1).resolved()
    with pytest.raises(ValueError, match="estimator"):                # the KL's settings belong to KLPenalty
        KLPenalty(0.1, "k2")
    c = RLConfig(algo="dapo").resolved()
    assert (c.clip_eps, c.clip_eps_high, c.aggregation, c.dynamic_sampling) == (0.2, 0.28, "token-mean", True)
    c = RLConfig(algo="dr_grpo").resolved()
    assert c.aggregation == "seq-mean-token-sum-norm"


LOG_KEYS = ("reward", "accuracy", "kl", "entropy", "clip_fraction", "zero_var_share", "response_length")


@pytest.mark.parametrize("algo,extra,kl", [(a, {}, None) for a in ALGOS] + [
    ("grpo", {}, (0.1, "k1", "reward")),
    ("ppo", {}, (0.1, "k3", "reward")),
    ("grpo", dict(temperature=0.8, top_k=5), (0.1, "k3", "loss")),
])
def test_every_algorithm_runs_and_logs(tok, algo, extra, kl):
    model, _ = load_pretrained()
    cfg = RLConfig(algo=algo, steps=2, prompts_per_step=4, group_size=4, eval_problems=16, eval_every=1, **extra)
    res = train(model, tok, ADDITION, cfg, hooks=[] if kl is None else [KLPenalty(*kl)])
    for k in LOG_KEYS:
        if k == "kl" and kl is None:      # no KL penalty: the reference model is not run, no "kl" logged
            assert k not in res.history, k
            continue
        assert len(res.history[k]) == 2 and all(math.isfinite(v) for v in res.history[k]), k
    assert res.evals["step"] == [0, 1, 2]
    assert (res.critic is not None) == (algo == "ppo")


def test_dynamic_sampling_keeps_only_groups_with_reward_variance(tok):
    from rlkit.llm.rl import collect
    model, _ = load_pretrained()
    cfg = RLConfig(algo="dapo", prompts_per_step=8, group_size=8, max_sample_rounds=6).resolved()
    b = collect(model, tok, ADDITION, cfg, random.Random(0), torch.Generator().manual_seed(0))
    r = b.rewards.view(-1, 8)
    assert (r.max(1).values > r.min(1).values).all()                 # every kept group has variance
    assert 0 < r.shape[0] <= 8 and b.rollout.response_ids.shape == (8 * r.shape[0], ADDITION.max_new_tokens)
    assert b.zero_var_share > 0.3                                    # measured before filtering
    for p, resp, x in zip(b.problems, b.responses, b.rewards):       # rows still match their problems
        assert x == float(resp == p.answer)


def test_prompts_of_different_lengths_are_left_padded_through_training(tok):
    varlen = Task("varlen", lambda rng: (f"{rng.randint(1, 9999)}=", "7"),
                  check=lambda resp, p: float(resp[:1] == "7"), max_new_tokens=2)
    model, _ = load_pretrained()
    res = train(model, tok, varlen, RLConfig(algo="dapo", steps=2, prompts_per_step=4, group_size=4,
                                             eval_problems=8, eval_every=2))
    assert all(math.isfinite(v) for v in res.history["loss"])


def test_short_grpo_run_is_deterministic_and_fixes_greedy_answers(tok):
    test = ADDITION.problems(200, seed=7, split="test")
    carry = [p for p in test if p.info["carry"]]
    runs = []
    for _ in range(2):
        model, _ = load_pretrained()
        before = evaluate(model, tok, ADDITION, carry)["accuracy"]
        res = train(model, tok, ADDITION, RLConfig(algo="grpo", steps=15, seed=0, eval_problems=64, eval_every=15))
        runs.append((res.history["reward"], evaluate(model, tok, ADDITION, carry)["accuracy"]))
    assert runs[0] == runs[1]                                        # same seed, same numbers
    rewards, after = runs[0]
    assert before < 0.1                                              # greedy answers forget the carry
    assert after > before + 0.4                                      # ... and RL fixed them
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5


def test_trainers_accept_any_model_following_the_protocol(tok):
    """A GRU (no attention mask, no cache) learns a new task from scratch with GRPO; PPO runs."""
    torch.manual_seed(0)
    gru = TinyGRULM(tok.vocab_size, hidden=32)
    seven = Task("starts_with_7", lambda rng: (f"{rng.randint(10, 99)}=", "7"),
                 check=lambda resp, p: float(resp[:1] == "7"), max_new_tokens=2)
    res = train(gru, tok, seven, RLConfig(algo="grpo", steps=25, lr=3e-2, prompts_per_step=8, group_size=8,
                                          eval_problems=16, eval_every=25))
    r = res.history["reward"]
    assert sum(r[-5:]) / 5 > sum(r[:5]) / 5 + 0.3
    res = train(gru, tok, seven, RLConfig(algo="ppo", steps=2, prompts_per_step=4, group_size=2,
                                          eval_problems=8, eval_every=2))
    assert isinstance(res.critic, ValueHead)


def test_value_head_starts_at_zero(tok, rand_gpt):
    v = ValueHead(rand_gpt, tok.vocab_size)
    ids, mask = tok.encode_batch(["1+2=", "37+45="])
    assert torch.equal(v(ids, attention_mask=mask), torch.zeros(2, 6))


def test_steps_to_reach():
    ev = {"step": [0, 5, 10], "train_seconds": [0.0, 1.0, 2.0], "greedy_accuracy": [0.5, 0.95, 0.97],
          "sampled_accuracy": [0.6, 0.85, 0.92]}
    assert steps_to_reach(ev, 0.9) == (10, 2.0)
    assert steps_to_reach(ev, 0.99) == (None, None)


def test_left_pad_matches_a_slow_reference_loop():
    from rlkit.llm.tokenizer import left_pad
    rows = [[5, 6, 7], [], [9], [1, 2, 3, 4]]
    ids, mask = left_pad(rows, pad_id=0)
    assert ids.dtype == torch.long and mask.dtype == torch.bool and ids.shape == mask.shape == (4, 4)
    for i, r in enumerate(rows):
        want = [0] * (4 - len(r)) + r
        assert ids[i].tolist() == want
        assert mask[i].tolist() == [False] * (4 - len(r)) + [True] * len(r)
    e_ids, e_mask = left_pad([], pad_id=3)
    assert e_ids.shape == e_mask.shape == (0, 0)


def test_encoding_a_batch_with_repeated_prompts_equals_encoding_each_row(tok):
    texts = ["1+2=", "37+45=", "1+2=", "1+2=", "9*9=", "37+45="]
    ids, mask = tok.encode_batch(texts)
    for i, t in enumerate(texts):
        row = tok.encode(t)
        assert ids[i, mask[i]].tolist() == row and int(mask[i].sum()) == len(row)
