"""The lagged actor-critic learner of chapter 16 (rlkit/llm/lagged.py, OffPolicy and Pool).

offpolicy_targets is compared with slow per-token loops written from the equations and with the
on-policy identities (V-trace and the uncorrected lambda-return coincide when pi = mu); the
continuation estimate of V^pi is checked on prefixes whose value is known exactly (0 once a wrong
digit is written); the learner runs a few steps with each target, with simulated lags and with the
simulated ActorPool backend; train_lagged is checked to be rlkit.llm.train with its parts, to refuse
every setting it would ignore, and OffPolicy to take a critic with two channels.
"""
import math

import pytest
import torch

from rlkit.llm import ADDITION, RLConfig, load_pretrained, sample, train
from rlkit.llm.advantages import OffPolicy
from rlkit.llm.evaluation import encode_prompts
from rlkit.llm.heads import LogitHead, ValueHead
from rlkit.llm.lagged import (
    PROBES,
    TARGETS,
    ClippedLoss,
    LaggedConfig,
    QHead,
    ValueProbes,
    continuation_values,
    offpolicy_targets,
    target_errors,
    train_lagged,
)
from rlkit.llm.samplers import Lagged
from rlkit.llm.trainer import HeldOut, Hook
from rlkit.objectives import normalize_advantages
from rlkit.staleness import LagDistribution

torch.set_num_threads(1)
F64 = torch.float64


def _batch(seed=0, B=4, T=5, scale=0.7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 3, 1, 4])[:B]
    mask = (torch.arange(T)[None] < lengths[:, None]).to(F64)
    lr = scale * torch.randn(B, T, generator=g, dtype=F64) * mask
    r = torch.zeros(B, T, dtype=F64)
    r[torch.arange(B), lengths - 1] = torch.rand(B, generator=g, dtype=F64)
    v = torch.randn(B, T, generator=g, dtype=F64) * mask
    q = torch.randn(B, T, generator=g, dtype=F64) * mask
    not_last = torch.zeros_like(mask)
    not_last[:, :-1] = mask[:, 1:]
    nv = torch.cat([v[:, 1:], torch.zeros(B, 1, dtype=F64)], 1) * not_last
    return lr, r, v, nv, 0.9 * not_last, q, mask


def test_vtrace_targets_match_a_slow_loop():
    lr, r, v, nv, d, _, mask = _batch()
    lam, rb, cb = 0.8, 2.0, 1.0
    q, vs, adv = offpolicy_targets("vtrace", lr, r, v, nv, d, lam=lam, clip_rho=rb, clip_c=cb)
    B, T = r.shape
    for b in range(B):
        acc_next = 0.0
        for t in reversed(range(T)):
            rho = math.exp(lr[b, t])
            delta = r[b, t] + d[b, t] * nv[b, t] - v[b, t]
            want_q = r[b, t] + d[b, t] * (nv[b, t] + lam * acc_next)
            acc = min(rb, rho) * delta + d[b, t] * lam * min(cb, rho) * acc_next
            assert math.isclose(vs[b, t].item(), v[b, t].item() + acc.item(), abs_tol=1e-12)
            assert math.isclose(q[b, t].item(), want_q.item(), abs_tol=1e-12)
            assert math.isclose(adv[b, t].item(), want_q.item() - v[b, t].item(), abs_tol=1e-12)
            acc_next = acc


def test_retrace_targets_and_value_estimates_match_a_slow_loop():
    lr, r, v, nv, d, qt, mask = _batch(1)
    lam = 0.9
    G, vh, adv = offpolicy_targets("retrace", lr, r, v, nv, d, q_taken=qt, lam=lam)
    B, T = r.shape
    for b in range(B):
        g_next = None
        for t in reversed(range(T)):
            tail = 0.0 if t == T - 1 or g_next is None else \
                lam * min(1.0, math.exp(lr[b, t + 1])) * (g_next - qt[b, t + 1].item())
            want = r[b, t].item() + d[b, t].item() * (nv[b, t].item() + tail)
            assert math.isclose(G[b, t].item(), want, abs_tol=1e-12)
            c = min(1.0, math.exp(lr[b, t]))
            assert math.isclose(vh[b, t].item(), v[b, t].item() + lam * c * (want - qt[b, t].item()), abs_tol=1e-12)
            assert math.isclose(adv[b, t].item(), want - v[b, t].item(), abs_tol=1e-12)
            g_next = want


