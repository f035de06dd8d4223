r"""Problem set 4 (instructor side): the reference solution and the hidden tests.

The reference is written as a student would write it, in full (no call to ``rlkit.safety`` or
``rlkit.objectives``); ``reference_namespace()`` returns the names of the tasks, and ``HIDDEN`` the
tests run at grading time on fresh seeds and inputs (the student never sees them). The learning test
trains the student's ``train_constrained`` on seeds the skeleton never uses and asserts that the
constrained policy meets its budget within a stated tolerance while the unconstrained one does not.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from rlkit.exercises.problem_sets import Test
from rlkit.exercises.problem_sets.ps4 import HazardGrid, PS4Config, exact_values, rollout

__all__: list[str] = []   # instructor data (the reference and the hidden tests), not library API


# ------------------------------------------------------------------------------------------ the reference

def lagrangian_advantage(adv_reward: torch.Tensor, adv_cost: torch.Tensor, nu: float) -> torch.Tensor:
    r"""The advantage of the Lagrangian reward :math:`r - \nu c`, normalised:
    :math:`(\hat A^R - \nu\hat A^C)/(1 + \nu)`."""
    nu = float(nu)
    if not (math.isfinite(nu) and nu >= 0.0):
        raise ValueError(f"nu must be a finite number >= 0, got {nu}")
    return (adv_reward - nu * adv_cost) / (1.0 + nu)


def dual_ascent_step(nu: float, cost: float, budget: float, lr: float, nu_max: float | None = None) -> float:
    r"""Projected dual ascent: :math:`\nu \leftarrow \min(\nu_{\max}, [\nu + \eta_\nu(\hat J_C - C_{\max})]_+)`."""
    new = max(0.0, float(nu) + float(lr) * (float(cost) - float(budget)))
    if nu_max is not None:
        new = min(new, float(nu_max))
    return new


class PIDMultiplier:
    r"""The PID Lagrangian (chapter 18, eq-ch18-pid): :math:`I_k = [I_{k-1} + \Delta_k]_+`,
    :math:`\nu_k = [K_P\Delta_k + K_I I_k + K_D (\hat J_k - \hat J_{k-1})_+]_+`
    with :math:`\Delta_k = \hat J_k - C_{\max}`."""

    def __init__(self, budget: float, kp: float = 0.0, ki: float = 0.0, kd: float = 0.0, init: float = 0.0):
        self.budget, self.kp, self.ki, self.kd = float(budget), float(kp), float(ki), float(kd)
        self.integral = init / self.ki if self.ki > 0 else 0.0
        self.prev_cost = None
        self.value = float(init)

    def update(self, cost: float) -> float:
        cost = float(cost)
        delta = cost - self.budget
        self.integral = max(0.0, self.integral + delta)
        deriv = 0.0 if self.prev_cost is None else max(0.0, cost - self.prev_cost)
        self.prev_cost = cost
        self.value = max(0.0, self.kp * delta + self.ki * self.integral + self.kd * deriv)
        return self.value


def ppo_clip_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, clip: float,
                  mask: torch.Tensor | None = None):
    r"""PPO-clip loss (chapter 4) and two monitors (chapter 13): the clip fraction and the k3 estimate of
    :math:`\mathrm{KL}(\pi_{\text{old}}\,\|\,\pi_\theta)`; means over the steps where ``mask`` is true."""
    if mask is not None:
        logp_new, logp_old, adv = logp_new[mask], logp_old[mask], adv[mask]
    if logp_new.numel() == 0:
        zero = logp_new.sum() * 0.0
        return zero, {"clip_fraction": torch.zeros(()), "kl": torch.zeros(())}
    log_ratio = logp_new - logp_old
    ratio = torch.exp(log_ratio.clamp(max=30.0))
    surr = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip, 1.0 + clip) * adv)
    loss = -surr.mean()
    with torch.no_grad():
        clipped = ((ratio < 1.0 - clip) | (ratio > 1.0 + clip)).float().mean()
        kl = (torch.expm1(log_ratio.clamp(max=30.0)) - log_ratio).mean()
    return loss, {"clip_fraction": clipped, "kl": kl}


def _mlp(n_in: int, n_out: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, n_out))


def _gae(rewards, values, done, valid, gamma, lam):
    """GAE over padded episodes: values ``[n, H]``; the value after a terminal step is 0."""
    n, H = rewards.shape
    adv = torch.zeros(n, H)
    last = torch.zeros(n)
    next_v = torch.zeros(n)
    for t in reversed(range(H)):
        cont = (~done[:, t]).float()
        delta = rewards[:, t] + gamma * cont * next_v - values[:, t]
        last = delta + gamma * lam * cont * last
        last = torch.where(valid[:, t], last, torch.zeros_like(last))
        adv[:, t] = last
        next_v = values[:, t]
    return adv, adv + values


def train_constrained(env: HazardGrid, budget: float | None = None, *, penalty: float = 0.0, multiplier: str = "dual",
                      cfg: PS4Config | None = None, seed: int = 0) -> dict:
    """Lagrangian PPO on ``env``: ``budget=None`` trains on ``r - penalty * c`` (0: unconstrained), a budget
    makes ``nu`` follow projected dual ascent (``multiplier="dual"``) or the PID rule (``"pid"``).

    Each iteration: sample ``cfg.episodes`` episodes; update nu with their mean cost (before the
    advantages, so this batch already uses it); GAE of the reward and of the cost from the critic's two
    heads; the Lagrangian advantage, whitened over the batch; ``cfg.epochs`` full-batch PPO-clip steps on
    the policy and regression steps on both heads. Returns the policy and one entry per iteration of the
    batch's mean return and cost, nu, and the last epoch's KL and clip fraction."""
    cfg = cfg or PS4Config()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    policy = _mlp(env.n_states, env.n_actions, cfg.hidden)
    critic = _mlp(env.n_states, 2, cfg.hidden)
    opt_pi = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    opt_v = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    pid = PIDMultiplier(budget, cfg.kp, cfg.ki, cfg.kd, cfg.nu_init) if budget is not None and multiplier == "pid" \
        else None
    nu = float(penalty) if budget is None else cfg.nu_init
    hist = {k: [] for k in ("return", "cost", "nu", "kl", "clip_fraction")}
    for _ in range(cfg.iterations):
        batch = rollout(env, policy, cfg.episodes, gen)
        cost = float(batch["ep_cost"].mean())
        if budget is not None:
            nu = pid.update(cost) if pid is not None else dual_ascent_step(nu, cost, budget, cfg.nu_lr)
        valid, done = batch["valid"], batch["done"]
        with torch.no_grad():
            v = critic(batch["obs"])
        a_r, ret_r = _gae(batch["rewards"], v[..., 0], done, valid, cfg.gamma, cfg.gae_lambda)
        a_c, ret_c = _gae(batch["costs"], v[..., 1], done, valid, cfg.gamma, cfg.gae_lambda)
        adv = lagrangian_advantage(a_r, a_c, nu)[valid]                  # the real steps only, flattened
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        obs, actions, logp_old = batch["obs"][valid], batch["actions"][valid], batch["logp"][valid]
        ret_r, ret_c = ret_r[valid], ret_c[valid]
        for _ in range(cfg.epochs):
            logp_all = torch.log_softmax(policy(obs), -1)
            logp = logp_all.gather(-1, actions[:, None]).squeeze(-1)
            loss, stats = ppo_clip_loss(logp, logp_old, adv, cfg.clip)
            if cfg.entropy > 0:
                loss = loss - cfg.entropy * (-(logp_all.exp() * logp_all).sum(-1)).mean()
            opt_pi.zero_grad()
            loss.backward()
            opt_pi.step()
            v = critic(obs)
            v_loss = ((v[:, 0] - ret_r) ** 2).mean() + ((v[:, 1] - ret_c) ** 2).mean()
            opt_v.zero_grad()
            v_loss.backward()
            opt_v.step()
        for k, x in (("return", float(batch["ep_return"].mean())), ("cost", cost), ("nu", nu),
                     ("kl", float(stats["kl"])), ("clip_fraction", float(stats["clip_fraction"]))):
            hist[k].append(x)
    return {"policy": policy, **hist}


def reference_namespace() -> dict:
    """The reference answers, as the grader would load a student's answer cells."""
    return {"lagrangian_advantage": lagrangian_advantage, "dual_ascent_step": dual_ascent_step,
            "PIDMultiplier": PIDMultiplier, "ppo_clip_loss": ppo_clip_loss, "train_constrained": train_constrained}


