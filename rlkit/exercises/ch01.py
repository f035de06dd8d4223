r"""Checkers for the exercises of chapter 1, ``lessons/01_policy_gradient.ipynb``.

Four exercises, each with the reference solution, the cases it is checked on, and the known
wrong variants whose outputs :func:`rlkit.exercises.check` recognises ("likely cause: ..."):

* ``softmax_score(logits, actions)``: the score of a softmax policy in closed form,
  :math:`\nabla_z \log \mathrm{softmax}(z)_a = e_a - \mathrm{softmax}(z)`.
* ``bandit_gradient(logits, rewards)``: the exact gradient of a softmax bandit's expected reward,
  :math:`\nabla_z \sum_a \pi_a r_a = \pi \odot (r - \langle \pi, r\rangle)`.
* ``reward_to_go(rewards, discounts)``: :math:`G_t = r_t + \gamma_t G_{t+1}`, :math:`G_T = 0`, with
  several episodes per row (``discounts[..., t] = gamma * (1 - terminated_t)``).
* ``reinforce_loss(logits, actions, weights, mask)``: the surrogate loss whose gradient is minus the
  REINFORCE estimate, :math:`L = -\frac1N \sum_{i,t} m_{i,t}\, w_{i,t} \log \pi(a_{i,t} \mid s_{i,t})`.
"""
from __future__ import annotations

import torch

from rlkit.exercises import Case, Exercise, Mistake, register

__all__: list[str] = []


# --------------------------------------------------------------------------------------- helpers

def _check_logits_actions(logits, actions, fn: str):
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError(f"{fn}: logits must be a floating-point torch.Tensor [..., A]")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"{fn}: logits must have shape [..., A] with A >= 1, got {tuple(logits.shape)}")
    if not isinstance(actions, torch.Tensor) or actions.dtype != torch.int64:
        raise TypeError(f"{fn}: actions must be an int64 torch.Tensor of shape logits.shape[:-1]")
    if tuple(actions.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"{fn}: actions must have shape {tuple(logits.shape[:-1])} (logits.shape[:-1]), "
                         f"got {tuple(actions.shape)}")
    if actions.numel() and (actions.min() < 0 or actions.max() >= logits.shape[-1]):
        raise ValueError(f"{fn}: actions must lie in [0, {logits.shape[-1] - 1}]")


def _one_hot(actions, n, dtype):
    return torch.nn.functional.one_hot(actions, n).to(dtype)


# ----------------------------------------------------------------------- 1. softmax_score

def _softmax_score(logits, actions):
    r""":math:`\nabla_z \log\pi(a) = e_a - \mathrm{softmax}(z)`; logits ``[..., A]``, actions ``[...]``."""
    _check_logits_actions(logits, actions, "softmax_score")
    return _one_hot(actions, logits.shape[-1], logits.dtype) - torch.softmax(logits, dim=-1)


def _score_sign(logits, actions):
    return torch.softmax(logits, dim=-1) - _one_hot(actions, logits.shape[-1], logits.dtype)


def _score_no_normaliser(logits, actions):
    return _one_hot(actions, logits.shape[-1], logits.dtype)


def _score_of_probability(logits, actions):
    pi = torch.softmax(logits, dim=-1)
    pa = pi.gather(-1, actions[..., None])
    return pa * (_one_hot(actions, logits.shape[-1], logits.dtype) - pi)


def _score_minus_log_softmax(logits, actions):
    return _one_hot(actions, logits.shape[-1], logits.dtype) - torch.log_softmax(logits, dim=-1)


def _score_wrong_dim(logits, actions):
    return _one_hot(actions, logits.shape[-1], logits.dtype) - torch.softmax(logits, dim=0)


def _score_cases():
    g = torch.Generator().manual_seed(101)
    return [
        Case(args=(torch.tensor([0.0, 1.0, 2.0]), torch.tensor(2)), label="one state, 3 actions"),
        Case(args=(torch.randn(4, 3, generator=g), torch.tensor([0, 2, 1, 1])), label="4 states"),
        Case(args=(torch.randn(2, 5, 4, generator=g, dtype=torch.float64),
                   torch.randint(0, 4, (2, 5), generator=g)), label="[2, 5] states, float64"),
        Case(args=(torch.tensor([[100.0, -100.0, 0.0], [-100.0, 100.0, 50.0]]), torch.tensor([1, 0])),
             label="large logits (+-100): overflows unless you subtract the max"),
    ]


