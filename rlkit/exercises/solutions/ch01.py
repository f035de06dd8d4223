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
  REINFORCE estimate, :math:`L = -\frac1N \sum_{i,t} m_{i,t}\, \mathrm{sg}[w_{i,t}] \log \pi(a_{i,t} \mid s_{i,t})`.
  Its checker compares the loss *and its gradient with respect to the logits* (``_loss_probe``), on
  weights that depend on the logits, so that weights which are not detached are caught
  (the probe is :func:`rlkit.exercises.probes.loss_probe`, on the student's side).
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake
from rlkit.exercises.probes import loss_probe as _loss_probe  # the student side runs the probe too

__all__: list[str] = []


def _one_hot(actions, logits):
    return torch.nn.functional.one_hot(actions, logits.shape[-1]).to(logits.dtype)


# ----------------------------------------------------------------------- 1. softmax_score

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


@exercise(chapter=1, cases=_score_cases,
          description="Closed-form score of a softmax policy with respect to its logits.")
def softmax_score(logits, actions):
    r""":math:`\nabla_z \log\pi(a) = e_a - \mathrm{softmax}(z)`; logits ``[..., A]``, actions ``[...]``."""
    V.has_categories(logits, "logits")
    V.index_tensor(actions, "actions", shape=logits.shape[:-1], shape_of="logits.shape[:-1]", n=logits.shape[-1])
    return _one_hot(actions, logits) - torch.softmax(logits, dim=-1)


@mistake(softmax_score, "you returned the gradient of -log pi (what a loss minimises), "
         "not of log pi: it is softmax(z) - e_a instead of e_a - softmax(z)")
def _score_sign(logits, actions):
    return torch.softmax(logits, dim=-1) - _one_hot(actions, logits)


@mistake(softmax_score, "you differentiated only the logit z_a and forgot the normaliser: "
         "log pi(a) = z_a - log sum_b exp(z_b), whose gradient subtracts softmax(z)")
def _score_no_normaliser(logits, actions):
    return _one_hot(actions, logits)


@mistake(softmax_score, "this is the gradient of the probability pi(a) = pi_a (e_a - pi), "
         "not of its logarithm: the score is grad pi(a) / pi(a)")
def _score_of_probability(logits, actions):
    return torch.softmax(logits, dim=-1).gather(-1, actions[..., None]) * softmax_score(logits, actions)


@mistake(softmax_score, "you subtracted log softmax(z); the derivative of "
         "log sum_b exp(z_b) is softmax(z) itself")
def _score_minus_log_softmax(logits, actions):
    return _one_hot(actions, logits) - torch.log_softmax(logits, dim=-1)


@mistake(softmax_score, "the softmax is normalised over the first (batch) dimension; "
         "actions live on the LAST dimension (dim=-1)")
def _score_wrong_dim(logits, actions):
    return _one_hot(actions, logits) - torch.softmax(logits, dim=0)


# ---------------------------------------------------------------------- 2. bandit_gradient

def _bandit_cases():
    g = torch.Generator().manual_seed(202)
    return [
        Case(args=(torch.zeros(2), torch.tensor([0.0, 1.0])), label="two arms, uniform policy"),
        Case(args=(torch.tensor([1.0, 0.0, -1.0]), torch.tensor([1.0, 2.0, 3.0])), label="three arms"),
        Case(args=(torch.randn(5, 4, generator=g, dtype=torch.float64),
                   torch.randn(5, 4, generator=g, dtype=torch.float64)), label="5 bandits, float64"),
    ]


@exercise(chapter=1, cases=_bandit_cases, description="Exact gradient of the expected reward of a softmax bandit.")
def bandit_gradient(logits, rewards):
    r""":math:`\nabla_z \sum_a \pi_a r_a = \pi \odot (r - \langle\pi, r\rangle)`, shapes ``[..., A]``."""
    V.matching_floats(logits=logits, rewards=rewards)
    pi = torch.softmax(logits, dim=-1)
    return pi * (rewards - (pi * rewards).sum(-1, keepdim=True))


@mistake(bandit_gradient, "you kept only pi_a r_a: raising one logit also lowers every other "
         "probability, which gives the term -pi_a <pi, r>")
def _bandit_no_baseline(logits, rewards):
    return torch.softmax(logits, dim=-1) * rewards


@mistake(bandit_gradient, "the factor pi_a is missing: d pi_b / d z_a = pi_b (1[a=b] - pi_a) "
         "carries the probability")
def _bandit_no_pi(logits, rewards):
    return rewards - (torch.softmax(logits, dim=-1) * rewards).sum(-1, keepdim=True)


@mistake(bandit_gradient, "you subtracted the plain average of the rewards; "
         "the term that appears is the policy's average <pi, r> = sum_b pi_b r_b")
def _bandit_mean_baseline(logits, rewards):
    return torch.softmax(logits, dim=-1) * (rewards - rewards.mean(-1, keepdim=True))


# ------------------------------------------------------------------------- 3. reward_to_go

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


@exercise(chapter=1, cases=_rtg_cases, atol=1e-5,
          description="Reward-to-go with per-step discounts that stop at episode boundaries.")
def reward_to_go(rewards, discounts):
    r""":math:`G_t = r_t + \gamma_t G_{t+1}`, :math:`G_T = 0`; ``[..., T] -> [..., T]``."""
    V.matching_floats(rewards=rewards, discounts=discounts)
    V.tensor_in(discounts, "discounts", 0.0, 1.0)
    out = torch.zeros_like(rewards)
    g = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        g = rewards[..., t] + discounts[..., t] * g
        out[..., t] = g
    return out


@mistake(reward_to_go, "the discount is not zeroed at termination: the return of the next episode leaks "
         "into the steps of the one before (use discounts[..., t], which is 0 at a terminal step)")
def _rtg_ignores_termination(rewards, discounts):
    return reward_to_go(rewards, torch.full_like(discounts, float(discounts.max())))


@mistake(reward_to_go, "you used discounts[..., t+1] instead of discounts[..., t]: the "
         "termination flag acts one step late (an off-by-one in time)")
def _rtg_next_discount(rewards, discounts):
    return reward_to_go(rewards, torch.cat([discounts[..., 1:], torch.zeros_like(discounts[..., :1])], dim=-1))


@mistake(reward_to_go, "the sum starts at r_{t+1}: the reward r_t of the step itself "
         "is missing (an off-by-one in time)")
def _rtg_excludes_current(rewards, discounts):
    return reward_to_go(rewards, discounts) - rewards


@mistake(reward_to_go, "you accumulated forwards in time (the reward collected so far), "
         "not backwards (the reward still to come)")
def _rtg_forward(rewards, discounts):
    out = torch.zeros_like(rewards)
    c = torch.zeros_like(rewards[..., 0])
    prev = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1]):
        c = rewards[..., t] + prev * c
        prev = discounts[..., t]
        out[..., t] = c
    return out


