"""Problem set 3: a stale-sampler study (chapters 8, 11, 12, 13). The student's side.

Tasks (answer cells of ``lessons/problem_sets/ps3_stale_sampler.ipynb``):

* ``mean_tv(logits_a, logits_b)``: the exact mean TV distance between two categorical policies over states
  (what U_k and S_k are, chapter 11);
* ``update_shift_estimate(logp_new, logp_prox, logp_behav, mask=None)``: the sample estimate of U_k;
* ``staleness_estimate(logp_prox, logp_behav, mask=None)``: the sample estimate of S_k;
* ``decoupled_clip_loss(logp, logp_prox, logp_behav, adv, eps=0.2)``: the correction (chapter 12's decoupled clip);
* ``stale_ppo(lag, seed, correction="none", total_steps=12_000, ...)``: the experiment driver, PPO on
  CartPole with a sampler held back by ``lag`` versions, returning the per-update numbers for the plots.

The visible tests compare against hand-worked cases, a slow loop over states, and rlkit's public
estimators (``rlkit.staleness``, ``rlkit.objectives.decoupled_ppo_loss``); no reference ships here.
"""
from __future__ import annotations

import math

import torch

from . import ProblemSet, Test, register_problem_set

__all__ = ["PS3", "LEARN_STEPS", "LEARN_RETURN"]

#: The learning tests' budget (env steps at lag 0; 8 envs x 32 steps per update) and the return asked for
#: (the mean undiscounted return of the last 20 episodes; a uniform random policy gets about 22).
LEARN_STEPS = 6_144
#: The return the learning tests ask for (see ``LEARN_STEPS``).
LEARN_RETURN = 50.0
_KEYS = ("update_shift", "update_shift_tv", "staleness", "staleness_tv", "return")


def assert_close(got, want, what: str, atol: float = 1e-6) -> None:
    if not isinstance(got, torch.Tensor):
        raise AssertionError(f"{what}: expected a tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        raise AssertionError(f"{what}: expected shape {tuple(want.shape)}, got {tuple(got.shape)}")
    g, w = got.detach().double(), want.detach().double()
    if not torch.isfinite(g).all():
        raise AssertionError(f"{what}: the result has NaN or inf")
    err = (g - w).abs().max().item() if g.numel() else 0.0
    if err > atol:
        raise AssertionError(f"{what}: largest error {err:.2e} (allowed {atol:g})")


def driver_run(ns, lag: int, seed: int, total_steps: int = LEARN_STEPS, correction: str = "none") -> dict:
    torch.manual_seed(seed)
    hist = ns["stale_ppo"](lag=lag, seed=seed, correction=correction, total_steps=total_steps)
    assert isinstance(hist, dict), f"stale_ppo must return a dict (the history), got {type(hist).__name__}"
    n = total_steps // (8 * 32)
    for key in _KEYS:
        assert key in hist, f"the history has no key {key!r} (expected {_KEYS})"
        assert len(hist[key]) == n, f"history[{key!r}] has {len(hist[key])} entries, expected one per update ({n})"
    return hist


# ------------------------------------------------------------------------------------------------
# mean_tv
# ------------------------------------------------------------------------------------------------

def _tv_hand(ns):
    a = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]))
    b = torch.log(torch.tensor([[0.5, 0.5], [0.6, 0.4], [0.8, 0.2]]))
    got = ns["mean_tv"](a, b)
    if isinstance(got, torch.Tensor) and got.dim() == 0 and abs(float(got) - 0.6) < 1e-4:
        raise AssertionError("you returned the mean of sum |p - q|: the TV distance has a factor 1/2")
    if isinstance(got, torch.Tensor) and got.dim() == 0 and abs(float(got) - 0.9) < 1e-4:
        raise AssertionError("you summed over the states: U_k and S_k are the MEAN over states")
    assert_close(got, torch.tensor(0.3), "three states: TV 0, 0.3 and 0.6, mean 0.3 (hand-worked)", 1e-5)


def _tv_loop(ns):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(40, 6, generator=g), 2 * torch.randn(40, 6, generator=g)
    want = sum(0.5 * sum(abs(p - q) for p, q in zip(torch.softmax(a[i], -1).tolist(), torch.softmax(b[i], -1).tolist()))
               for i in range(40)) / 40
    got = ns["mean_tv"](a, b)
    if isinstance(got, torch.Tensor) and got.dim() == 0:
        from rlkit.divergences import tv_categorical
        raw = 0.5 * (a - b).abs().sum(-1).mean()
        if abs(float(got) - float(raw)) < 1e-5:
            raise AssertionError("you compared logits: turn them into probabilities (softmax) first")
        assert abs(float(tv_categorical(a, b).mean()) - want) < 1e-5   # the slow loop agrees with rlkit
    assert_close(got, torch.tensor(want), "40 states, 6 actions, against a slow loop over states", 1e-5)