# ------------------------------------------------------------------------------------------ hidden tests
# Fresh seeds and inputs the skeleton never shows. Independent computations: rlkit's own implementations
# (rlkit.safety, rlkit.objectives), which the student is told not to call.

def _g(seed):
    return torch.Generator().manual_seed(seed)


def h_adv_fresh(ns):
    f = ns["lagrangian_advantage"]
    g = _g(9101)
    for shape, nu in (((3, 11), 0.37), ((64,), 4.2), ((2, 3, 5), 13.0)):
        a_r = torch.randn(*shape, generator=g, dtype=torch.float64)
        a_c = torch.randn(*shape, generator=g, dtype=torch.float64)
        got = f(a_r, a_c, nu)
        want = (a_r - nu * a_c) / (1 + nu)
        assert torch.is_tensor(got) and got.shape == want.shape, \
            f"shape {tuple(shape)}: got {getattr(got, 'shape', got)}"
        assert torch.allclose(got.double(), want, atol=1e-6), f"nu={nu}, shape {shape}: wrong values"


def h_dual_fresh(ns):
    step = ns["dual_ascent_step"]
    g = _g(9102)
    costs = (torch.rand(40, generator=g) * 4).tolist()
    nu, ref = 0.3, 0.3
    for c in costs:
        nu = step(nu, c, 1.7, 0.23, nu_max=2.5)
        ref = min(2.5, max(0.0, ref + 0.23 * (c - 1.7)))
        assert 0.0 <= nu <= 2.5 and math.isclose(nu, ref, abs_tol=1e-9), f"after cost {c:.3f}: nu {nu} vs {ref}"