@mistake(reward_to_go, "you discounted r_t as well: the discount applies to what "
         "comes after step t, G_t = r_t + gamma_t G_{t+1}")
def _rtg_discounts_current(rewards, discounts):
    return discounts * reward_to_go(rewards, discounts)


# ------------------------------------------------------------------------ 4. reinforce_loss

def _logp(logits, actions, dim=-1):
    return torch.log_softmax(logits, dim=dim).gather(-1, actions[..., None]).squeeze(-1)


def _terms(logits, actions, weights, mask, dim=-1):
    r"""The summands :math:`m_{i,t}\, \mathrm{sg}[w_{i,t}] \log\pi(a_{i,t} \mid s_{i,t})` of the loss."""
    return mask.to(logits.dtype) * weights.detach() * _logp(logits, actions, dim)


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


@exercise(chapter=1, cases=_loss_cases, atol=1e-5, probe=_loss_probe,
          description="The surrogate loss whose gradient is minus the REINFORCE estimate "
                      "(output 0: the loss; output 1: its gradient with respect to the logits).")
def reinforce_loss(logits, actions, weights, mask):
    r""":math:`L = -\frac1N \sum_{i,t} m_{i,t} w_{i,t} \log\pi(a_{i,t}|s_{i,t})`; returns a 0-dim tensor."""
    sizes = V.layout("N T A", floating=True, logits=logits)
    V.layout("N T", sizes, floating=True, weights=weights)
    V.index_tensor(actions, "actions", shape=weights.shape, shape_of="[N, T]", n=sizes["A"])
    m = V.check_mask(mask, weights, "weights")
    return -(m * weights.detach() * _logp(logits, actions)).sum() / logits.shape[0]