# ------------------------------------------------------------------------------------------------
# the estimators
# ------------------------------------------------------------------------------------------------

def _est_inputs(seed, n=200):
    g = torch.Generator().manual_seed(seed)
    lb = -2 * torch.rand(n, generator=g, dtype=torch.float64)
    lk = lb + 0.4 * torch.randn(n, generator=g, dtype=torch.float64)
    ln = lk + 0.2 * torch.randn(n, generator=g, dtype=torch.float64)
    return ln, lk, lb


def _u_hand(ns):
    lb = torch.log(torch.tensor([0.5, 0.25]))
    lk = torch.log(torch.tensor([0.5, 0.5]))
    ln = torch.log(torch.tensor([0.25, 0.5]))
    got = ns["update_shift_estimate"](ln, lk, lb)
    # rho_{k+1} = (0.5, 2), rho_k = (1, 2): 1/2 mean(|0.5 - 1|, 0) = 0.125; the incremental ratio alone gives 0.125 too
    # here, so the second case tells them apart
    assert_close(got, torch.tensor(0.125), "two samples: rho_{k+1} = (0.5, 2), rho_k = (1, 2)", 1e-6)
    lk2 = torch.log(torch.tensor([0.5, 0.5]))
    ln2 = torch.log(torch.tensor([0.5, 0.25]))
    got2 = ns["update_shift_estimate"](ln2, lk2, lb)
    if isinstance(got2, torch.Tensor) and abs(float(got2) - 0.125) < 1e-6:
        raise AssertionError("you used the incremental ratio pi_{k+1}/pi_k; U_k's estimate on stale data weights "
                             "|r - 1| by rho_k = pi_k/mu: 1/2 mean |pi_{k+1}/mu - pi_k/mu|")
    assert_close(got2, torch.tensor(0.25), "rho_{k+1} = (1, 1), rho_k = (1, 2): 1/2 mean(0, 1) = 0.25", 1e-6)


def _s_hand_and_library(ns):
    lb = torch.log(torch.tensor([0.5, 0.2, 0.4]))
    lk = torch.log(torch.tensor([0.25, 0.2, 0.6]))
    got = ns["staleness_estimate"](lk, lb)
    assert_close(got, torch.tensor((0.5 + 0.0 + 0.5) / 6), "rho_k = (0.5, 1, 1.5): 1/2 mean |rho - 1| = 1/6", 1e-6)
    from rlkit.staleness import staleness
    ln, lk, lb = _est_inputs(5)
    assert_close(ns["staleness_estimate"](lk, lb), staleness(lk, lb), "200 random samples (rlkit.staleness)", 1e-9)


def _estimates_masked(ns):
    from rlkit.staleness import staleness, update_shift
    ln, lk, lb = _est_inputs(6)
    mask = torch.arange(200) % 3 != 0
    ln2, lk2 = ln.clone(), lk.clone()
    ln2[~mask], lk2[~mask] = float("nan"), float("inf")
    u = ns["update_shift_estimate"](ln2, lk2, lb, mask)
    s = ns["staleness_estimate"](lk2, lb, mask)
    assert_close(u, update_shift(ln, lk, lb, mask), "U_k with a mask over NaN/inf entries", 1e-9)
    assert_close(s, staleness(lk, lb, mask), "S_k with a mask over NaN/inf entries", 1e-9)


def _estimator_unbiased(ns):
    """On one state with 4 actions: the sample mean of the estimate over 20000 draws from mu is the exact TV."""
    g = torch.Generator().manual_seed(7)
    mu, pk = torch.tensor([0.4, 0.3, 0.2, 0.1]), torch.tensor([0.1, 0.2, 0.3, 0.4])
    acts = torch.multinomial(mu, 20_000, replacement=True, generator=g)
    got = ns["staleness_estimate"](pk.log()[acts], mu.log()[acts])
    exact = 0.5 * (pk - mu).abs().sum().item()          # 0.4
    assert isinstance(got, torch.Tensor) and abs(float(got) - exact) < 0.015, \
        f"over 20000 samples from mu the estimate of S is {float(got):.4f}, the exact TV is {exact:.4f}"


# ------------------------------------------------------------------------------------------------
# decoupled_clip_loss
# ------------------------------------------------------------------------------------------------