def test_on_policy_vtrace_is_the_uncorrected_lambda_return():
    _, r, v, nv, d, _, mask = _batch(2)
    zero = torch.zeros_like(r)
    for lam in (1.0, 0.7):
        none = offpolicy_targets("none", zero, r, v, nv, d, lam=lam)
        vt = offpolicy_targets("vtrace", zero, r, v, nv, d, lam=lam, clip_rho=1.0, clip_c=1.0)
        for a, b in zip(none, vt):
            assert torch.allclose(a * mask, b * mask, atol=1e-12)


def test_with_lambda_one_and_v_zero_the_uncorrected_target_is_the_return():
    lr, r, v, nv, d, _, mask = _batch(3)
    d = (d > 0).to(F64)
    q, vv, adv = offpolicy_targets("none", lr, r, torch.zeros_like(v), torch.zeros_like(v), d, lam=1.0)
    ret = torch.flip(torch.cumsum(torch.flip(r, [1]), 1), [1]) * mask
    assert torch.allclose(vv * mask, ret, atol=1e-12) and torch.allclose(q * mask, ret, atol=1e-12)


def test_value_targets_check_their_inputs():
    lr, r, v, nv, d, qt, _ = _batch()
    with pytest.raises(ValueError, match="target"):
        offpolicy_targets("gae", lr, r, v, nv, d)
    with pytest.raises(ValueError, match="q_taken"):
        offpolicy_targets("retrace", lr, r, v, nv, d)
    with pytest.raises(ValueError, match="q_taken"):
        offpolicy_targets("vtrace", lr, r, v, nv, d, q_taken=qt)
    with pytest.raises(ValueError, match="lam"):
        offpolicy_targets("none", lr, r, v, nv, d, lam=1.5)
    out = offpolicy_targets("vtrace", lr[:0], r[:0], v[:0], nv[:0], d[:0])      # an empty batch
    assert all(x.shape == (0, 5) for x in out)
    with pytest.raises(ValueError, match="critic='q'"):
        LaggedConfig(target="retrace", critic="v")
    assert set(PROBES) >= {"none", "vtrace(1)", "vtrace(2)", "retrace"} and TARGETS == ("none", "vtrace", "retrace")


def test_continuation_values_are_zero_after_a_wrong_digit_and_probabilities_otherwise():
    model, tok = load_pretrained()
    probs = ADDITION.problems(12, seed=3)
    ids, m = encode_prompts(probs, tok)
    g = torch.Generator().manual_seed(0)
    ro = sample(model, ids, m, max_new_tokens=ADDITION.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                generator=g)
    vals = continuation_values(model, tok, ADDITION, ro, probs, 8, torch.Generator().manual_seed(1))
    assert vals.shape == ro.mask.shape
    assert bool((vals[ro.mask == 0] == 0).all()) and bool(((vals >= 0) & (vals <= 1)).all())
    checked = 0
    for i, p in enumerate(probs):
        text = tok.decode(ro.response_ids[i])
        for t in range(int(ro.mask[i].sum())):
            if not p.answer.startswith(text[:t]):            # a wrong digit is already written: V = 0 exactly
                assert vals[i, t] == 0
                checked += 1
    assert checked > 0


def test_qhead_starts_at_zero_and_has_one_output_per_token():
    model, tok = load_pretrained()
    q = QHead(model, tok.vocab_size)                 # rlkit 0.2's name of LogitHead(lm, V, (V,))
    out = q(torch.tensor([[3, 4, 5]]))
    assert out.shape == (1, 3, tok.vocab_size) and bool((out == 0).all())
    assert isinstance(q, LogitHead) and q.shape == (tok.vocab_size,)