@mistake(reinforce_loss, "the weights are not detached: here they depend on the logits (as advantages "
         "from a critic that shares the network would), so without weights.detach() the gradient also flows "
         "through them and output 1 is not the REINFORCE estimate; the loss value (output 0) is the same")
def _loss_weights_not_detached(logits, actions, weights, mask):
    return -(mask.to(logits.dtype) * weights * _logp(logits, actions)).sum() / logits.shape[0]


@mistake(reinforce_loss, "the loss carries no gradient: you detached the log-probabilities (or computed "
         "them under torch.no_grad()); detach only the weights")
def _loss_no_gradient(logits, actions, weights, mask):
    return reinforce_loss(logits.detach(), actions, weights, mask)


# Value-level mistakes, each registered twice: with the weights detached, and (a second, common
# slip on top) without. ``sg`` is the stop-gradient the variant applies to the weights.
def _value_mistakes():
    def sign(logits, actions, weights, mask, sg):
        return (mask.to(logits.dtype) * sg(weights) * _logp(logits, actions)).sum() / logits.shape[0]

    def step_mean(logits, actions, weights, mask, sg):
        m = mask.to(logits.dtype)
        return -(m * sg(weights) * _logp(logits, actions)).sum() / m.sum()

    def plain_mean(logits, actions, weights, mask, sg):
        return -(mask.to(logits.dtype) * sg(weights) * _logp(logits, actions)).mean()

    def per_time(logits, actions, weights, mask, sg):
        return -(mask.to(logits.dtype) * sg(weights) * _logp(logits, actions)).sum() / logits.shape[1]

    def no_mask(logits, actions, weights, mask, sg):
        return -(sg(weights) * _logp(logits, actions)).sum() / logits.shape[0]

    def probability(logits, actions, weights, mask, sg):
        return -(mask.to(logits.dtype) * sg(weights) * _logp(logits, actions).exp()).sum() / logits.shape[0]

    def wrong_dim(logits, actions, weights, mask, sg):
        return -(mask.to(logits.dtype) * sg(weights) * _logp(logits, actions, dim=1)).sum() / logits.shape[0]

    return [
        (sign, "the sign is flipped: the optimiser MINIMISES the loss, so the loss must be "
               "-sum w log pi; with +, gradient descent makes high-return actions less likely"),
        (step_mean, "you divided by the number of real steps instead of the number of "
                    "trajectories N: the estimator sums over time and averages over trajectories"),
        (plain_mean, "torch.mean over all N*T entries (padding included) divides by N*T, "
                     "not by N: sum over time, then average over trajectories"),
        (per_time, "you divided by T, the (padded) number of time steps; the estimator sums over time "
                   "and averages over the N trajectories: divide by N = logits.shape[0]"),
        (no_mask, "the mask is ignored: padded steps after the end of an episode contribute to the loss"),
        (probability, "you weighted the probability pi(a|s), not its logarithm: the "
                      "gradient of w * pi is w * pi * grad log pi, which is not the REINFORCE estimate"),
        (wrong_dim, "log_softmax is taken over dim=1 (time) instead of the action dimension (dim=-1)"),
    ]


def _register_value_mistakes():
    also = "; also, the weights are not detached (use weights.detach(): output 1 is the gradient)"
    for body, cause in _value_mistakes():
        for sg, suffix in ((torch.Tensor.detach, ""), (lambda w: w, also)):
            def variant(logits, actions, weights, mask, _body=body, _sg=sg):
                return _body(logits, actions, weights, mask, _sg)
            variant.__name__ = f"_loss_{body.__name__}" + ("" if not suffix else "_not_detached")
            mistake(reinforce_loss, cause + suffix)(variant)


_register_value_mistakes()
