"""Tests of rlkit.llm.safety: the cost checker, the shield, removed mass, the cost constraint hook, the wrapper.

Independent computations: the shield against a string scan of every sampled response and against
a hand-built masked softmax, removed mass against the model's own probabilities of the banned
token, the cost channel's first advantages against GAE's closed form on a zero critic, and the
hook's advantages against lagrangian_advantages with the multiplier each timing must use.
"""
from __future__ import annotations

import math

import pytest
import torch

from rlkit.llm import RLConfig, encode_prompts, load_pretrained, sample, token_logprobs, train
from rlkit.llm.advantages import Group, TokenGAE
from rlkit.llm.heads import LogitHead
from rlkit.llm.safety import (
    FORBIDDEN_ADDITION,
    CostConstraint,
    RewardCostCritic,
    ShieldRate,
    constraint_report,
    forbidden_substrings,
    forbidden_task,
    removed_mass,
    substring_shield,
    train_constrained,
)
from rlkit.llm.samplers import Fresh
from rlkit.llm.tasks import Problem, prefix_match
from rlkit.llm.trainer import Hook, KLPenalty
from rlkit.objectives import normalize_advantages
from rlkit.safety import LagrangeMultiplier, PIDLagrangian, lagrangian_advantages


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


def test_forbidden_task_takes_more_checkers():
    task = forbidden_task(checkers={"prefix": prefix_match})
    assert list(task.checkers) == ["exact", "prefix", "cost"] and task.name == FORBIDDEN_ADDITION.name
    assert task.description == FORBIDDEN_ADDITION.description and task.max_new_tokens == 5
    assert list(FORBIDDEN_ADDITION.checkers) == ["exact", "cost"] and "exact" in FORBIDDEN_ADDITION.token_checkers
    assert forbidden_task(["7"]).checkers["cost"]("17", Problem("1+16=", "17")) == 1.0
    with pytest.raises(ValueError, match="cost"):
        forbidden_task(checkers={"cost": prefix_match})


def test_critic_shape_and_zero_init(base):
    model, tok = base
    import copy
    critic = RewardCostCritic(copy.deepcopy(model), tok.vocab_size)
    ids = torch.tensor([tok.encode("12+34=46")])
    out = critic(ids)
    assert isinstance(critic, LogitHead) and critic.shape == (2,)
    assert out.shape == (1, ids.shape[1], 2) and (out == 0).all()


CFG = RLConfig(algo="ppo", steps=3, prompts_per_step=4, group_size=2, minibatches=1, lr=3e-4)


class Probe(Hook):
    """Records, after the hooks before it, what the advantages were made of at every update."""

    def __init__(self, constraint):
        self.constraint, self.seen = constraint, []

    def on_advantages(self, run, step):
        self.seen.append(dict(adv=step.adv.clone(), parts={k: v.clone() for k, v in step.data["advantages"].items()},
                              nu=self.constraint.nu, mask=step.rollout.mask.clone(), logp_old=step.logp_old.clone(),
                              rollout=step.rollout, cost=step.data["channels"]["cost"].clone()))


def test_wrapper_logs_nu_and_steps_the_multiplier_before_the_advantages(base):
    _, tok = base
    model, _ = load_pretrained()
    mult = LagrangeMultiplier(budget=0.0, lr=1.0, init=0.5)
    res = train_constrained(model, tok, FORBIDDEN_ADDITION, CFG, multiplier=mult)
    nu, cost = res.array("nu"), res.array("cost")
    assert len(nu) == 3 and all(math.isfinite(x) for x in res.array("value_loss"))
    assert all(math.isfinite(x) for x in res.array("cost_value_loss"))
    # budget 0: nu grows by exactly the measured cost at each step
    assert nu[0] == pytest.approx(0.5 + cost[0]) and nu[2] == pytest.approx(0.5 + cost.sum())
    assert res.nu == nu[-1] and res.multiplier is mult and mult.value == res.nu
    assert "shield_rate" not in res.history and "kl" not in res.history and "lam" not in res.history
    assert isinstance(res.critic, LogitHead) and res.critic.shape == (2,)
    shield = substring_shield(tok, ["13"])
    res2 = train_constrained(load_pretrained()[0], tok, FORBIDDEN_ADDITION, CFG, kl=KLPenalty(0.05),
                             multiplier=PIDLagrangian(0.05, kp=1.0, ki=0.5), logits_processor=shield)
    assert all(0.0 <= x <= 1.0 for x in res2.array("shield_rate")) and math.isfinite(res2.array("kl")[-1])
    fixed = train_constrained(load_pretrained()[0], tok, FORBIDDEN_ADDITION, CFG.replace(steps=1), multiplier=2.0)
    assert fixed.array("nu")[0] == 2.0 and fixed.nu == 2.0