@pytest.mark.parametrize("target,critic", [("none", "v"), ("vtrace", "q"), ("retrace", "q")])
def test_train_lagged_runs_with_each_target(target, critic):
    model, tok = load_pretrained()
    cfg = RLConfig(algo="ppo", steps=3, prompts_per_step=4, group_size=4, eval_every=3, eval_problems=16, seed=0)
    lag = LaggedConfig(target=target, critic=critic, lag=LagDistribution.uniform(2), probe_every=2, probe_rows=4,
                       probe_continuations=4)
    res = train_lagged(model, tok, ADDITION, cfg, lag)
    assert all(len(v) == 3 for v in res.history.values())
    assert res.evals["step"] == [0, 3]
    assert all(math.isfinite(x) for x in res.history["value_loss"])
    assert res.history["mean_age"][0] == 0.0                      # version 0 is the only one at first
    assert len(res.probes) == 2
    names = set(res.probes[0]["estimates"])
    assert ("retrace" in names) == (critic == "q") and "critic" in names
    mse, n = res.target_errors("vtrace(1)")
    assert n > 0 and math.isfinite(mse)
    assert res.target_errors("none", ages=[99]) == (pytest.approx(math.nan, nan_ok=True), 0)


def test_train_lagged_consumes_a_simulated_actor_pool():
    from rlkit.distributed import ActorPool
    from rlkit.llm.actors import GroupSampler, tiny_llm
    model, tok = load_pretrained()
    cfg = RLConfig(algo="ppo", steps=4, prompts_per_step=3, group_size=4, minibatches=1, eval_every=4,
                   eval_problems=16, seed=0)
    with ActorPool(tiny_llm, GroupSampler("addition", group_size=4, prompts=1), n_actors=2, backend="simulated",
                   seed=0, lags=2) as pool:
        res = train_lagged(model, tok, ADDITION, cfg, LaggedConfig(target="vtrace"), pool=pool)
        assert len(res.consumed) == 12 == pool.consumed
        assert [c[4] for c in res.consumed] == pool.lags
        assert pool.version == 4
    ages = res.history["mean_age"]
    assert ages[0] == 0.0 and ages[-1] == 2.0                      # lag 2 once two versions are held
    with pytest.raises(ValueError, match="group"):
        with ActorPool(tiny_llm, GroupSampler("addition", group_size=2, prompts=1), backend="simulated") as pool:
            train_lagged(load_pretrained()[0], tok, ADDITION, cfg, LaggedConfig(), pool=pool)


SMALL = dict(algo="ppo", steps=2, prompts_per_step=4, group_size=4, eval_every=2, eval_problems=16, seed=0)
LOOP = SMALL                                             # the same loop settings, for train() with its parts


def test_train_lagged_is_train_with_its_parts():
    """The 0.2 wrapper and the chapter's call give the same run, bit for bit (history, probes, weights)."""
    cfg = RLConfig(**SMALL)
    lag = LaggedConfig(target="vtrace", clip_rho=2.0, lag=LagDistribution.uniform(2), probe_every=1, probe_rows=4,
                       probe_continuations=2)
    model, tok = load_pretrained()
    old = train_lagged(model, tok, ADDITION, cfg, lag)
    model2, _ = load_pretrained()
    # lam=1.0 is the default of both LaggedConfig and OffPolicy
    new = train(model2, tok, ADDITION, cfg, sampler=Lagged(LagDistribution.uniform(2)),
                advantages=OffPolicy("vtrace", "q", clip_rho=2.0), loss=ClippedLoss("standard"),
                hooks=[ValueProbes(every=1, rows=4, continuations=2)], evaluation=HeldOut(sampled=False, rewards=False))
    assert set(old.history) == set(new.history)
    for key in set(old.history) - {"train_seconds"}:
        assert [x.hex() for x in old.history[key]] == [x.hex() for x in new.history[key]], key
    assert old.evals["greedy_accuracy"] == new.evals["greedy_accuracy"] and set(old.evals) == set(new.evals)
    assert "loss" in old.history and "policy_loss" not in old.history       # the 0.2 key is the loop's "loss"
    assert all(torch.equal(a, b) for a, b in zip(old.model.state_dict().values(), new.model.state_dict().values()))
    assert len(new.probes) == 2 and old.consumed == []
    for name in ("none", "vtrace(2)", "retrace", "critic"):
        assert target_errors(new.probes, name) == old.target_errors(name)


