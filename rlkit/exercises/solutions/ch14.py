r"""Checkers for the exercises of chapter 14, ``lessons/14_credit_over_tokens.ipynb``.

The chapter displays ``kl_token_rewards``, ``value_targets`` and ``digit_rewards``, which solved the exercises
these replace (``kl_token_reward``, ``nstep_target``, ``digit_credit``); each now asks for a variant:

* ``exact_kl_token_reward(logits, logits_ref, mask, beta, reward)``: the per-token reward with the exact
  next-token KL, :math:`r_t = -\beta\,\mathrm{KL}_t(h_t) + \mathbf 1[t = L-1]\,R`, from ``[B, T, V]`` logits;
  ``[B, T]`` (0 at padding).
* ``truncated_lambda_target(rewards, values, mask, lam, h)``: the truncated :math:`\lambda`-return over a response
  (:math:`\gamma = 1`), :math:`(1-\lambda)\sum_{n=1}^{h-1}\lambda^{n-1}G^{(n)}_t + \lambda^{h-1}G^{(h)}_t` with the
  n-step targets of eq-ch14-nstep (no bootstrap after ``<eos>``).
* ``shaped_digit_reward(tokens, answer)``: potential-based shaping of the exact-match reward,
  :math:`r_t = \Phi(h_{t+1}) - \Phi(h_t) + \mathbf 1[t = T-1]\,R` with :math:`\Phi(h_t) = t/T^\star` on a right
  prefix (0 otherwise, and 0 at the end), so that every response's rewards sum to its exact-match reward.
"""
from __future__ import annotations

import torch

from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


def _last(mask):
    return (mask.sum(-1).long() - 1).clamp_min(0)


# ------------------------------------------------------------- 1. exact_kl_token_reward

def _kl_cases():
    g = torch.Generator().manual_seed(14)
    B, T, Vv = 3, 5, 4
    z, zr = torch.randn(B, T, Vv, generator=g), torch.randn(B, T, Vv, generator=g)
    mask = torch.tensor([[1., 1., 1., 0., 0.], [1., 1., 1., 1., 1.], [1., 0., 0., 0., 0.]])
    R = torch.tensor([1.0, 0.0, 0.5])
    hand = torch.log(torch.tensor([[[0.5, 0.5], [0.9, 0.1]]]))
    hand_ref = torch.log(torch.tensor([[[0.25, 0.75], [0.9, 0.1]]]))
    return [
        Case(args=(hand, hand_ref, torch.tensor([[1., 1.]]), 1.0, torch.tensor([1.0])),
             label="hand case: KL((.5, .5) || (.25, .75)) at token 0, 0 at token 1; beta 1, R = 1"),
        Case(args=(z, zr, mask, 0.1, R), label="3 responses of lengths 3, 5, 1 over 4 tokens; padding holds logits"),
        Case(args=(3 * z.double(), zr.double(), mask.double(), 0.5, R.double()), label="sharper logits, float64"),
        Case(args=(z, z + 2.0, mask, 0.3, R),
             label="the reference's logits shifted by a constant: the same policy, KL 0"),
        Case(args=(z.double(), zr.double(), mask.double(), 0.0, R.double()), label="beta = 0: the task reward only"),
    ]