@pytest.mark.parametrize("when", ["before", "after"])
def test_the_advantages_use_the_multiplier_of_their_timing(base, when):
    _, tok = base
    mult = LagrangeMultiplier(budget=0.0, lr=1.0, init=0.5)
    hook = CostConstraint("cost", mult, when=when)
    probe = Probe(hook)
    res = train(load_pretrained()[0], tok, FORBIDDEN_ADDITION, CFG, hooks=[hook, probe], evaluation=False)
    cost = res.array("cost")
    used = [0.5 + cost[:k + 1].sum() if when == "before" else 0.5 + cost[:k].sum() for k in range(3)]
    for k, seen in enumerate(probe.seen):
        assert seen["nu"] == pytest.approx(used[k])
        want = normalize_advantages(lagrangian_advantages(seen["parts"]["reward"], seen["parts"]["cost"],
                                                          seen["nu"], seen["mask"]), seen["mask"])
        assert torch.equal(seen["adv"], want)
    assert res.array("nu")[-1] == pytest.approx(0.5 + cost.sum()) == res.nu     # logged: after the step


def test_the_cost_channel_is_gae_of_the_terminal_cost_on_a_zero_critic(base):
    # at the first update the critic is zero, so the cost advantage is (gamma lam)^(last - t) * c on every token
    _, tok = base
    hook = CostConstraint("cost", None)
    probe = Probe(hook)
    cfg = CFG.replace(steps=1, prompts_per_step=16)
    train(load_pretrained()[0], tok, FORBIDDEN_ADDITION, cfg, advantages=TokenGAE(gamma=0.9, lam=0.5),
          hooks=[hook, probe], evaluation=False)
    seen = probe.seen[0]
    mask, c = seen["mask"], seen["cost"]
    assert c.sum() > 0                                   # the batch holds costly responses
    t = torch.arange(mask.shape[1], dtype=torch.float32)
    last = mask.sum(-1, keepdim=True) - 1
    want = torch.where(mask > 0, (0.9 * 0.5) ** (last - t) * c[:, None], torch.zeros(()))
    assert torch.allclose(seen["parts"]["cost"], want, atol=1e-6)
    assert torch.equal(seen["adv"], normalize_advantages(seen["parts"]["reward"], mask))     # nu = 0


def test_recompute_takes_the_learners_logprobs_under_a_shield(base):
    _, tok = base
    shield = substring_shield(tok, ["13"])
    for recompute in (False, True):
        hook = CostConstraint("cost", None)
        probe = Probe(hook)
        train(load_pretrained()[0], tok, FORBIDDEN_ADDITION, CFG.replace(steps=1), hooks=[hook, probe, ShieldRate()],
              sampler=Fresh(recompute=recompute), logits_processor=shield, evaluation=False)
        seen, ro = probe.seen[0], probe.seen[0]["rollout"]
        learner = token_logprobs(load_pretrained()[0], ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask,
                                 logits_processor=shield)
        assert torch.equal(seen["logp_old"], learner if recompute else ro.logprobs)
        assert torch.allclose(ro.logprobs, learner, atol=1e-4)