def test_train_lagged_takes_the_critic_settings_from_lagged_config():
    """rlkit 0.3: gamma, lam, value_lr and value_coef are LaggedConfig's (OffPolicy's gamma, lam, lr, coef)."""
    model, tok = load_pretrained()
    for field, home in [("gamma", "OffPolicy\\(gamma="), ("lam", "OffPolicy\\(lam="), ("value_lr", "OffPolicy\\(lr="),
                        ("value_coef", "OffPolicy\\(coef="), ("kl_coef", "KLPenalty"), ("log_kl", "KLPenalty"),
                        ("token_rewards", "DenseRewards"), ("value_target", "TokenGAE\\(target=")]:
        with pytest.raises(ValueError, match=f"RLConfig.{field} is not a setting of the loop.*{home}"):
            RLConfig(**{**SMALL, field: 0.5})
    cfg = RLConfig(**{**SMALL, "steps": 1, "lr": 2e-4})
    lag = LaggedConfig(target="none", critic="v", lag=1, gamma=0.9, lam=0.8, value_lr=1e-3, value_coef=0.5)
    old = train_lagged(model, tok, ADDITION, cfg, lag)
    model2, _ = load_pretrained()
    new = train(model2, tok, ADDITION, cfg, sampler=Lagged(1), loss=ClippedLoss(),
                advantages=OffPolicy("none", "v", gamma=0.9, lam=0.8, lr=1e-3, coef=0.5),
                evaluation=HeldOut(sampled=False, rewards=False))
    for key in set(old.history) - {"train_seconds"}:
        assert [x.hex() for x in old.history[key]] == [x.hex() for x in new.history[key]], key
    assert all(torch.equal(a, b) for a, b in zip(old.critic.state_dict().values(), new.critic.state_dict().values()))
    default = train_lagged(load_pretrained()[0], tok, ADDITION, cfg, LaggedConfig(target="none", critic="v", lag=1))
    assert default.history["value_loss"] != old.history["value_loss"]      # the settings are read


@pytest.mark.parametrize("field,value", [
    ("algo", "grpo"), ("temperature", 0.7), ("top_k", 5), ("top_p", 0.9), ("clip_eps_high", 0.3)])
def test_train_lagged_refuses_the_settings_it_does_not_read(field, value):
    model, tok = load_pretrained()
    with pytest.raises(ValueError, match=f"{field}"):
        train_lagged(model, tok, ADDITION, RLConfig(**{**SMALL, field: value}))


@pytest.mark.parametrize("field,value", [("checker", "prefix"), ("dynamic_sampling", True),
                                         ("max_sample_rounds", 2)])
def test_train_lagged_with_a_pool_refuses_what_the_pool_decides(field, value):
    model, tok = load_pretrained()
    with pytest.raises(ValueError, match=f"RLConfig.{field} \\(with a pool"):
        train_lagged(model, tok, ADDITION, RLConfig(**{**SMALL, field: value}), pool=object())


def test_train_lagged_refuses_the_lag_with_a_pool_and_the_timeout_without_one():
    model, tok = load_pretrained()
    with pytest.raises(ValueError, match="LaggedConfig.lag is not used with a pool"):
        train_lagged(model, tok, ADDITION, RLConfig(**SMALL), LaggedConfig(lag=2), pool=object())
    with pytest.raises(ValueError, match="timeout is only used with a pool"):
        train_lagged(model, tok, ADDITION, RLConfig(**SMALL), timeout=5.0)