def _exact_kl(logits, logits_ref):
    lp, lq = torch.log_softmax(logits, -1), torch.log_softmax(logits_ref, -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def _with_reward(per_token, mask, reward, last_column=False):
    out = (per_token * mask).clone()
    rows = torch.arange(out.shape[0])
    cols = torch.full_like(_last(mask), out.shape[1] - 1) if last_column else _last(mask)
    out[rows, cols] += reward.to(out.dtype)
    return out


@exercise(chapter=14, cases=_kl_cases, atol=1e-6,
          description="the per-token reward with the exact next-token KL, the task reward on the last real token")
def exact_kl_token_reward(logits, logits_ref, mask, beta, reward):
    """-beta KL(pi(.|h_t) || pi_ref(.|h_t)) on real tokens (from [B, T, V] logits), plus reward[i] on row i's
    last real token; [B, T]."""
    return _with_reward(-beta * _exact_kl(logits, logits_ref), mask, reward)


@mistake(exact_kl_token_reward, "the KL is the wrong way round: the penalty is KL(pi_theta || pi_ref), an "
         "expectation under the policy being trained, sum_v pi_theta (log pi_theta - log pi_ref)")
def _kl_reversed(logits, logits_ref, mask, beta, reward):
    return _with_reward(-beta * _exact_kl(logits_ref, logits), mask, reward)


@mistake(exact_kl_token_reward, "the logits were used as log-probabilities: normalise them first (log_softmax), "
         "or a constant shift of the logits changes your KL")
def _kl_unnormalised(logits, logits_ref, mask, beta, reward):
    kl = (torch.softmax(logits, -1) * (logits - logits_ref)).sum(-1)
    return _with_reward(-beta * kl, mask, reward)


@mistake(exact_kl_token_reward, "the sign of the KL term is flipped: the reward is MINUS beta times the KL, "
         "a penalty for moving away from the reference")
def _kl_sign(logits, logits_ref, mask, beta, reward):
    return _with_reward(beta * _exact_kl(logits, logits_ref), mask, reward)


@mistake(exact_kl_token_reward, "the task reward went into the last COLUMN; it belongs on each row's last REAL token "
         "(responses are right-padded)")
def _kl_last_column(logits, logits_ref, mask, beta, reward):
    return _with_reward(-beta * _exact_kl(logits, logits_ref), mask, reward, last_column=True)


@mistake(exact_kl_token_reward, "padding was not masked: the KL at padded positions must not count")
def _kl_no_mask(logits, logits_ref, mask, beta, reward):
    out = (-beta * _exact_kl(logits, logits_ref)).clone()
    out[torch.arange(out.shape[0]), _last(mask)] += reward.to(out.dtype)
    return out


# ------------------------------------------------------------- 2. truncated_lambda_target

def _ns_cases():
    g = torch.Generator().manual_seed(41)
    mask = torch.tensor([[1., 1., 1., 0., 0.], [1., 1., 1., 1., 1.], [1., 0., 0., 0., 0.]])
    r = torch.randn(3, 5, generator=g) * mask
    v = torch.randn(3, 5, generator=g)                     # padding holds junk values on purpose
    return [
        Case(args=(torch.tensor([[0., 0., 1., 0.]]), torch.full((1, 4), 0.5), torch.tensor([[1., 1., 1., 0.]]), 0.5, 2),
             label="hand case: reward 1 at the last of 3 tokens, V = 0.5, lambda = 0.5, h = 2 -> [0.5, 0.75, 1, 0]"),
        Case(args=(r, v, mask, 0.8, 1), label="h = 1: TD(0) whatever lambda, lengths 3, 5, 1"),
        Case(args=(r, v, mask, 0.8, 2), label="lambda = 0.8, h = 2"),
        Case(args=(r, v, mask, 0.5, 3), label="lambda = 0.5, h = 3"),
        Case(args=(r, v, mask, 1.0, 2), label="lambda = 1: the h-step target"),
        Case(args=(r, v, mask, 0.0, 3), label="lambda = 0: TD(0)"),
        Case(args=(r, v, mask, 0.9, 6), label="h = 6 covers every response: the full lambda-return"),
    ]


def _nstep_one(rewards, values, i, t, n, L, *, boot_end=False, boot_shift=0):
    m = min(n, L - t)
    g = rewards[i, t:t + m].sum()
    if t + n < L or (boot_end and t + n < rewards.shape[1]):
        g = g + values[i, t + n - boot_shift]
    return g


def _tl(rewards, values, mask, lam, h, *, last_weight=None, h_shift=0, boot_end=False, h_inf=False, boot_shift=0):
    B, T = rewards.shape
    out = torch.zeros_like(rewards)
    for i in range(B):
        L = int(mask[i].sum())
        for t in range(L):
            H = (L - t if h_inf else h) + h_shift
            H = max(H, 1)
            g = sum((1 - lam) * lam ** (n - 1) * _nstep_one(rewards, values, i, t, n, L, boot_end=boot_end,
                                                            boot_shift=boot_shift)
                    for n in range(1, H))
            w = lam ** (H - 1) if last_weight is None else last_weight(lam, H)
            out[i, t] = g + w * _nstep_one(rewards, values, i, t, H, L, boot_end=boot_end, boot_shift=boot_shift)
    return out


@exercise(chapter=14, cases=_ns_cases, atol=1e-5,
          description="the truncated lambda-return over a response (gamma = 1, no bootstrap after <eos>)")
def truncated_lambda_target(rewards, values, mask, lam, h):
    """G^lam_{t:t+h} = (1 - lam) sum_{n=1}^{h-1} lam^(n-1) G^(n)_t + lam^(h-1) G^(h)_t, with the n-step targets
    of eq-ch14-nstep (gamma = 1); [B, T], 0 at padding."""
    return _tl(rewards, values, mask, lam, h)


@mistake(truncated_lambda_target, "your horizon never stops: that is the full lambda-return (value_targets(kind="
         "'lambda')); the truncated target mixes only the n-step targets with n <= h and puts the remaining weight "
         "lam^(h-1) on the h-step one")
def _tl_full(rewards, values, mask, lam, h):
    return _tl(rewards, values, mask, lam, h, h_inf=True)


@mistake(truncated_lambda_target, "the weights do not sum to 1: the h-step target carries all the remaining weight "
         "lam^(h-1), not (1 - lam) lam^(h-1)")
def _tl_last_weight(rewards, values, mask, lam, h):
    return _tl(rewards, values, mask, lam, h, last_weight=lambda lam, H: (1 - lam) * lam ** (H - 1))


@mistake(truncated_lambda_target, "off by one: the horizon h means n-step targets with n = 1 .. h; yours "
         "goes to h + 1")
def _tl_h_plus_one(rewards, values, mask, lam, h):
    return _tl(rewards, values, mask, lam, h, h_shift=1)


@mistake(truncated_lambda_target, "off by one in the n-step targets: you bootstrapped from V(h_{t+n-1}); after n "
         "rewards r_t..r_{t+n-1} the state is h_{t+n}")
def _tl_boot_shift(rewards, values, mask, lam, h):
    return _tl(rewards, values, mask, lam, h, boot_shift=1)


@mistake(truncated_lambda_target, "an n-step target whose window runs past the end of the response bootstrapped "
         "from the value stored after it (padding); after <eos> V = 0: bootstrap only if t + n < L")
def _tl_boot_end(rewards, values, mask, lam, h):
    return _tl(rewards, values, mask, lam, h, boot_end=True)


# -------------------------------------------------------------- 3. shaped_digit_reward

def _dc_cases():
    return [
        Case(args=("82\n", "82"), label="the right answer: 1/3 per token"),
        Case(args=("72\n", "82"), label="the forgotten carry 37+45 -> 72"),
        Case(args=("821\n", "82"), label="a right prefix that does not stop"),
        Case(args=("8\n", "82"), label="stops one digit early"),
        Case(args=("115\n", "125"), label="three digits, the tens digit wrong"),
        Case(args=("12", "125"), label="cut off before <eos> (no '\\n')"),
        Case(args=("\n", "7"), label="<eos> straight away"),
    ]


def _phi(tokens, target, t):
    """The potential of the prefix of length t: t / T* if it is a prefix of the target, else 0."""
    return t / len(target) if tokens[:t] == target[:t] else 0.0


def _shaped(tokens, answer, *, terminal_zero=True, sign=1.0, with_R=True):
    target = answer + "\n"
    T = len(tokens)
    R = float(tokens == target)
    out = []
    for t in range(T):
        nxt = 0.0 if (t == T - 1 and terminal_zero) else _phi(tokens, target, t + 1)
        r = sign * (nxt - _phi(tokens, target, t))
        if t == T - 1 and with_R:
            r += R
        out.append(r)
    return torch.tensor(out, dtype=torch.float64)


@exercise(chapter=14, cases=_dc_cases, atol=1e-9,
          description="a potential-shaped per-token reward whose sum is the exact-match reward")
def shaped_digit_reward(tokens, answer):
    """r_t = Phi(h_{t+1}) - Phi(h_t) + R 1[t = T-1], Phi(h_t) = t / T* on a right prefix (else 0), Phi = 0 at the
    end; a float64 tensor of len(tokens)."""
    return _shaped(tokens, answer)


@mistake(shaped_digit_reward, "that is the dense per-digit reward of eq-ch14-digit (rlkit.llm.digit_rewards): it has "
         "exact match's maximisers but not its ordering; potential shaping pays Phi(h_{t+1}) - Phi(h_t), so every "
         "response's rewards sum to its exact-match reward")
def _dc_dense(tokens, answer):
    target = answer + "\n"
    L = len(target)
    return torch.tensor([float(t < L and c == target[t]) / L for t, c in enumerate(tokens)], dtype=torch.float64)


@mistake(shaped_digit_reward, "the potential of the final state must be 0 (the response is over), or the shaping "
         "does not telescope and a right prefix keeps its potential as reward")
def _dc_no_terminal(tokens, answer):
    return _shaped(tokens, answer, terminal_zero=False)


@mistake(shaped_digit_reward, "the shaping term is Phi(h_{t+1}) - Phi(h_t) (the potential gained), not "
         "Phi(h_t) - Phi(h_{t+1})")
def _dc_sign(tokens, answer):
    return _shaped(tokens, answer, sign=-1.0)


@mistake(shaped_digit_reward, "the task reward R (exact match, on the last token) is missing: shaping only "
         "redistributes it, it does not replace it")
def _dc_no_R(tokens, answer):
    return _shaped(tokens, answer, with_R=False)