def _decoupled_library(ns):
    from rlkit.objectives import decoupled_ppo_loss, ppo_clip_loss
    ln, lk, lb = _est_inputs(8, n=64)
    logp = ln.clone().requires_grad_(True)
    adv = torch.randn(64, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    got = ns["decoupled_clip_loss"](logp, lk, lb, adv, 0.2)
    want, _ = decoupled_ppo_loss(logp, lk, lb, adv, 0.2)
    if isinstance(got, torch.Tensor) and got.dim() == 0:
        plain, _ = ppo_clip_loss(logp, lb, adv, 0.2)
        if abs(got.item() - plain.item()) < 1e-9:
            raise AssertionError("this is standard PPO-clip of pi/mu: the decoupled clip centres the clip on pi_prox "
                                 "and multiplies by w = pi_prox/mu outside it")
    assert_close(got, want, "64 samples, eps 0.2 (rlkit.objectives.decoupled_ppo_loss)", 1e-9)


def _decoupled_gradient(ns):
    ln, lk, lb = _est_inputs(10, n=64)
    logp = lk.clone().requires_grad_(True)              # at pi_theta = pi_prox: r = 1, nothing is clipped
    adv = torch.randn(64, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    loss = ns["decoupled_clip_loss"](logp, lk, lb, adv, 0.2)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0, "decoupled_clip_loss must return a 0-dim tensor"
    (grad,) = torch.autograd.grad(loss, logp)
    want = -torch.exp(lk - lb) * adv / 64                # the importance-sampled policy gradient, (pi/mu) A
    assert_close(grad, want, "the gradient at pi_theta = pi_prox: -(pi_prox/mu) A / n per sample "
                  "(w must be detached and outside the clip)", 1e-9)


# ------------------------------------------------------------------------------------------------
# stale_ppo
# ------------------------------------------------------------------------------------------------

def _driver_lag0(ns):
    hist = driver_run(ns, lag=0, seed=0, total_steps=8 * 32 * 4)
    assert all(x == 0.0 for x in hist["staleness"]), \
        f"at lag 0 the sampler is the learner: S_k must be exactly 0, got {hist['staleness']}"
    assert all(abs(x) < 1e-7 for x in hist["staleness_tv"]), f"at lag 0 the exact S_k is 0, got {hist['staleness_tv']}"
    assert all(x > 0 for x in hist["update_shift"]), \
        f"every update moves the policy: U_k > 0, got {hist['update_shift']}"


def _driver_lag_measures(ns):
    hist = driver_run(ns, lag=2, seed=1, total_steps=8 * 32 * 12)
    s, stv, u, utv = (hist[k] for k in ("staleness", "staleness_tv", "update_shift", "update_shift_tv"))
    assert s[0] == 0.0 and all(x > 0 for x in s[1:]), \
        f"lag 2: S_0 = 0 (the first sampler is the learner), then > 0; got {s}"
    # the ratio estimates agree with the exact TV on average (lemma lem-ch11-ratio); measured 0.994 to 1.004
    for name, est, ex in (("S_k", s[1:], stv[1:]), ("U_k", u, utv)):
        r = sum(est) / max(1e-12, sum(ex))
        assert 0.9 < r < 1.1, f"{name}: the estimates sum to {r:.2f} times the exact TV over the run (expected about 1)"


def _driver_learns(ns):
    """Seeds 0 and 1 at lag 0: the return of the last 20 episodes reaches LEARN_RETURN (credit per seed)."""
    rets = [driver_run(ns, lag=0, seed=seed)["return"][-1] for seed in (0, 1)]
    ok = sum(r >= LEARN_RETURN and math.isfinite(r) for r in rets)
    assert ok > 0, (f"at lag 0 after {LEARN_STEPS} env steps the mean return of the last 20 episodes is "
                    f"{[round(r, 1) for r in rets]} (expected >= {LEARN_RETURN:g} on each seed)")
    return ok / 2


#: Problem set 3 (the stale-sampler study), with its tasks, visible tests and points, registered under ``"ps3"``.
PS3 = register_problem_set(ProblemSet(
    key="ps3",
    title="A stale-sampler study",
    chapters=(8, 11, 12, 13),
    notebook="lessons/problem_sets/ps3_stale_sampler.ipynb",
    tasks=("mean_tv", "update_shift_estimate", "staleness_estimate", "decoupled_clip_loss", "stale_ppo"),
    visible=(
        Test("tv_hand_case", "mean_tv", 2.0, _tv_hand),
        Test("tv_against_a_loop", "mean_tv", 2.0, _tv_loop),
        Test("update_shift_hand_cases", "update_shift_estimate", 3.0, _u_hand),
        Test("staleness_hand_case_and_library", "staleness_estimate", 2.0, _s_hand_and_library),
        Test("estimates_with_mask", "update_shift_estimate", 2.0, _estimates_masked),
        Test("staleness_estimate_is_the_tv", "staleness_estimate", 1.0, _estimator_unbiased),
        Test("decoupled_against_library", "decoupled_clip_loss", 3.0, _decoupled_library),
        Test("decoupled_gradient", "decoupled_clip_loss", 2.0, _decoupled_gradient),
        Test("driver_lag0_is_fresh", "stale_ppo", 3.0, _driver_lag0, timeout=60.0),
        Test("driver_lag2_measures", "stale_ppo", 4.0, _driver_lag_measures, timeout=60.0),
        Test("driver_learns", "stale_ppo", 6.0, _driver_learns, timeout=180.0),
    ),
    written_points=40.0,
))
