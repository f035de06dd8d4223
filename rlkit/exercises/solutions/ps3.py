"""Problem set 3, instructor's side: a stale-sampler study (chapters 8, 11, 12, 13).

The reference solution (one function per task, written as a student would), :func:`reference_namespace`,
and the hidden tests ``HIDDEN`` (other shapes, masks over NaN, log-ratios of +-80, zero-probability
actions, a learning test and a staleness test on fresh seeds). The visible tests are in
:mod:`rlkit.exercises.problem_sets.ps3`; the rubric of the written part in ``book/instructor/ps3_rubric.md``.
"""
from __future__ import annotations

import torch
from torch import nn

from rlkit.exercises.problem_sets import Test
from rlkit.exercises.problem_sets.ps3 import LEARN_RETURN, LEARN_STEPS, assert_close, driver_run

__all__: list[str] = []   # instructor data (the reference and the hidden tests), not library API


# ------------------------------------------------------------------------------------------------
# The reference solution (the answer cells' contents)
# ------------------------------------------------------------------------------------------------

def mean_tv(logits_a, logits_b):
    """Exact mean total-variation distance between two categorical policies over a batch of states.

    logits_a, logits_b: [..., A] (the last dimension the actions; -inf allowed for an impossible action).
    Returns the 0-dim mean over the states of 1/2 sum_a |pi_a(a|s) - pi_b(a|s)|.
    """
    p, q = torch.softmax(logits_a.double(), -1), torch.softmax(logits_b.double(), -1)
    return (0.5 * (p - q).abs().sum(-1)).mean().to(logits_a.dtype)


def _half_abs_diff_mean(logp_a, logp_b, logp_behav, mask):
    la = (logp_a - logp_behav).double()
    lb = (logp_b - logp_behav).double()
    hi, lo = torch.maximum(la, lb), torch.minimum(la, lb)
    # |e^la - e^lb| = e^hi (1 - e^(lo - hi)), computed without overflow or cancellation
    d = torch.where(hi == lo, torch.zeros_like(hi), torch.exp(hi) * -torch.expm1(lo - hi))
    m = torch.ones_like(d, dtype=torch.bool) if mask is None else mask.bool()
    d = torch.where(m, d, torch.zeros_like(d))
    return (0.5 * d.sum() / m.sum().clamp(min=1)).to(logp_a.dtype)


def update_shift_estimate(logp_new, logp_prox, logp_behav, mask=None):
    """U_k from samples: 1/2 mean |pi_{k+1}/mu - pi_k/mu| over the (masked) samples, each drawn from its mu.

    All three [...] log-probabilities of the sampled actions; mask optional (masked entries may hold NaN).
    Returns a 0-dim tensor (0 when the mask keeps nothing); no gradient needed.
    """
    with torch.no_grad():
        return _half_abs_diff_mean(logp_new, logp_prox, logp_behav, mask)


def staleness_estimate(logp_prox, logp_behav, mask=None):
    """S_k from samples: 1/2 mean |pi_k/mu - 1| over the (masked) samples."""
    with torch.no_grad():
        return _half_abs_diff_mean(logp_prox, logp_behav, logp_behav, mask)


def decoupled_clip_loss(logp, logp_prox, logp_behav, adv, eps=0.2):
    """Decoupled PPO (chapter 12): -mean( w min(r A, clip(r, 1-eps, 1+eps) A) ), to minimise.

    r = pi_theta / pi_prox (the clip is centred on the proximal policy pi_k), w = pi_prox / mu (detached,
    outside the clip). All arguments one shape; logp carries the gradient.
    """
    w = torch.exp(logp_prox.detach() - logp_behav.detach())
    r = torch.exp(logp - logp_prox.detach())
    a = adv.detach()
    return -(w * torch.minimum(r * a, r.clamp(1 - eps, 1 + eps) * a)).mean()


def _mlp(n_in, n_out, hidden):
    return nn.Sequential(nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, n_out))