def test_the_constraint_needs_a_critic_with_a_cost_channel(base):
    _, tok = base
    with pytest.raises(ValueError, match="values the 'cost' channel"):
        train(load_pretrained()[0], tok, FORBIDDEN_ADDITION, RLConfig(algo="grpo", steps=1, prompts_per_step=2),
              hooks=[CostConstraint("cost", 1.0)], evaluation=False)
    with pytest.raises(ValueError, match="checkers"):
        train(load_pretrained()[0], tok, FORBIDDEN_ADDITION, CFG, hooks=[CostConstraint("nope")], evaluation=False)
    with pytest.raises(TypeError, match="value"):
        CostConstraint("cost", type("M", (), {"update": lambda self, c: 0.0})(), when="after")


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
    with pytest.raises(TypeError, match="kl must be a KLPenalty"):
        train_constrained(model, tok, FORBIDDEN_ADDITION, RLConfig(algo="ppo", steps=1), kl=0.05)
    with pytest.raises(TypeError, match="advantages must be a TokenGAE"):
        train_constrained(model, tok, FORBIDDEN_ADDITION, RLConfig(algo="ppo", steps=1), advantages=Group("grpo"))


def test_the_wrapper_gives_its_critic_settings_to_the_estimator(base):
    # rlkit 0.2 read gamma, lam, value_lr, value_coef from cfg and took critic=: now they are TokenGAE's
    _, tok = base
    est = TokenGAE(LogitHead(load_pretrained()[0], tok.vocab_size, (2,)), gamma=0.9, lam=0.5, lr=1e-3, coef=0.5)
    res = train_constrained(load_pretrained()[0], tok, FORBIDDEN_ADDITION, CFG.replace(steps=1), multiplier=1.0,
                            advantages=est)
    assert res.critic is est.critic and est.opt.param_groups[0]["lr"] == 1e-3
    same = train(load_pretrained()[0], tok, FORBIDDEN_ADDITION, CFG.replace(steps=1), sampler=Fresh(recompute=True),
                 advantages=TokenGAE(LogitHead(load_pretrained()[0], tok.vocab_size, (2,)), gamma=0.9, lam=0.5,
                                     lr=1e-3, coef=0.5),
                 hooks=[CostConstraint("cost", 1.0)], evaluation=False)
    for key in ("reward", "cost", "value_loss", "cost_value_loss", "loss"):
        assert res.array(key).tolist() == same.array(key).tolist()


@pytest.mark.parametrize("field,value", [("eval_every", 1), ("eval_problems", 8)])
def test_the_wrapper_refuses_the_fields_it_never_read(base, field, value):
    # rlkit 0.2's train_constrained accepted these and ignored them (no evaluation)
    model, tok = base
    with pytest.raises(ValueError, match=f"train_constrained does not read RLConfig.{field} "):
        train_constrained(model, tok, FORBIDDEN_ADDITION, CFG.replace(**{field: value}))


def test_the_critic_fields_it_never_read_are_no_longer_settings():
    # rlkit 0.2's train_constrained refused token_rewards, value_target, value_nstep, value_lam: RLConfig has none now
    with pytest.raises(ValueError, match=r"RLConfig.value_target .*TokenGAE\(target=...\)"):
        CFG.replace(value_target="mc")


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


def test_channel_losses_are_logged_with_the_value_coef(base):
    # the critic's loss is coef * sum over channels of 1/2 mean (V - target)^2; each logged term carries the
    # coefficient, as TokenGAE's value_loss does without channels (rlkit 0.2's trainer logged them without it)
    _, tok = base
    one = CFG.replace(steps=1)
    runs = [train(load_pretrained()[0], tok, FORBIDDEN_ADDITION, one, advantages=TokenGAE(coef=c),
                  hooks=[CostConstraint("cost", 1.0)], evaluation=False) for c in (1.0, 0.5)]
    for key in ("value_loss", "cost_value_loss"):
        assert runs[1].array(key)[0] == 0.5 * runs[0].array(key)[0] and runs[0].array(key)[0] > 0
