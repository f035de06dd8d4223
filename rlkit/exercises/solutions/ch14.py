r"""Checkers for the exercises of chapter 14, ``lessons/14_credit_over_tokens.ipynb``.

* ``kl_token_reward(logp, logp_ref, mask, beta, reward)``: the KL-regularised per-token reward,
  :math:`r_t = -\beta(\log\pi_\theta - \log\pi_{\text{ref}})(y_t) + \mathbf 1[t = L-1]\,R`,
  ``[B, T]`` (0 at padding).
* ``nstep_target(rewards, values, mask, n)``: the n-step critic target with :math:`\gamma = 1` over a
  response, :math:`G^{(n)}_t = \sum_{k<m} r_{t+k} + V(h_{t+n})\,\mathbf 1[t+n < L]`, :math:`m=\min(n, L-t)`:
  no bootstrap after ``<eos>``.
* ``digit_credit(tokens, answer)``: the dense per-digit reward with the optimum of exact match,
  :math:`r_t = \mathbf 1[y_t = a_t]/L^\star` with :math:`a` = answer + ``"\n"`` (``<eos>``).
"""
from __future__ import annotations

import torch

from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


def _last(mask):
    return (mask.sum(-1).long() - 1).clamp_min(0)


# ------------------------------------------------------------------- 1. kl_token_reward

def _kl_cases():
    g = torch.Generator().manual_seed(14)
    B, T = 3, 5
    lp, lq = -torch.rand(B, T, generator=g) * 2, -torch.rand(B, T, generator=g) * 2
    mask = torch.tensor([[1., 1., 1., 0., 0.], [1., 1., 1., 1., 1.], [1., 1., 0., 0., 0.]])
    R = torch.tensor([1.0, 0.0, 0.5])
    hand_lp = torch.log(torch.tensor([[0.5, 0.9, 0.2]]))
    hand_lq = torch.log(torch.tensor([[0.25, 0.9, 0.4]]))
    return [
        Case(args=(hand_lp, hand_lq, torch.tensor([[1., 1., 0.]]), 0.5, torch.tensor([1.0])),
             label="hand case: two real tokens, log-ratios log 2 and 0, beta 0.5, R = 1"),
        Case(args=(lp, lq, mask, 0.1, R), label="3 responses of lengths 3, 5, 2 (padding holds log-probs)"),
        Case(args=(lp.double(), lq.double(), mask.double(), 0.0, R.double()), label="beta = 0: the task reward only"),
    ]


@exercise(chapter=14, cases=_kl_cases, atol=1e-6,
          description="the KL-regularised per-token reward with the task reward on the last real token")
def kl_token_reward(logp, logp_ref, mask, beta, reward):
    """-beta (logp - logp_ref) on real tokens, plus reward[i] on row i's last real token; [B, T]."""
    out = -beta * (logp - logp_ref) * mask
    out = out.clone()
    rows = torch.arange(out.shape[0])
    out[rows, _last(mask)] += reward.to(out.dtype)
    return out


@mistake(kl_token_reward, "the sign of the KL term is flipped: the reward is MINUS beta times log(pi/pi_ref), "
         "a penalty for moving away from the reference")
def _kl_sign(logp, logp_ref, mask, beta, reward):
    return kl_token_reward(-logp, -logp_ref, mask, beta, reward)


@mistake(kl_token_reward, "the task reward went into the last COLUMN; it belongs on each row's last REAL token "
         "(responses are right-padded)")
def _kl_last_column(logp, logp_ref, mask, beta, reward):
    out = (-beta * (logp - logp_ref) * mask).clone()
    out[:, -1] += reward.to(out.dtype)
    return out


@mistake(kl_token_reward, "padding was not masked: the log-ratio at padded positions must not count")
def _kl_no_mask(logp, logp_ref, mask, beta, reward):
    out = (-beta * (logp - logp_ref)).clone()
    out[torch.arange(out.shape[0]), _last(mask)] += reward.to(out.dtype)
    return out


@mistake(kl_token_reward, "the task reward was added to EVERY token; it is paid once, at the end of the response")
def _kl_reward_everywhere(logp, logp_ref, mask, beta, reward):
    return (-beta * (logp - logp_ref) + reward[:, None].to(logp.dtype)) * mask



# ------------------------------------------------------------------- 2. nstep_target

def _ns_cases():
    g = torch.Generator().manual_seed(41)
    mask = torch.tensor([[1., 1., 1., 0., 0.], [1., 1., 1., 1., 1.], [1., 0., 0., 0., 0.]])
    r = torch.randn(3, 5, generator=g) * mask
    v = torch.randn(3, 5, generator=g)                     # padding holds junk values on purpose
    return [
        Case(args=(torch.tensor([[0., 0., 1., 0.]]), torch.full((1, 4), 0.5), torch.tensor([[1., 1., 1., 0.]]), 2),
             label="hand case: reward 1 at the last of 3 tokens, V = 0.5 everywhere, n = 2 -> [0.5, 1, 1, 0]"),
        Case(args=(r, v, mask, 1), label="n = 1 (TD(0)), lengths 3, 5, 1"),
        Case(args=(r, v, mask, 2), label="n = 2"),
        Case(args=(r, v, mask, 4), label="n = 4 (most windows reach the end)"),
    ]