def test_lagged_config_refuses_the_clips_and_probe_sizes_it_would_ignore():
    with pytest.raises(ValueError, match="clip_rho and clip_c are only used by target='vtrace'"):
        LaggedConfig(target="none", clip_rho=2.0)
    with pytest.raises(ValueError, match="clip_rho and clip_c are only used by target='vtrace'"):
        LaggedConfig(target="retrace", clip_c=0.5)
    with pytest.raises(ValueError, match="only used with probe_every"):
        LaggedConfig(probe_rows=8)
    with pytest.raises(ValueError, match="only used by target='vtrace'"):
        OffPolicy("none", "v", clip_rho=2.0)
    with pytest.raises(ValueError, match="critic='q'"):
        OffPolicy("retrace", "v")


def test_offpolicy_refuses_a_value_critic_for_retrace_and_value_probes_need_it():
    model, tok = load_pretrained()
    with pytest.raises(ValueError, match="Q over the vocabulary"):
        train(model, tok, ADDITION, RLConfig(**LOOP), sampler=Lagged(1),
              advantages=OffPolicy("retrace", ValueHead(load_pretrained()[0], tok.vocab_size)))
    with pytest.raises(RuntimeError, match="value_estimate"):
        train(model, tok, ADDITION, RLConfig(**{**LOOP, "algo": "grpo"}), hooks=[ValueProbes(every=1)])


class _Cost(Hook):
    """A value channel "cost" (1 for a response longer than 3 tokens), combined as A_r - nu A_c."""

    def __init__(self, nu=0.5, give=True):
        self.nu, self.give, self.seen = nu, give, []

    def setup(self, run):
        run.value_channels.append("cost")

    def on_batch(self, run, step):
        if self.give:
            step.data.setdefault("channels", {})["cost"] = (step.rollout.mask.sum(-1) > 3).float()

    def on_advantages(self, run, step):
        a = step.data["advantages"]
        self.seen.append((sorted(a), tuple(a["cost"].shape), tuple(step.data["returns"].shape),
                          tuple(step.data["values"].shape)))
        step.adv = normalize_advantages(a["reward"] - self.nu * a["cost"], step.rollout.mask)


@pytest.mark.parametrize("critic,target", [("q", "retrace"), ("v", "vtrace")])
def test_offpolicy_values_a_cost_channel_beside_the_reward(critic, target):
    """The loop's value channels: one critic output and one corrected target per channel, the reward's first."""
    model, tok = load_pretrained()
    V, N, T = tok.vocab_size, 4 * 4, ADDITION.max_new_tokens
    cost = _Cost()
    res = train(model, tok, ADDITION, RLConfig(**LOOP), sampler=Lagged(1), advantages=OffPolicy(target, critic),
                loss=ClippedLoss(), hooks=[cost, ValueProbes(every=1, rows=2, continuations=2)],
                evaluation=HeldOut(sampled=False))
    assert res.critic.shape == ((2, V) if critic == "q" else (2,))
    assert cost.seen == [(["cost", "reward"], (N, T), (2, N, T), (N, T))] * 2
    for key in ("value_loss", "cost_value_loss"):
        assert len(res.history[key]) == 2 and all(math.isfinite(x) for x in res.history[key])
    assert res.probes[0]["estimates"]["critic"].shape == (2, T)      # the reward's values
    assert math.isfinite(target_errors(res.probes, "vtrace(1)")[0])
    with pytest.raises(ValueError, match="no values for the value channel 'cost'"):
        train(load_pretrained()[0], tok, ADDITION, RLConfig(**LOOP), sampler=Lagged(1),
              advantages=OffPolicy(target, critic), hooks=[_Cost(give=False)])
    with pytest.raises(ValueError, match="value channels \\('cost',\\)"):
        train(load_pretrained()[0], tok, ADDITION, RLConfig(**LOOP), sampler=Lagged(1),
              advantages=OffPolicy(target, LogitHead(load_pretrained()[0], V, (V,))), hooks=[_Cost()])
