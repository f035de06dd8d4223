r"""Problem set 4: Lagrangian PPO against a cost budget (chapters 2, 4, 13 and 18).

The student's side: the task (:class:`HazardGrid`, a gridworld whose short route crosses a hazard),
the helpers the skeleton gives (:func:`rollout`, :func:`exact_values`), the configuration
(:class:`PS4Config`) and the visible tests. The reference solution and the hidden tests are in
``rlkit/exercises/solutions/ps4.py`` (instructor side); the rubric in ``book/instructor/ps4_rubric.md``.

The task. A 3 x 6 grid; the agent starts at the bottom-left corner and the episode ends (terminates) when
it reaches the bottom-right corner or after ``horizon`` moves (25). Each move earns -1 and reaching the goal
+10 more. The four cells between start and goal on the bottom row are hazards: every move that ends in
one costs 1. The short route (5 moves along the bottom row) earns 5 and costs 4; the safe route (up,
5 right, down: 7 moves) earns 3 and costs 0. The constraint is on the expected episode cost,
:math:`J_C(\pi) = \mathbb E_\pi[\sum_t c_t] \le C_{\max}`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from rlkit import _validate as V
from rlkit.exercises.problem_sets import ProblemSet, Test, register_problem_set

__all__ = ["HazardGrid", "PS4Config", "rollout", "exact_values", "PS4", "VISIBLE"]

ACTIONS = ("up", "right", "down", "left")
_MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))


class HazardGrid:
    """A batched gridworld with a per-step cost (all episodes in one tensor, no Python loop over them).

    Observation: the one-hot code of the agent's cell, ``[n, rows * cols]`` float32. Actions: 0 up,
    1 right, 2 down, 3 left (a move into the wall leaves the agent where it is). Reward: ``step_reward``
    per move, plus ``goal_reward`` on the move that reaches the goal. Cost: 1 for a move that ends in a
    hazard cell (staying in one costs again). The episode terminates at the goal or after ``horizon``
    moves (the deadline is part of the task, not a truncation).

    Args:
        rows, cols: the grid's size (start at the bottom-left corner, goal at the bottom-right).
        hazards: the hazard cells ``(row, col)``; default: the bottom row between start and goal.
        horizon: the deadline, in moves. step_reward, goal_reward: as above.
    """

    def __init__(self, rows: int = 3, cols: int = 6, hazards=None, horizon: int = 25,
                 step_reward: float = -1.0, goal_reward: float = 10.0):
        self.rows = V.int_in(rows, "rows", 2)
        self.cols = V.int_in(cols, "cols", 3)
        self.horizon = V.int_in(horizon, "horizon", 1)
        self.step_reward = V.real_in(step_reward, "step_reward")
        self.goal_reward = V.real_in(goal_reward, "goal_reward")
        if hazards is None:
            hazards = [(rows - 1, c) for c in range(1, cols - 1)]
        self.hazards = tuple((int(r), int(c)) for r, c in hazards)
        self.start = (rows - 1, 0)
        self.goal = (rows - 1, cols - 1)
        for r, c in self.hazards:
            if not (0 <= r < rows and 0 <= c < cols) or (r, c) in (self.start, self.goal):
                raise ValueError(f"hazards: cell {(r, c)} is off the grid or is the start or the goal")
        self.n_states = rows * cols
        self.n_actions = 4
        nxt = torch.zeros(self.n_states, 4, dtype=torch.long)
        for s in range(self.n_states):
            r, c = divmod(s, cols)
            for a, (dr, dc) in enumerate(_MOVES):
                r2, c2 = min(max(r + dr, 0), rows - 1), min(max(c + dc, 0), cols - 1)
                nxt[s, a] = r2 * cols + c2
        self.next_state = nxt                                             # [S, A]
        self.hazard = torch.zeros(self.n_states, dtype=torch.bool)
        for r, c in self.hazards:
            self.hazard[r * cols + c] = True
        self.start_state = self.start[0] * cols + self.start[1]
        self.goal_state = self.goal[0] * cols + self.goal[1]

    def __repr__(self) -> str:
        return (f"HazardGrid(rows={self.rows}, cols={self.cols}, hazards={self.hazards}, horizon={self.horizon}, "
                f"step_reward={self.step_reward}, goal_reward={self.goal_reward})")

    def observe(self, states: torch.Tensor) -> torch.Tensor:
        """One-hot observations ``[..., n_states]`` (float32) of integer states."""
        return torch.nn.functional.one_hot(states, self.n_states).float()

    def transition(self, states: torch.Tensor, actions: torch.Tensor):
        """``(next_states, rewards, costs, at_goal)`` for batched integer states and actions (no time limit)."""
        nxt = self.next_state[states, actions]
        at_goal = nxt == self.goal_state
        reward = torch.full(nxt.shape, self.step_reward) + self.goal_reward * at_goal.float()
        cost = self.hazard[nxt].float()
        return nxt, reward, cost, at_goal


def rollout(env: HazardGrid, policy, n_episodes: int, generator: torch.Generator) -> dict:
    """Sample ``n_episodes`` episodes with ``policy`` (observations ``[n, S]`` -> logits ``[n, 4]``).

    Returns a dict of ``[n, horizon]`` tensors, padded after each episode's end: ``obs`` (``[n, horizon, S]``),
    ``actions`` (long), ``logp`` (the sampling policy's log-probabilities, detached), ``rewards``, ``costs``,
    ``valid`` (bool: the step happened), ``done`` (bool: the episode terminated at this step), and
    ``ep_return``, ``ep_cost`` (``[n]``, undiscounted sums over each episode).
    """
    n = V.int_in(n_episodes, "n_episodes", 1)
    H, S = env.horizon, env.n_states
    states = torch.full((n,), env.start_state, dtype=torch.long)
    alive = torch.ones(n, dtype=torch.bool)
    out = {"obs": torch.zeros(n, H, S), "actions": torch.zeros(n, H, dtype=torch.long), "logp": torch.zeros(n, H),
           "rewards": torch.zeros(n, H), "costs": torch.zeros(n, H), "valid": torch.zeros(n, H, dtype=torch.bool),
           "done": torch.zeros(n, H, dtype=torch.bool)}
    with torch.no_grad():
        for t in range(H):
            obs = env.observe(states)
            logp_all = torch.log_softmax(policy(obs), dim=-1)
            actions = torch.multinomial(logp_all.exp(), 1, generator=generator).squeeze(-1)
            nxt, r, c, at_goal = env.transition(states, actions)
            done = at_goal | (t == H - 1)
            out["obs"][:, t] = obs
            out["actions"][:, t] = actions
            out["logp"][:, t] = logp_all.gather(-1, actions[:, None]).squeeze(-1)
            out["rewards"][:, t] = torch.where(alive, r, torch.zeros_like(r))
            out["costs"][:, t] = torch.where(alive, c, torch.zeros_like(c))
            out["valid"][:, t] = alive
            out["done"][:, t] = alive & done
            states = torch.where(alive, nxt, states)
            alive = alive & ~done
            if not bool(alive.any()):
                break
    out["ep_return"] = out["rewards"].sum(-1)
    out["ep_cost"] = out["costs"].sum(-1)
    return out


@torch.no_grad()
def exact_values(env: HazardGrid, policy) -> tuple[float, float]:
    r"""The policy's exact expected episode return :math:`J_R` and cost :math:`J_C` (no sampling).

    Backward induction over the deadline: with :math:`\pi(a\mid s)` from ``policy(env.observe(all states))``,
    :math:`V_t(s) = \sum_a \pi(a\mid s)\,[x(s, a) + \mathbf 1[s' \ne \text{goal}]\,V_{t+1}(s')]`,
    :math:`V_H = 0`, for :math:`x` the reward and then the cost; returns
    :math:`(V_0(\text{start}))` for both, as floats (float64 arithmetic).
    """
    S = env.n_states
    probs = torch.softmax(policy(env.observe(torch.arange(S))).double(), dim=-1)      # [S, A]
    nxt = env.next_state
    to_goal = nxt == env.goal_state
    r = env.step_reward + env.goal_reward * to_goal.double()
    c = env.hazard[nxt].double()
    vr = torch.zeros(S, dtype=torch.float64)
    vc = torch.zeros(S, dtype=torch.float64)
    for _ in range(env.horizon):
        cont = (~to_goal).double()
        vr = (probs * (r + cont * vr[nxt])).sum(-1)
        vc = (probs * (c + cont * vc[nxt])).sum(-1)
    return float(vr[env.start_state]), float(vc[env.start_state])


@dataclass(frozen=True)
class PS4Config:
    """The settings of ``train_constrained`` (the student's trainer); every run of the problem set uses these.

    ``iterations`` PPO iterations of ``episodes`` episodes each; ``epochs`` full-batch PPO epochs per
    iteration with clip radius ``clip``; Adam with ``lr`` on the policy and ``critic_lr`` on the critic
    (two outputs: reward value and cost value); GAE with ``gamma`` and ``gae_lambda``; a policy and a
    critic with one hidden layer of ``hidden`` tanh units. The multiplier: projected dual ascent with
    ``nu_lr`` (``multiplier="dual"``) or the PID rule with gains ``kp, ki, kd`` (``multiplier="pid"``),
    both from ``nu_init``.
    """
    iterations: int = 60
    episodes: int = 64
    epochs: int = 4
    clip: float = 0.2
    lr: float = 0.005
    critic_lr: float = 0.01
    gamma: float = 1.0
    gae_lambda: float = 0.95
    hidden: int = 32
    entropy: float = 0.0
    nu_lr: float = 0.1
    nu_init: float = 0.0
    kp: float = 1.0
    ki: float = 0.1
    kd: float = 0.0

    def replace(self, **kw) -> PS4Config:
        return replace(self, **kw)


# ------------------------------------------------------------------------------------------ visible tests
# Each test gets the namespace of the student's answers; AssertionError messages say what is wrong.

def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _close(a, b, tol=1e-5):
    return (torch.is_tensor(a) and a.shape == b.shape
            and bool(torch.allclose(a.detach().double(), b.double(), atol=tol, rtol=tol)))


def t_adv_formula(ns):
    f = ns["lagrangian_advantage"]
    a_r = torch.tensor([1.0, -2.0, 0.5, 3.0])
    a_c = torch.tensor([0.0, 1.0, -1.0, 2.0])
    got = f(a_r, a_c, 1.0)
    want = torch.tensor([0.5, -1.5, 0.75, 0.5])                 # (A_R - 1 * A_C) / (1 + 1), by hand
    assert torch.is_tensor(got), f"expected a tensor, got {type(got).__name__}"
    if _close(got, a_r - a_c):
        raise AssertionError("got A_R - nu * A_C without the normalisation: divide by 1 + nu (chapter 18, eq-ch18-adv)")
    if _close(got, a_r + a_c) or _close(got, (a_r + a_c) / 2):
        raise AssertionError("the cost advantage is added: the Lagrangian reward is r - nu * c, so subtract nu * A_C")
    assert _close(got, want), f"A_R={a_r.tolist()}, A_C={a_c.tolist()}, nu=1: expected {want.tolist()}, got {got}"


def t_adv_limits(ns):
    f = ns["lagrangian_advantage"]
    g = _gen(1)
    a_r, a_c = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    assert _close(f(a_r, a_c, 0.0), a_r), "with nu = 0 the advantage must be A_R unchanged"
    big = f(a_r, a_c, 1e6)
    assert _close(big, -a_c, tol=1e-4), ("as nu grows the normalised advantage must tend to -A_C (bounded); "
                                         f"got values of size {float(big.abs().max()):.3g}")
    assert not big.requires_grad and f(a_r, a_c, 2.0).shape == a_r.shape, "keep the input's shape"


def t_adv_linearity(ns):
    """GAE is linear in the reward: the combination equals the GAE of r - nu c with values V_R - nu V_C, over 1 + nu."""
    from rlkit.returns import gae
    f = ns["lagrangian_advantage"]
    g = _gen(2)
    r, c = torch.randn(4, 9, generator=g), torch.rand(4, 9, generator=g).round()
    vr, vc = torch.randn(4, 10, generator=g), torch.rand(4, 10, generator=g)
    disc = torch.ones(4, 9)
    disc[:, -1] = 0.0
    nu = 0.7
    a_r, _ = gae(r, vr[:, :-1], vr[:, 1:], disc, 0.9)
    a_c, _ = gae(c, vc[:, :-1], vc[:, 1:], disc, 0.9)
    a_l, _ = gae(r - nu * c, vr[:, :-1] - nu * vc[:, :-1], vr[:, 1:] - nu * vc[:, 1:], disc, 0.9)
    assert _close(f(a_r, a_c, nu), a_l / (1 + nu), tol=1e-4), \
        "the result is not the GAE advantage of the Lagrangian reward r - nu*c divided by 1 + nu"


def t_dual_direction(ns):
    step = ns["dual_ascent_step"]
    up = step(1.0, cost=2.0, budget=1.5, lr=0.1)
    assert isinstance(up, float), f"return the new multiplier as a Python float, got {type(up).__name__}"
    if math.isclose(up, 0.95, abs_tol=1e-9):
        raise AssertionError("the step has the wrong sign: over budget (cost 2 > budget 1.5) nu must grow, "
                             "nu + lr * (cost - budget)")
    assert math.isclose(up, 1.05, abs_tol=1e-9), f"nu=1, cost=2, budget=1.5, lr=0.1: expected 1.05, got {up}"
    down = step(1.0, cost=1.0, budget=1.5, lr=0.1)
    assert math.isclose(down, 0.95, abs_tol=1e-9), f"under budget nu must shrink: expected 0.95, got {down}"
    big = step(1.0, cost=11.5, budget=1.5, lr=0.1)
    assert math.isclose(big, 2.0, abs_tol=1e-9), (
        f"the step must be proportional to the violation (10 -> +1.0), got {big - 1.0:+.4g}; "
        "a fixed-size step is Adam's trap (chapter 18)")


def t_dual_projection(ns):
    step = ns["dual_ascent_step"]
    got = step(0.02, cost=0.0, budget=1.0, lr=0.1)
    assert got >= 0.0, f"nu went negative ({got:.3g}): the projection onto nu >= 0 is missing"
    assert got == 0.0, f"nu=0.02, cost 0, budget 1, lr 0.1: the projection gives exactly 0, got {got}"
    capped = step(4.9, cost=3.0, budget=1.0, lr=0.1, nu_max=5.0)
    assert math.isclose(capped, 5.0), f"with nu_max=5 the step from 4.9 by +0.2 must stop at 5, got {capped}"
    free = step(4.9, cost=3.0, budget=1.0, lr=0.1)
    assert math.isclose(free, 5.1), f"without nu_max there is no upper bound: expected 5.1, got {free}"


def _pid_seq(cls, costs, **kw):
    m = cls(**kw)
    return [float(m.update(c)) for c in costs], m


def t_pid_integral(ns):
    costs = [2.0, 1.5, 0.2, 0.4, 1.1, 3.0, 0.0, 0.0, 0.0]
    got, m = _pid_seq(ns["PIDMultiplier"], costs, budget=1.0, kp=0.0, ki=0.3, kd=0.0)
    nu, want = 0.0, []
    for c in costs:
        nu = max(0.0, nu + 0.3 * (c - 1.0))
        want.append(nu)
    assert min(got) >= 0.0, f"nu went negative ({min(got):.3g}): the integral or the output is not projected onto >= 0"
    assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(got, want)), \
        f"with kp = kd = 0 the PID rule is projected dual ascent with lr = ki: expected {want}, got {got}"
    assert math.isclose(float(m.value), got[-1]), "the attribute value must hold the last multiplier"


def t_pid_proportional(ns):
    costs = [3.0, 3.0, 0.5]
    got, _ = _pid_seq(ns["PIDMultiplier"], costs, budget=1.0, kp=2.0, ki=0.5, kd=0.0)
    # I = 2, 4, 3.5; nu = 2*Delta + 0.5*I = 4+1, 4+2, -1+1.75
    want = [5.0, 6.0, 0.75]
    assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(got, want)), \
        (f"costs {costs}, budget 1, kp=2, ki=0.5: expected nu {want}, got {got} (nu_k = [kp*Delta_k + ki*I_k + "
         "kd*(J_k - J_(k-1))_+]_+ with I_k = [I_(k-1) + Delta_k]_+)")


def t_pid_derivative(ns):
    costs = [1.0, 2.0, 1.5]
    got, _ = _pid_seq(ns["PIDMultiplier"], costs, budget=1.0, kp=0.0, ki=1.0, kd=2.0)
    want = [0.0, 1.0 + 2.0, 1.5 + 0.0]            # the derivative term only pushes while the cost rises
    assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(got, want)), \
        f"costs {costs}, budget 1, ki=1, kd=2: expected {want}, got {got} (the derivative term is kd*(J_k - J_(k-1))_+)"


def t_ppo_values(ns):
    f = ns["ppo_clip_loss"]
    logp_old = torch.log(torch.tensor([0.5, 0.5, 0.2, 0.4]))
    logp_new = torch.log(torch.tensor([0.75, 0.3, 0.3, 0.4])).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0, 2.0])
    out = f(logp_new, logp_old, adv, 0.2)
    assert isinstance(out, tuple) and len(out) == 2, "return (loss, stats)"
    loss, stats = out
    assert torch.is_tensor(loss) and loss.dim() == 0, "the loss must be a 0-dim tensor (a mean over the steps)"
    # ratios 1.5, 0.6, 1.5, 1.0; terms min(rA, clip(r)A): 1.2, 0.6, -1.5, 2.0 -> loss -2.3/4; 3 ratios outside
    want = -(1.2 + 0.6 - 1.5 + 2.0) / 4
    if math.isclose(float(loss.detach()), -want, abs_tol=1e-5):
        raise AssertionError("the sign is flipped: return the loss to MINIMISE, minus the clipped surrogate")
    if math.isclose(float(loss.detach()), -(1.2 + 0.8 - 1.5 + 2.0) / 4, abs_tol=1e-5):
        raise AssertionError("the clip takes a max where PPO takes the min of the two surrogates (pessimistic bound)")
    assert math.isclose(float(loss.detach()), want, abs_tol=1e-5), \
        f"expected loss {want:.5f}, got {float(loss.detach()):.5f}"
    loss.backward()
    g = logp_new.grad
    assert g is not None and abs(float(g[0])) < 1e-8 and abs(float(g[3]) + 0.5) < 1e-5, \
        "gradient: 0 where the clip binds (first sample), -r*A/N elsewhere (last: -0.5)"
    assert {"clip_fraction", "kl"} <= set(stats), f"stats must hold 'clip_fraction' and 'kl', got {sorted(stats)}"
    assert math.isclose(float(stats["clip_fraction"]), 0.75, abs_tol=1e-6), \
        f"clip_fraction: 3 of the 4 ratios lie outside [0.8, 1.2]; expected 0.75, got {float(stats['clip_fraction'])}"


def t_ppo_kl(ns):
    f = ns["ppo_clip_loss"]
    g = _gen(3)
    logits_old = torch.randn(2000, 4, generator=g)
    logits_new = logits_old + 0.3 * torch.randn(2000, 4, generator=g)
    a = torch.multinomial(torch.softmax(logits_old, -1), 1, generator=g).squeeze(-1)
    lo = torch.log_softmax(logits_old, -1).gather(-1, a[:, None]).squeeze(-1)
    ln = torch.log_softmax(logits_new, -1).gather(-1, a[:, None]).squeeze(-1)
    _, stats = f(ln, lo, torch.randn(2000, generator=g), 0.2)
    kl = float(stats["kl"])
    exact = float((torch.softmax(logits_old, -1) * (torch.log_softmax(logits_old, -1)
                                                    - torch.log_softmax(logits_new, -1))).sum(-1).mean())
    assert kl >= 0.0, f"kl = {kl:.4g} < 0: use the k3 estimator (r - 1) - log r, which is never negative"
    assert abs(kl - exact) < 0.25 * exact, (f"kl = {kl:.4g} but KL(pi_old || pi_new) = {exact:.4g} on these samples: "
                                            "the k3 estimate of chapter 4 is mean((r - 1) - log r), r = pi_new/pi_old")
    _, s0 = f(lo.clone(), lo, torch.randn(2000, generator=g), 0.2)
    assert abs(float(s0["kl"])) < 1e-7 and float(s0["clip_fraction"]) == 0.0, \
        "identical policies: kl 0, nothing clipped"


def t_ppo_mask(ns):
    f = ns["ppo_clip_loss"]
    g = _gen(4)
    lo = -torch.rand(3, 5, generator=g) - 0.1
    ln = lo + 0.5 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.4
    ln_pad, adv_pad = ln.clone(), adv.clone()
    ln_pad[~mask] = 50.0                                   # padding: huge log-ratios, must not matter
    adv_pad[~mask] = float("nan")
    l1, s1 = f(ln[mask], lo[mask], adv[mask], 0.2)
    l2, s2 = f(ln_pad, lo, adv_pad, 0.2, mask=mask)
    assert torch.isfinite(l2), "padding leaked into the loss (NaN or inf): select with the mask before any arithmetic"
    assert math.isclose(float(l1.detach()), float(l2.detach()), abs_tol=1e-5), \
        (f"with mask the loss must be the mean over the valid steps only: {float(l2.detach()):.5f} "
         f"vs {float(l1.detach()):.5f}")
    assert math.isclose(float(s1["clip_fraction"]), float(s2["clip_fraction"]), abs_tol=1e-6), \
        "clip_fraction must be over the valid steps only"


_HISTORY_KEYS = ("return", "cost", "nu", "kl", "clip_fraction")


def _history_ok(out, cfg, label):
    assert isinstance(out, dict), f"{label}: train_constrained must return a dict, got {type(out).__name__}"
    missing = [k for k in ("policy",) + _HISTORY_KEYS if k not in out]
    assert not missing, f"{label}: the result lacks {missing}"
    for k in _HISTORY_KEYS:
        assert len(out[k]) == cfg.iterations, \
            f"{label}: history {k!r} has {len(out[k])} entries, expected one per iteration ({cfg.iterations})"
        assert all(math.isfinite(float(v)) for v in out[k]), f"{label}: history {k!r} holds NaN or inf"


def t_train_shapes(ns):
    cfg = PS4Config(iterations=6, episodes=16)
    out = ns["train_constrained"](HazardGrid(), budget=1.0, cfg=cfg, seed=0)
    _history_ok(out, cfg, "budget 1.0")
    nus = [float(v) for v in out["nu"]]
    assert min(nus) >= 0.0, f"nu went negative ({min(nus):.3g}): the projection onto nu >= 0 is missing"
    assert float(out["nu"][0]) > 0.0, ("the first multiplier is 0 although the first batch is far over budget: update "
                                       "nu with the batch's cost before computing its advantages (chapter 18)")
    free = ns["train_constrained"](HazardGrid(), budget=None, cfg=cfg, seed=0)
    _history_ok(free, cfg, "budget None")
    assert all(float(v) == 0.0 for v in free["nu"]), "budget=None, penalty=0 is unconstrained: nu must stay 0"
    pen = ns["train_constrained"](HazardGrid(), budget=None, penalty=0.8, cfg=cfg, seed=0)
    assert all(math.isclose(float(v), 0.8) for v in pen["nu"]), "a fixed penalty keeps nu at the penalty"


def t_train_seeded(ns):
    cfg = PS4Config(iterations=3, episodes=16)
    a = ns["train_constrained"](HazardGrid(), budget=1.0, cfg=cfg, seed=5)
    b = ns["train_constrained"](HazardGrid(), budget=1.0, cfg=cfg, seed=5)
    assert [float(x) for x in a["cost"]] == [float(x) for x in b["cost"]], \
        "two runs with the same seed differ: seed torch (the network's initialisation) and the sampler from seed"


def t_train_learns(ns):
    """One seed, 40 iterations: the unconstrained run takes the short route; the constrained one cuts the cost."""
    env = HazardGrid()
    cfg = PS4Config(iterations=40)
    free = ns["train_constrained"](env, budget=None, cfg=cfg, seed=0)
    r_free, c_free = exact_values(env, free["policy"])
    assert r_free > 3.0, f"unconstrained, the exact return after 40 iterations is {r_free:.2f}, expected > 3 (max 5)"
    con = ns["train_constrained"](env, budget=1.0, cfg=cfg, seed=0)
    r_con, c_con = exact_values(env, con["policy"])
    credit = 0.5 * (c_free > 3.0) + 0.5 * (c_con < 2.0)
    assert credit > 0, (f"unconstrained cost {c_free:.2f} (expected > 3) and constrained (budget 1) cost {c_con:.2f} "
                        "(expected < 2)")
    return credit


#: The visible tests of problem set 4, each with its name, task, points and test function; the
#: hidden tests stay with the instructor.
VISIBLE = (
    Test("adv_formula", "lagrangian_advantage", 4, t_adv_formula),
    Test("adv_limits", "lagrangian_advantage", 3, t_adv_limits),
    Test("adv_is_gae_of_lagrangian_reward", "lagrangian_advantage", 3, t_adv_linearity),
    Test("dual_direction_and_size", "dual_ascent_step", 5, t_dual_direction),
    Test("dual_projection", "dual_ascent_step", 5, t_dual_projection),
    Test("pid_integral_is_dual_ascent", "PIDMultiplier", 4, t_pid_integral),
    Test("pid_proportional", "PIDMultiplier", 3, t_pid_proportional),
    Test("pid_derivative", "PIDMultiplier", 3, t_pid_derivative),
    Test("ppo_loss_values_and_gradient", "ppo_clip_loss", 4, t_ppo_values),
    Test("ppo_kl_monitor", "ppo_clip_loss", 3, t_ppo_kl),
    Test("ppo_mask", "ppo_clip_loss", 3, t_ppo_mask),
    Test("train_history", "train_constrained", 6, t_train_shapes, timeout=120),
    Test("train_seeded", "train_constrained", 4, t_train_seeded, timeout=60),
    Test("train_learns", "train_constrained", 10, t_train_learns, timeout=300),
)

#: Problem set 4 (Lagrangian PPO against a cost budget), with its tasks, visible tests and points,
#: registered under ``"ps4"``.
PS4 = register_problem_set(ProblemSet(
    key="ps4",
    title="Lagrangian PPO against a cost budget",
    chapters=(2, 4, 13, 18),
    notebook="lessons/problem_sets/ps4_lagrangian_ppo.ipynb",
    tasks=("lagrangian_advantage", "dual_ascent_step", "PIDMultiplier", "ppo_clip_loss", "train_constrained"),
    visible=VISIBLE,
    written_points=25.0,
))