def stale_ppo(lag, seed, correction="none", total_steps=12_000, num_envs=8, num_steps=32, epochs=10, lr=2.5e-3,
              clip_eps=0.2, gamma=0.98, lam=0.8, hidden=64):
    """PPO on CartPole-v1 with a sampler held back by ``lag`` versions; returns the per-update history.

    Update k samples num_envs x num_steps steps with version max(0, k - lag) of the actor (mu), computes GAE
    with the current critic, measures S_k (estimate and exact), runs ``epochs`` full-batch Adam steps on the
    clipped loss ("none": PPO-clip of pi_theta / mu; "decoupled": decoupled_clip_loss), measures U_k
    (estimate and exact) and publishes the new actor as version k + 1.
    History keys (one entry per update): "update_shift", "update_shift_tv", "staleness", "staleness_tv",
    "return" (mean undiscounted return of the last 20 finished episodes, NaN before the first).
    """
    import copy

    from rlkit.returns import from_gymnasium, gae
    from rlkit.rollout import RolloutCollector, make_vec_env

    if correction not in ("none", "decoupled"):
        raise ValueError(f"correction must be 'none' or 'decoupled', got {correction!r}")
    torch.manual_seed(seed)
    envs = make_vec_env("CartPole-v1", num_envs)
    envs.action_space.seed(seed)
    collector = RolloutCollector(envs, seed=seed)
    actor, critic = _mlp(4, 2, hidden), _mlp(4, 1, hidden)
    params = list(actor.parameters()) + list(critic.parameters())
    opt = torch.optim.Adam(params, lr=lr, eps=1e-5)
    archive = {0: copy.deepcopy(actor)}                      # version -> actor; version k is the learner's now
    keys = ("update_shift", "update_shift_tv", "staleness", "staleness_tv", "return")
    hist = {k: [] for k in keys}
    n_updates = total_steps // (num_envs * num_steps)

    def value(obs):
        return critic(obs).squeeze(-1)

    for k in range(n_updates):
        opt.param_groups[0]["lr"] = lr * (1 - k / n_updates)
        v_behav = max(0, k - lag)                                # the version that samples update k
        behav = archive[v_behav]

        def act(obs, behav=behav):
            d = torch.distributions.Categorical(logits=behav(obs))
            a = d.sample()
            return a, d.log_prob(a)

        with torch.no_grad():
            b = collector.collect(act, num_steps, value_fn=value)
            discounts, lam_mask = from_gymnasium(b.terminated, b.truncated, gamma)
            adv, ret = gae(b.rewards, b.values, b.next_values, discounts, lam * lam_mask)
            obs, actions, lb = b.obs.reshape(-1, b.obs.shape[-1]), b.actions.reshape(-1), b.logp.reshape(-1)
            adv, ret = adv.reshape(-1), ret.reshape(-1)
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            logits_k = actor(obs)
            lp_k = torch.log_softmax(logits_k, -1).gather(-1, actions[:, None]).squeeze(-1)
            if v_behav == k:
                lp_k = lb                                        # pi_k sampled these itself: rho_k = 1 exactly
            hist["staleness"].append(float(staleness_estimate(lp_k, lb)))
            hist["staleness_tv"].append(float(mean_tv(logits_k, behav(obs))))
        for _ in range(epochs):
            logp = torch.log_softmax(actor(obs), -1).gather(-1, actions[:, None]).squeeze(-1)
            if correction == "decoupled":
                pg = decoupled_clip_loss(logp, lp_k, lb, adv, clip_eps)
            else:
                ratio = torch.exp(logp - lb)
                pg = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv).mean()
            loss = pg + 0.5 * 0.5 * (value(obs) - ret).pow(2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
        with torch.no_grad():
            logits_new = actor(obs)
            lp_new = torch.log_softmax(logits_new, -1).gather(-1, actions[:, None]).squeeze(-1)
            hist["update_shift"].append(float(update_shift_estimate(lp_new, lp_k, lb)))
            hist["update_shift_tv"].append(float(mean_tv(logits_new, logits_k)))
        recent = collector.episodes.returns[-20:]
        hist["return"].append(sum(recent) / len(recent) if recent else float("nan"))
        archive[k + 1] = copy.deepcopy(actor)                    # publish version k + 1
        archive.pop(k + 1 - lag - 1, None)                       # keep the last lag + 1 versions
    envs.close()
    return hist


#: The functions whose source makes each answer cell (a solution notebook, and the tests that fill the skeleton).
ANSWER_CELLS = {"mean_tv": ("mean_tv",), "update_shift_estimate": ("_half_abs_diff_mean", "update_shift_estimate"),
                "staleness_estimate": ("staleness_estimate",), "decoupled_clip_loss": ("decoupled_clip_loss",),
                "stale_ppo": ("_mlp", "stale_ppo")}


def reference_namespace() -> dict:
    """The reference answers, as the grader's namespace of a submission holds them."""
    return {"mean_tv": mean_tv, "update_shift_estimate": update_shift_estimate,
            "staleness_estimate": staleness_estimate, "decoupled_clip_loss": decoupled_clip_loss,
            "stale_ppo": stale_ppo}


# ------------------------------------------------------------------------------------------------
# Hidden tests
# ------------------------------------------------------------------------------------------------

def _h_tv_shapes(ns):
    g = torch.Generator().manual_seed(8080)
    a = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    b = torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    a[0, :, 2] = float("-inf")                                 # an action one policy never takes
    got = ns["mean_tv"](a, b)
    want = mean_tv(a, b)
    assert_close(got, want, "[3, 5, 7] logits with -inf for one action in a third of the states", 1e-9)


def _h_estimates_masked_extreme(ns):
    g = torch.Generator().manual_seed(6161)
    shape = (4, 9)
    lb = -3 * torch.rand(*shape, generator=g)
    lk = lb + torch.randn(*shape, generator=g)
    ln = lk + 0.2 * torch.randn(*shape, generator=g)
    ln[0, 0], lk[1, 1] = lb[0, 0] + 80.0, lb[1, 1] - 80.0        # log-ratios of +-80 (float32)
    mask = torch.rand(*shape, generator=g) > 0.3
    ln2, lk2, lb2 = ln.clone(), lk.clone(), lb.clone()
    ln2[~mask], lk2[~mask], lb2[~mask] = float("nan"), float("inf"), float("nan")
    for i in (0, 1):                                            # the extreme entries are kept
        mask[i, i] = True
        ln2[i, i], lk2[i, i], lb2[i, i] = ln[i, i], lk[i, i], lb[i, i]
    u = ns["update_shift_estimate"](ln2, lk2, lb2, mask)
    s = ns["staleness_estimate"](lk2, lb2, mask)
    for name, got, want in (("U_k", u, update_shift_estimate(ln, lk, lb, mask)),
                            ("S_k", s, staleness_estimate(lk, lb, mask))):
        assert isinstance(got, torch.Tensor) and torch.isfinite(got), \
            f"{name}: {got} with a log-ratio of +-80 and NaN/inf at masked-out entries (expected finite)"
        rel = abs(float(got) - float(want)) / max(1e-12, abs(float(want)))
        assert rel < 1e-4, f"{name}: got {float(got):.6g}, expected {float(want):.6g} (relative error {rel:.1e})"
    empty = torch.zeros(shape, dtype=torch.bool)
    assert float(ns["staleness_estimate"](lk, lb, empty)) == 0.0, "a mask that keeps nothing must give 0, not NaN"


def _h_decoupled_float64(ns):
    g = torch.Generator().manual_seed(4343)
    lb = -2 * torch.rand(50, generator=g, dtype=torch.float64)
    lk = lb + 0.5 * torch.randn(50, generator=g, dtype=torch.float64)
    lp = (lk + 0.3 * torch.randn(50, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(50, generator=g, dtype=torch.float64)
    got = ns["decoupled_clip_loss"](lp, lk, lb, adv, 0.1)
    want = decoupled_clip_loss(lp, lk, lb, adv, 0.1)
    assert_close(got, want, "50 float64 samples, eps 0.1", 1e-10)
    (gg,) = torch.autograd.grad(got, lp)
    (gw,) = torch.autograd.grad(want, lp)
    assert_close(gg, gw, "the gradient (eps 0.1)", 1e-10)


def _h_driver_fresh_seeds(ns):
    """Fresh seeds 13 and 14 at lag 0: learns (return >= LEARN_RETURN at the end); at lag 3: S_0 = 0, S_k > 0 after."""
    rets = []
    for seed in (13, 14):
        hist = driver_run(ns, lag=0, seed=seed)
        rets.append(hist["return"][-1])
    ok = sum(r >= LEARN_RETURN for r in rets)
    assert ok > 0, (f"at lag 0 after {LEARN_STEPS} env steps the return of the last 20 episodes is "
                    f"{[round(r, 1) for r in rets]} on seeds 13, 14 (expected >= {LEARN_RETURN:g})")
    hist = ns["stale_ppo"](lag=3, seed=15, total_steps=8 * 32 * 8)
    s = hist["staleness"]
    assert len(s) == 8, f"8 updates expected, got {len(s)} entries"
    assert s[0] == 0.0, f"lag 3: update 0 samples with version 0, the learner itself, so S_0 = 0; got {s[0]}"
    assert min(s[1:]) > 0.0, f"lag 3: from update 1 on the sampler is min(k, 3) versions old, S_k > 0; got {s[1:]}"
    return ok / 2


HIDDEN: tuple[Test, ...] = (
    Test("hidden_tv_shapes_and_impossible_actions", "mean_tv", 3.0, _h_tv_shapes),
    Test("hidden_estimates_masked_and_extreme", "update_shift_estimate", 4.0, _h_estimates_masked_extreme),
    Test("hidden_decoupled_float64", "decoupled_clip_loss", 3.0, _h_decoupled_float64),
    Test("hidden_driver_fresh_seeds", "stale_ppo", 10.0, _h_driver_fresh_seeds, timeout=180.0),
)