def h_pid_fresh(ns):
    from rlkit.safety import PIDLagrangian
    g = _g(9103)
    costs = (torch.rand(60, generator=g) * 3).tolist()
    for kp, ki, kd, init in ((0.7, 0.2, 0.5, 0.4), (2.0, 0.05, 0.0, 0.0), (0.0, 0.3, 1.5, 1.2)):
        mine = ns["PIDMultiplier"](1.1, kp=kp, ki=ki, kd=kd, init=init)
        ref = PIDLagrangian(1.1, kp=kp, ki=ki, kd=kd, init=init)
        for k, c in enumerate(costs):
            a, b = float(mine.update(c)), float(ref.update(c))
            assert math.isclose(a, b, abs_tol=1e-8), f"kp={kp}, ki={ki}, kd={kd}, init={init}: update {k}: {a} vs {b}"


def h_ppo_fresh(ns):
    from rlkit.objectives import ppo_clip_loss as ref_loss
    g = _g(9104)
    lo = -torch.rand(6, 13, generator=g, dtype=torch.float64) * 2 - 0.05
    ln = (lo + 0.4 * torch.randn(6, 13, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(6, 13, generator=g, dtype=torch.float64)
    mask = torch.rand(6, 13, generator=g) > 0.3
    loss, stats = ns["ppo_clip_loss"](ln, lo, adv, 0.15, mask=mask)
    want, ref_stats = ref_loss(ln, lo, adv, 0.15, mask=mask)
    assert math.isclose(float(loss.detach()), float(want.detach()), abs_tol=1e-6), \
        f"loss {float(loss.detach()):.6f} vs {float(want.detach()):.6f}"
    (g1,) = torch.autograd.grad(loss, ln)
    (g2,) = torch.autograd.grad(want, ln)
    assert torch.allclose(g1, g2, atol=1e-8), "the gradient differs from PPO-clip's"
    assert math.isclose(float(stats["kl"]), float(ref_stats["approx_kl"]), abs_tol=1e-6), "kl is not the k3 estimate"
    ratio = torch.exp(ln.detach() - lo)[mask]
    outside = float(((ratio < 0.85) | (ratio > 1.15)).double().mean())
    assert math.isclose(float(stats["clip_fraction"]), outside, abs_tol=1e-6), \
        (f"clip_fraction {float(stats['clip_fraction']):.4f}, but {outside:.4f} of the real steps have a ratio "
         "outside [0.85, 1.15]")


#: The learning test: budget, seeds, tolerance. The constrained run's cost is the mean batch cost of the last
#: quarter of training (the average of the last iterates, which is what a Lagrangian method controls);
#: it must be at most BUDGET + TOL, while the unconstrained run on the same seed must exceed BUDGET + TOL and
#: have learned the short route (exact return of its last policy > 4).
LEARN_BUDGET, LEARN_SEEDS, LEARN_TOL = 1.5, (7001, 7002, 7003), 0.75


def h_learning(ns):
    train = ns["train_constrained"]
    env = HazardGrid()
    passed, notes = 0, []
    for seed in LEARN_SEEDS:
        con = train(env, LEARN_BUDGET, multiplier="pid", seed=seed)
        free = train(env, None, seed=seed)
        q = max(1, len(con["cost"]) // 4)
        c_con = sum(float(x) for x in con["cost"][-q:]) / q
        c_free = sum(float(x) for x in free["cost"][-q:]) / q
        r_free, _ = exact_values(env, free["policy"])
        ok = c_con <= LEARN_BUDGET + LEARN_TOL and c_free > LEARN_BUDGET + LEARN_TOL and r_free > 4.0
        passed += ok
        notes.append(f"seed {seed}: constrained cost {c_con:.2f}, unconstrained {c_free:.2f} (return {r_free:.2f})")
    assert passed, (f"no seed met the budget {LEARN_BUDGET} + {LEARN_TOL} with the unconstrained run above it: "
                    + "; ".join(notes))
    return passed / len(LEARN_SEEDS)


HIDDEN: tuple[Test, ...] = (
    Test("hidden_adv_fresh", "lagrangian_advantage", 1, h_adv_fresh),
    Test("hidden_dual_fresh", "dual_ascent_step", 1, h_dual_fresh),
    Test("hidden_pid_matches_stooke", "PIDMultiplier", 2, h_pid_fresh),
    Test("hidden_ppo_fresh", "ppo_clip_loss", 2, h_ppo_fresh),
    Test("hidden_learning_meets_budget", "train_constrained", 9, h_learning, timeout=300),
)