register(Exercise(
    name="softmax_score",
    chapter=1,
    reference=_softmax_score,
    cases=_score_cases,
    mistakes=[
        Mistake(_score_sign, "you returned the gradient of -log pi (what a loss minimises), "
                "not of log pi: it is softmax(z) - e_a instead of e_a - softmax(z)"),
        Mistake(_score_no_normaliser, "you differentiated only the logit z_a and forgot the normaliser: "
                "log pi(a) = z_a - log sum_b exp(z_b), whose gradient subtracts softmax(z)"),
        Mistake(_score_of_probability, "this is the gradient of the probability pi(a) = pi_a (e_a - pi), "
                "not of its logarithm: the score is grad pi(a) / pi(a)"),
        Mistake(_score_minus_log_softmax, "you subtracted log softmax(z); the derivative of "
                "log sum_b exp(z_b) is softmax(z) itself"),
        Mistake(_score_wrong_dim, "the softmax is normalised over the first (batch) dimension; "
                "actions live on the LAST dimension (dim=-1)"),
    ],
    atol=1e-6,
    description="Closed-form score of a softmax policy with respect to its logits.",
))


# ---------------------------------------------------------------------- 2. bandit_gradient

def _bandit_gradient(logits, rewards):
    r""":math:`\nabla_z \sum_a \pi_a r_a = \pi \odot (r - \langle\pi, r\rangle)`, shapes ``[..., A]``."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise TypeError("bandit_gradient: logits must be a floating-point torch.Tensor [..., A]")
    if not isinstance(rewards, torch.Tensor) or rewards.shape != logits.shape:
        raise ValueError("bandit_gradient: rewards must be a tensor with the shape of logits")
    pi = torch.softmax(logits, dim=-1)
    return pi * (rewards - (pi * rewards).sum(-1, keepdim=True))


def _bandit_no_baseline(logits, rewards):
    return torch.softmax(logits, dim=-1) * rewards


def _bandit_no_pi(logits, rewards):
    pi = torch.softmax(logits, dim=-1)
    return rewards - (pi * rewards).sum(-1, keepdim=True)


def _bandit_mean_baseline(logits, rewards):
    pi = torch.softmax(logits, dim=-1)
    return pi * (rewards - rewards.mean(-1, keepdim=True))


def _bandit_cases():
    g = torch.Generator().manual_seed(202)
    return [
        Case(args=(torch.zeros(2), torch.tensor([0.0, 1.0])), label="two arms, uniform policy"),
        Case(args=(torch.tensor([1.0, 0.0, -1.0]), torch.tensor([1.0, 2.0, 3.0])), label="three arms"),
        Case(args=(torch.randn(5, 4, generator=g, dtype=torch.float64),
                   torch.randn(5, 4, generator=g, dtype=torch.float64)), label="5 bandits, float64"),
    ]


register(Exercise(
    name="bandit_gradient",
    chapter=1,
    reference=_bandit_gradient,
    cases=_bandit_cases,
    mistakes=[
        Mistake(_bandit_no_baseline, "you kept only pi_a r_a: raising one logit also lowers every other "
                "probability, which gives the term -pi_a <pi, r>"),
        Mistake(_bandit_no_pi, "the factor pi_a is missing: d pi_b / d z_a = pi_b (1[a=b] - pi_a) "
                "carries the probability"),
        Mistake(_bandit_mean_baseline, "you subtracted the plain average of the rewards; "
                "the term that appears is the policy's average <pi, r> = sum_b pi_b r_b"),
    ],
    atol=1e-6,
    description="Exact gradient of the expected reward of a softmax bandit.",
))


# ------------------------------------------------------------------------- 3. reward_to_go

def _check_rewards_discounts(rewards, discounts):
    for name, x in (("rewards", rewards), ("discounts", discounts)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"reward_to_go: {name} must be a floating-point torch.Tensor [..., T]")
    if rewards.dim() < 1 or discounts.shape != rewards.shape:
        raise ValueError(f"reward_to_go: discounts must have the shape of rewards {tuple(rewards.shape)}, "
                         f"got {tuple(discounts.shape)}")


def _reward_to_go(rewards, discounts):
    r""":math:`G_t = r_t + \gamma_t G_{t+1}`, :math:`G_T = 0`; ``[..., T] -> [..., T]``."""
    _check_rewards_discounts(rewards, discounts)
    out = torch.zeros_like(rewards)
    g = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        g = rewards[..., t] + discounts[..., t] * g
        out[..., t] = g
    return out


def _rtg_ignores_termination(rewards, discounts):
    gamma = discounts.max()
    return _reward_to_go(rewards, torch.full_like(discounts, float(gamma)))


def _rtg_next_discount(rewards, discounts):
    shifted = torch.cat([discounts[..., 1:], torch.zeros_like(discounts[..., :1])], dim=-1)
    return _reward_to_go(rewards, shifted)


def _rtg_excludes_current(rewards, discounts):
    return _reward_to_go(rewards, discounts) - rewards


def _rtg_forward(rewards, discounts):
    out = torch.zeros_like(rewards)
    c = torch.zeros_like(rewards[..., 0])
    prev = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1]):
        c = rewards[..., t] + prev * c
        prev = discounts[..., t]
        out[..., t] = c
    return out


def _rtg_discounts_current(rewards, discounts):
    return discounts * _reward_to_go(rewards, discounts)


def _rtg_cases():
    g = torch.Generator().manual_seed(303)
    term = (torch.rand(3, 8, generator=g) < 0.25).double()
    batch = (torch.randn(3, 8, generator=g, dtype=torch.float64), 0.99 * (1.0 - term))
    term3 = (torch.rand(2, 2, 6, generator=g) < 0.3).float()
    batch3 = (torch.randn(2, 2, 6, generator=g), 0.9 * (1.0 - term3))
    return [
        Case(args=(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.9, 0.9, 0.0])), label="one episode"),
        Case(args=(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([0.5, 0.0, 0.5, 0.5, 0.5])),
             label="an episode ends at t=1, the next is cut by the end of the rollout"),
        Case(args=(torch.tensor([0.0, 0.0, 0.0, 1.0]), torch.tensor([1.0, 1.0, 1.0, 0.0])),
             label="gamma = 1, reward only at the end (an LLM response)"),
        Case(args=batch, label="[3, 8] random, float64"),
        Case(args=batch3, label="[2, 2, 6] random"),
    ]


register(Exercise(
    name="reward_to_go",
    chapter=1,
    reference=_reward_to_go,
    cases=_rtg_cases,
    mistakes=[
        Mistake(_rtg_ignores_termination, "the discount is not zeroed at termination: the return of the "
                "next episode leaks into the steps of the one before (use discounts[..., t], which is 0 "
                "at a terminal step)"),
        Mistake(_rtg_next_discount, "you used discounts[..., t+1] instead of discounts[..., t]: the "
                "termination flag acts one step late (an off-by-one in time)"),
        Mistake(_rtg_excludes_current, "the sum starts at r_{t+1}: the reward r_t of the step itself "
                "is missing (an off-by-one in time)"),
        Mistake(_rtg_forward, "you accumulated forwards in time (the reward collected so far), "
                "not backwards (the reward still to come)"),
        Mistake(_rtg_discounts_current, "you discounted r_t as well: the discount applies to what "
                "comes after step t, G_t = r_t + gamma_t G_{t+1}"),
    ],
    atol=1e-5,
    description="Reward-to-go with per-step discounts that stop at episode boundaries.",
))


# ------------------------------------------------------------------------ 4. reinforce_loss

def _check_loss_args(logits, actions, weights, mask):
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or not logits.is_floating_point():
        raise ValueError("reinforce_loss: logits must be a float tensor [N, T, A]")
    _check_logits_actions(logits, actions, "reinforce_loss")
    for name, x in (("weights", weights), ("mask", mask)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(actions.shape):
            raise ValueError(f"reinforce_loss: {name} must be a tensor of shape {tuple(actions.shape)}")


def _logp(logits, actions, dim=-1):
    return torch.log_softmax(logits, dim=dim).gather(-1, actions[..., None]).squeeze(-1)


def _reinforce_loss(logits, actions, weights, mask):
    r""":math:`L = -\frac1N \sum_{i,t} m_{i,t} w_{i,t} \log\pi(a_{i,t}|s_{i,t})`; returns a 0-dim tensor."""
    _check_loss_args(logits, actions, weights, mask)
    m = mask.to(logits.dtype)
    return -(m * weights.detach() * _logp(logits, actions)).sum() / logits.shape[0]


def _loss_sign(logits, actions, weights, mask):
    return -_reinforce_loss(logits, actions, weights, mask)


def _loss_step_mean(logits, actions, weights, mask):
    m = mask.to(logits.dtype)
    return -(m * weights * _logp(logits, actions)).sum() / m.sum()


def _loss_plain_mean(logits, actions, weights, mask):
    m = mask.to(logits.dtype)
    return -(m * weights * _logp(logits, actions)).mean()


def _loss_no_mask(logits, actions, weights, mask):
    return -(weights * _logp(logits, actions)).sum() / logits.shape[0]


def _loss_probability(logits, actions, weights, mask):
    m = mask.to(logits.dtype)
    return -(m * weights * _logp(logits, actions).exp()).sum() / logits.shape[0]


def _loss_wrong_dim(logits, actions, weights, mask):
    m = mask.to(logits.dtype)
    return -(m * weights * _logp(logits, actions, dim=1)).sum() / logits.shape[0]


def _loss_cases():
    g = torch.Generator().manual_seed(404)
    n, t, a = 4, 6, 3
    lengths = torch.tensor([6, 3, 5, 1])
    mask = torch.arange(t)[None, :] < lengths[:, None]
    logits = torch.randn(n, t, a, generator=g)
    actions = torch.randint(0, a, (n, t), generator=g)
    weights = torch.randn(n, t, generator=g) + 1.0          # padding holds garbage on purpose
    n2, t2 = 3, 5
    mask2 = torch.ones(n2, t2, dtype=torch.bool)
    mask2[1, 2:] = False
    return [
        Case(args=(torch.zeros(1, 2, 2), torch.tensor([[0, 1]]), torch.tensor([[1.0, 1.0]]),
                   torch.tensor([[True, True]])), label="one episode, uniform policy"),
        Case(args=(logits, actions, weights, mask), label="4 padded episodes of lengths 6, 3, 5, 1"),
        Case(args=(torch.randn(n2, t2, 4, generator=g, dtype=torch.float64),
                   torch.randint(0, 4, (n2, t2), generator=g),
                   torch.randn(n2, t2, generator=g, dtype=torch.float64) + 2.0, mask2),
             label="3 episodes, float64"),
    ]


register(Exercise(
    name="reinforce_loss",
    chapter=1,
    reference=_reinforce_loss,
    cases=_loss_cases,
    mistakes=[
        Mistake(_loss_sign, "the sign is flipped: the optimiser MINIMISES the loss, so the loss must be "
                "-sum w log pi; with +, gradient descent makes high-return actions less likely"),
        Mistake(_loss_step_mean, "you divided by the number of real steps instead of the number of "
                "trajectories N: the estimator sums over time and averages over trajectories"),
        Mistake(_loss_plain_mean, "torch.mean over all N*T entries (padding included) divides by N*T, "
                "not by N: sum over time, then average over trajectories"),
        Mistake(_loss_no_mask, "the mask is ignored: padded steps after the end of an episode "
                "contribute to the loss"),
        Mistake(_loss_probability, "you weighted the probability pi(a|s), not its logarithm: the "
                "gradient of w * pi is w * pi * grad log pi, which is not the REINFORCE estimate"),
        Mistake(_loss_wrong_dim, "log_softmax is taken over dim=1 (time) instead of the action "
                "dimension (dim=-1)"),
    ],
    atol=1e-5,
    description="The surrogate loss whose gradient is minus the REINFORCE estimate.",
))
