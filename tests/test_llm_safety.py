"""Tests of rlkit.llm.safety: the cost checker, the shield, removed mass, the two-headed critic, the trainer.

Independent computations: the shield against a string scan of every sampled response and against
a hand-built masked softmax, removed mass against the model's own probabilities of the banned
token, and the trainer's advantages against lagrangian_advantages on a hand case.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlkit.llm import RLConfig, encode_prompts, load_pretrained, sample, token_logprobs
from rlkit.llm.safety import (
    FORBIDDEN_ADDITION,
    RewardCostCritic,
    constraint_report,
    forbidden_substrings,
    removed_mass,
    substring_shield,
    train_constrained,
)
from rlkit.llm.tasks import Problem
from rlkit.safety import LagrangeMultiplier, PIDLagrangian


@pytest.fixture(scope="module")
def base():
    m, tok = load_pretrained()
    m.eval()
    return m, tok


def test_cost_checker_and_task():
    cost = forbidden_substrings(["13", "14"])
    p = Problem("60+73=", "133")
    assert cost("133", p) == 1.0 and cost("141", p) == 1.0 and cost("31", p) == 0.0 and cost("", p) == 0.0
    assert FORBIDDEN_ADDITION.checkers["cost"]("113", p) == 1.0
    probs = FORBIDDEN_ADDITION.problems(4000, seed=0, split="all")
    share = sum(FORBIDDEN_ADDITION.checkers["cost"](q.answer, q) for q in probs) / len(probs)
    # sums 113, 114, 130..149 out of the 8100 prompts: count them exactly
    exact = sum(1 for a in range(10, 100) for b in range(10, 100) if ("13" in str(a + b) or "14" in str(a + b))) / 8100
    assert abs(share - exact) < 0.02 and 0.15 < exact < 0.18
    with pytest.raises(ValueError):
        forbidden_substrings([])
    with pytest.raises(TypeError):
        forbidden_substrings(["13", ""])


def test_shield_bans_exactly_the_completing_token(base):
    model, tok = base
    shield = substring_shield(tok, ["13"])
    ids = torch.tensor([tok.encode("12+5=1"), tok.encode("12+51=")])       # response "1" vs prompt ending "1="
    mask = torch.ones_like(ids, dtype=torch.bool)
    logits = torch.zeros(2, tok.vocab_size)
    out = shield(ids, mask, logits)
    three = tok.encode("3")[0]
    assert out[0, three] == -math.inf and torch.isfinite(out[0, :three]).all()
    assert torch.isfinite(out[1]).all()                # the "1" before "=" is in the prompt, not the response
    one_char = substring_shield(tok, ["7"])(ids, mask, logits)
    assert torch.isneginf(one_char[:, tok.encode("7")[0]]).all()


def test_no_sampled_response_contains_the_banned_pattern_and_logprobs_are_renormalised(base):
    model, tok = base
    shield = substring_shield(tok, ["13"])
    probs = FORBIDDEN_ADDITION.problems(256, seed=2, split="test")
    ids, mask = encode_prompts(probs, tok)
    ro = sample(model, ids, mask, max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id,
                generator=torch.Generator().manual_seed(0), logits_processor=shield)
    texts = tok.decode_batch(ro.response_ids)
    assert not any("13" in t for t in texts)
    # recomputed log q equals the sampler's, and differs from log p exactly by log(1 - removed mass)
    lq = token_logprobs(model, ids, mask, ro.response_ids, ro.mask, logits_processor=shield)
    assert torch.allclose(lq, ro.logprobs, atol=1e-5)
    m = removed_mass(ro)
    # independent: the model's probability of "3" at every position that follows a response "1"
    full = torch.cat([ids, ro.response_ids], 1)
    att = torch.cat([mask, torch.ones_like(ro.response_ids, dtype=torch.bool)], 1)
    with torch.no_grad():
        p = torch.softmax(model(full, attention_mask=att)[:, ids.shape[1] - 1:-1], -1)[..., tok.encode("3")[0]]
    after_one = torch.zeros_like(ro.mask, dtype=torch.bool)
    after_one[:, 1:] = ro.response_ids[:, :-1] == tok.encode("1")[0]
    want = torch.where(after_one & (ro.mask > 0), p, torch.zeros_like(p))
    assert torch.allclose(m, want, atol=1e-5)
    assert (m[ro.mask == 0] == 0).all()


def test_critic_shape_and_zero_init(base):
    model, tok = base
    import copy
    critic = RewardCostCritic(copy.deepcopy(model), tok.vocab_size)
    ids = torch.tensor([tok.encode("12+34=46")])
    out = critic(ids)
    assert out.shape == (1, ids.shape[1], 2) and (out == 0).all()


def test_trainer_runs_logs_and_moves_lambda(base):
    _, tok = base
    model, _ = load_pretrained()
    cfg = RLConfig(algo="ppo", steps=3, prompts_per_step=4, group_size=2, minibatches=1, lr=3e-4)
    mult = LagrangeMultiplier(budget=0.0, lr=1.0, init=0.5)
    res = train_constrained(model, tok, FORBIDDEN_ADDITION, cfg, multiplier=mult)
    lam, cost = res.array("lam"), res.array("cost")
    assert len(lam) == 3 and all(math.isfinite(x) for x in res.array("value_loss"))
    # budget 0: lambda grows by exactly the measured cost at each step
    assert lam[0] == pytest.approx(0.5 + cost[0]) and lam[2] == pytest.approx(0.5 + cost.sum())
    assert math.isnan(res.array("shield_rate")[0]) and math.isnan(res.array("kl")[0])
    shield = substring_shield(tok, ["13"])
    res2 = train_constrained(load_pretrained()[0], tok, FORBIDDEN_ADDITION, cfg.replace(kl_coef=0.05),
                             multiplier=PIDLagrangian(0.05, kp=1.0, ki=0.5), logits_processor=shield)
    assert all(0.0 <= x <= 1.0 for x in res2.array("shield_rate")) and math.isfinite(res2.array("kl")[-1])
    fixed = train_constrained(load_pretrained()[0], tok, FORBIDDEN_ADDITION, cfg.replace(steps=1), multiplier=2.0)
    assert fixed.array("lam")[0] == 2.0


def test_trainer_input_checks(base):
    model, tok = base
    with pytest.raises(ValueError, match="ppo"):
        train_constrained(model, tok, FORBIDDEN_ADDITION, RLConfig(algo="grpo", steps=1))
    with pytest.raises(ValueError, match="cost_checker"):
        train_constrained(model, tok, FORBIDDEN_ADDITION, RLConfig(algo="ppo", steps=1), cost_checker="nope")
    with pytest.raises(TypeError, match="update"):
        train_constrained(model, tok, FORBIDDEN_ADDITION, RLConfig(algo="ppo", steps=1), multiplier="sgd")
    with pytest.raises(ValueError, match="multiplier"):
        train_constrained(model, tok, FORBIDDEN_ADDITION, RLConfig(algo="ppo", steps=1), multiplier=-1.0)


def test_constraint_report_shielded_vs_not(base):
    model, tok = base
    probs = FORBIDDEN_ADDITION.problems(128, seed=4, split="test")
    shield = substring_shield(tok, ["13", "14"])
    rep = constraint_report(model, tok, FORBIDDEN_ADDITION, probs, logits_processor=shield,
                            generator=torch.Generator().manual_seed(0))
    assert rep["cost"] == 0.0 and rep["costs"].shape == (128,)
    raw = constraint_report(model, tok, FORBIDDEN_ADDITION, probs, generator=torch.Generator().manual_seed(0))
    assert raw["cost"] > 0.0
    assert raw["cost"] == pytest.approx(sum("13" in r or "14" in r for r in raw["responses"]) / 128)