def _ns(rewards, values, mask, n, bootstrap_end):
    B, T = rewards.shape
    out = torch.zeros_like(rewards)
    for i in range(B):
        L = int(mask[i].sum())
        for t in range(L):
            m = min(n, L - t)
            g = rewards[i, t:t + m].sum()
            if t + n < L:
                g = g + values[i, t + n]
            else:
                g = g + bootstrap_end(values, i, t, n, L)
            out[i, t] = g
    return out


@exercise(chapter=14, cases=_ns_cases, atol=1e-5,
          description="n-step critic targets over a response, no bootstrap after <eos> (gamma = 1)")
def nstep_target(rewards, values, mask, n):
    """G_t = sum of the next min(n, L - t) rewards + V(h_{t+n}) if t + n < L (else nothing); [B, T], 0 at padding."""
    return _ns(rewards, values, mask, n, lambda v, i, t, n, L: 0.0)


@mistake(nstep_target, "a window that runs past the end of the response bootstrapped from the value stored "
         "after it (padding); the response is over after <eos>, so V = 0 there: bootstrap only if t + n < L")
def _ns_padding_bootstrap(rewards, values, mask, n):
    T = rewards.shape[1]
    return _ns(rewards, values, mask, n, lambda v, i, t, n, L: v[i, t + n] if t + n < T else 0.0)


@mistake(nstep_target, "at the end of the response you bootstrapped from the last real state's value V(h_{L-1}); "
         "after <eos> the episode has ended and nothing is bootstrapped")
def _ns_last_value(rewards, values, mask, n):
    return _ns(rewards, values, mask, n, lambda v, i, t, n, L: v[i, L - 1])


@mistake(nstep_target, "off by one: you bootstrapped from V(h_{t+n-1}); after n rewards r_t..r_{t+n-1} the state "
         "is h_{t+n}")
def _ns_off_by_one(rewards, values, mask, n):
    B, T = rewards.shape
    out = torch.zeros_like(rewards)
    for i in range(B):
        L = int(mask[i].sum())
        for t in range(L):
            m = min(n, L - t)
            out[i, t] = rewards[i, t:t + m].sum() + (values[i, t + n - 1] if t + n < L else 0.0)
    return out


@mistake(nstep_target, "you summed n + 1 rewards before bootstrapping; an n-step target has n rewards")
def _ns_n_plus_one(rewards, values, mask, n):
    B, T = rewards.shape
    out = torch.zeros_like(rewards)
    for i in range(B):
        L = int(mask[i].sum())
        for t in range(L):
            m = min(n + 1, L - t)
            out[i, t] = rewards[i, t:t + m].sum() + (values[i, t + n] if t + n < L else 0.0)
    return out


# ------------------------------------------------------------------- 3. digit_credit

def _dc_cases():
    return [
        Case(args=("82\n", "82"), label="the right answer: 1/3 per token"),
        Case(args=("72\n", "82"), label="the forgotten carry 37+45 -> 72"),
        Case(args=("821\n", "82"), label="a right prefix that does not stop"),
        Case(args=("8\n", "82"), label="stops one digit early"),
        Case(args=("115\n", "125"), label="three digits, the tens digit wrong"),
        Case(args=("12", "125"), label="cut off before <eos> (no '\\n')"),
    ]


@exercise(chapter=14, cases=_dc_cases, atol=1e-9,
          description="dense per-digit reward with the same optimum as exact match")
def digit_credit(tokens, answer):
    """One reward per token: 1/L* if token t equals target t (target = answer + newline), else 0."""
    target = answer + "\n"
    L = len(target)
    return torch.tensor([float(t < L and c == target[t]) / L for t, c in enumerate(tokens)], dtype=torch.float64)


@mistake(digit_credit, "<eos> earns no credit: then '821' scores as much as '82' and the dense reward no longer "
         "has exact match's optimum; count the newline as the last target token")
def _dc_no_eos(tokens, answer):
    L = len(answer)
    return torch.tensor([float(t < L and c == answer[t]) / L for t, c in enumerate(tokens)], dtype=torch.float64)


@mistake(digit_credit, "you divided by the RESPONSE length; divide by the TARGET length (answer + <eos>), or a "
         "short wrong answer earns as much per token as a right one")
def _dc_response_length(tokens, answer):
    target = answer + "\n"
    return torch.tensor([float(t < len(target) and c == target[t]) / max(len(tokens), 1)
                         for t, c in enumerate(tokens)], dtype=torch.float64)


@mistake(digit_credit, "all the credit sits on the last token: that is the sparse reward (a count of right "
         "digits), not per-digit credit at the token that emits each digit")
def _dc_at_end(tokens, answer):
    r = digit_credit(tokens, answer)
    out = torch.zeros_like(r)
    if len(r):
        out[-1] = r.sum()
    return out
