r"""Checkers for the exercises of chapter 21, ``lessons/21_offline_rl_ope.ipynb``.

* ``masked_expectile(values, kappa, mask)``: the minimiser of IQL's expectile loss, the exact
  :math:`\kappa`-expectile of each row's real entries, :math:`\kappa\sum(x-v)_+ = (1-\kappa)\sum(v-x)_+`
  ``[B, n] -> [B]`` (0 for a row with none).
* ``sampled_cql_term(q, actions, mask, samples, sample_logprobs)``: CQL's penalty without its factor,
  its log-sum-exp estimated from ``K`` tokens sampled from :math:`\mu` by importance sampling, the masked
  mean of :math:`\log\frac1K\sum_j e^{Q(h,a_j)}/\mu(a_j\mid h) - Q(h, a_{\mathcal D})`.
* ``doubly_robust(log_ratios, rewards, reward_hat, target_values)``: the doubly robust OPE
  estimate :math:`\frac1n\sum_i[\hat v^\pi(x_i) + \rho_i(r_i - \hat r(x_i, y_i))]`.
"""
from __future__ import annotations

import math

import torch

from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ------------------------------------------------------------------- 1. masked_expectile
# (was expectile_loss: rlkit.offline.expectile_loss, which the chapter shows, passed its check as a
# one-line call; issue 23. The exercise now asks for the loss's minimiser, the expectile itself.)

def _ex_cases():
    g = torch.Generator().manual_seed(2101)
    x = torch.randn(4, 7, generator=g, dtype=F64)
    m = torch.rand(4, 7, generator=g) < 0.7
    m[0] = True                                           # one full row
    m[1, :] = False
    m[1, 3] = True                                        # one real entry
    m[3, :] = False                                       # no real entry: 0
    pad = torch.where(m, x, torch.full_like(x, 5.0))     # padding holds a large value
    nan = torch.where(m, x, torch.full_like(x, float("nan")))
    graded = torch.tensor([[0., 1 / 3, 1 / 3, 1 / 3, 1., 1.], [2 / 3, 2 / 3, 2 / 3, 2 / 3, 0., 1.]], dtype=F64)
    return [
        Case(args=(torch.tensor([[0.0, 1.0]], dtype=F64), 0.75, torch.tensor([[True, True]])),
             label="hand case: {0, 1} at kappa 0.75 -> 0.75 (0.75 (1 - v) = 0.25 v)"),
        Case(args=(pad, 0.7, m),
             label="4 rows of 7, kappa 0.7: a full row, one real entry, no real entry, padding 5.0"),
        Case(args=(pad, 0.5, m), label="the same at kappa 0.5: the masked mean"),
        Case(args=(graded, 0.9, torch.ones(2, 6, dtype=torch.bool)), label="graded values with ties, kappa 0.9"),
        Case(args=(nan, 0.3, m), label="kappa 0.3 (below the mean), NaN in the padding"),
    ]


@exercise(chapter=21, cases=_ex_cases, atol=1e-10,
          description="the kappa-expectile of each row's real entries, exactly (the minimiser of IQL's loss)")
def masked_expectile(values, kappa, mask):
    """Per row, v with kappa * sum (x - v)_+ = (1 - kappa) * sum (v - x)_+ over the real entries; 0 for none."""
    out = torch.zeros(values.shape[0], dtype=values.dtype)
    for b in range(values.shape[0]):
        x = values[b][mask[b]].sort().values
        n = x.shape[0]
        if n == 0:
            continue
        below = torch.cumsum(x, 0)                        # sum of the j + 1 smallest
        for j in range(n):
            s_l, n_l = below[j], j + 1
            s_u, n_u = below[-1] - s_l, n - n_l
            v = (kappa * s_u + (1 - kappa) * s_l) / (kappa * n_u + (1 - kappa) * n_l)
            if j == n - 1 or v <= x[j + 1]:
                out[b] = v
                break
    return out


def _row_values(values, mask):
    return [values[b][mask[b]] for b in range(values.shape[0])]


@mistake(masked_expectile, "you returned the mean: that is the 1/2-expectile; for kappa != 1/2 the residuals above "
         "v weigh kappa and those below weigh 1 - kappa")
def _ex_mean(values, kappa, mask):
    return torch.stack([x.mean() if x.numel() else torch.zeros((), dtype=values.dtype)
                        for x in _row_values(values, mask)])


@mistake(masked_expectile, "you returned the kappa-QUANTILE, the minimiser of the pinball loss "
         "|kappa - 1[u<0]| |u|; the expectile loss squares u, so its minimiser balances sums of residuals, not counts")
def _ex_quantile(values, kappa, mask):
    return torch.stack([torch.quantile(x, kappa) if x.numel() else torch.zeros((), dtype=values.dtype)
                        for x in _row_values(values, mask)])


@mistake(masked_expectile, "the weights are swapped (that is the (1 - kappa)-expectile): residuals ABOVE v weigh "
         "kappa, so for kappa > 1/2 the expectile lies above the mean")
def _ex_swapped(values, kappa, mask):
    return masked_expectile(values, 1.0 - kappa, mask)


@mistake(masked_expectile, "the padding counts: take only the entries where mask is true (and a row with none "
         "gives 0)")
def _ex_unmasked(values, kappa, mask):
    return masked_expectile(values, kappa, torch.ones_like(mask))


# ------------------------------------------------------------------- 2. sampled_cql_term
# (was cql_term: rlkit.offline.cql_penalty, which the chapter shows, passed its check as a one-line
# call; issue 23. The exercise now estimates the log-sum-exp from sampled tokens, as a vocabulary of
# 150 000 tokens would need.)

def _scql_cases():
    g = torch.Generator().manual_seed(2102)
    N, T, V, K = 3, 4, 6, 4
    q = torch.randn(N, T, V, generator=g, dtype=F64) * 2
    a = torch.randint(0, V, (N, T), generator=g)
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    mu = torch.log_softmax(torch.randn(N, T, V, generator=g, dtype=F64), -1)
    smp = torch.multinomial(mu.exp().reshape(-1, V), K, replacement=True, generator=g).reshape(N, T, K)
    lp = mu.gather(-1, smp)
    qj, lpj = q.clone(), lp.clone()
    qj[~m] = 50.0                                         # padded states hold huge values on purpose
    lpj[~m] = -1e4
    big = q * 40 + 800.0                                  # e^Q overflows float64
    every = torch.arange(V).expand(N, T, V)               # each token once under a uniform proposal: exact
    uni = torch.full((N, T, V), -math.log(V), dtype=F64)
    hand_q = torch.log(torch.tensor([[[1.0, 2.0, 1.0]]], dtype=F64))
    return [
        Case(args=(hand_q, torch.tensor([[1]]), torch.tensor([[True]]), torch.tensor([[[0, 1]]]),
                   torch.full((1, 1, 2), -math.log(3), dtype=F64)),
             label="hand case: Q = log(1, 2, 1), logged 1, samples 0 and 1 at mu = 1/3: log 4.5 - log 2"),
        Case(args=(q, a, m, smp, lp), label="3 x 4 states, 6 tokens, 4 samples from mu each, some padding"),
        Case(args=(qj, a, m, smp, lpj), label="the same with Q = 50 and log mu = -1e4 at padded states"),
        Case(args=(big, a, m, smp, lp), label="Q near 800 (e^Q overflows): needs a log-sum-exp"),
        Case(args=(q, a, m, every, uni), label="every token once, uniform proposal: the exact penalty"),
        Case(args=(q, a, torch.zeros(N, T, dtype=torch.bool), smp, lp), label="all-false mask: 0"),
    ]


@exercise(chapter=21, cases=_scql_cases, atol=1e-9,
          description="CQL's log-sum-exp penalty estimated from K sampled tokens by importance sampling")
def sampled_cql_term(q, actions, mask, samples, sample_logprobs):
    """Mean over real states of log (1/K) sum_j e^(Q(h, a_j) - log mu(a_j | h)) - Q(h, a_D)."""
    k = samples.shape[-1]
    w = q.gather(-1, samples) - sample_logprobs
    pen = torch.logsumexp(w, -1) - math.log(k) - q.gather(-1, actions[..., None]).squeeze(-1)
    pen = torch.where(mask, pen, torch.zeros_like(pen))
    return pen.sum() / mask.sum().clamp_min(1)


def _scql(q, actions, mask, samples, sample_logprobs, inner, log_k=True):
    k = samples.shape[-1]
    pen = torch.logsumexp(inner(q.gather(-1, samples), sample_logprobs), -1) - (math.log(k) if log_k else 0.0)
    pen = pen - q.gather(-1, actions[..., None]).squeeze(-1)
    pen = torch.where(mask, pen, torch.zeros_like(pen))
    return pen.sum() / mask.sum().clamp_min(1)


@mistake(sampled_cql_term, "the importance weights are missing: the tokens come from mu, not uniformly, so each "
         "e^Q(h, a_j) must be divided by mu(a_j | h) (subtract the log-prob inside the log-sum-exp)")
def _scql_no_weights(q, actions, mask, samples, sample_logprobs):
    return _scql(q, actions, mask, samples, sample_logprobs, lambda qs, lp: qs)


@mistake(sampled_cql_term, "you summed over the K samples: the estimate of sum_a e^Q(h, a) is the MEAN over the "
         "samples of e^Q / mu (your penalty is log K too high)")
def _scql_sum(q, actions, mask, samples, sample_logprobs):
    return _scql(q, actions, mask, samples, sample_logprobs, lambda qs, lp: qs - lp, log_k=False)


@mistake(sampled_cql_term, "you multiplied e^Q by mu instead of dividing by it: the importance weight of a token "
         "drawn from mu is 1 / mu")
def _scql_times_mu(q, actions, mask, samples, sample_logprobs):
    return _scql(q, actions, mask, samples, sample_logprobs, lambda qs, lp: qs + lp)


@mistake(sampled_cql_term, "you used the exact log-sum-exp over the whole vocabulary; the exercise estimates it "
         "from the sampled tokens, as a vocabulary too large to sum needs")
def _scql_exact(q, actions, mask, samples, sample_logprobs):
    pen = torch.logsumexp(q, -1) - q.gather(-1, actions[..., None]).squeeze(-1)
    pen = torch.where(mask, pen, torch.zeros_like(pen))
    return pen.sum() / mask.sum().clamp_min(1)


@mistake(sampled_cql_term, "padded states were averaged in; only the real states (mask) count")
def _scql_no_mask(q, actions, mask, samples, sample_logprobs):
    return _scql(q, actions, torch.ones_like(mask), samples, sample_logprobs, lambda qs, lp: qs - lp)


# ------------------------------------------------------------------- 3. doubly_robust

def _dr_cases():
    g = torch.Generator().manual_seed(2103)
    n = 12
    lr = torch.randn(n, generator=g, dtype=F64)
    r = (torch.rand(n, generator=g, dtype=F64) < 0.5).to(F64)
    rh = torch.rand(n, generator=g, dtype=F64)
    v = torch.rand(n, generator=g, dtype=F64)
    return [
        Case(args=(torch.log(torch.tensor([2.0, 0.5], dtype=F64)), torch.tensor([1.0, 0.0], dtype=F64),
                   torch.tensor([0.5, 0.5], dtype=F64), torch.tensor([0.6, 0.4], dtype=F64)),
             label="hand case: ratios 2 and 0.5: [0.6 + 2(0.5)] and [0.4 + 0.5(-0.5)] average 0.875"),
        Case(args=(lr, r, rh, v), label="12 logged responses with random ratios, rewards and models"),
        Case(args=(lr, r, r.clone(), v), label="a perfect reward model on the logged responses: DR = DM"),
    ]


@exercise(chapter=21, cases=_dr_cases, atol=1e-10, description="the doubly robust off-policy estimate")
def doubly_robust(log_ratios, rewards, reward_hat, target_values):
    """mean_i [ v_hat(x_i) + rho_i (r_i - r_hat(x_i, y_i)) ] with rho_i = exp(log_ratios[i])."""
    return (target_values + torch.exp(log_ratios) * (rewards - reward_hat)).mean()


@mistake(doubly_robust, "the correction r - r_hat was not importance-weighted: it must be multiplied by the ratio "
         "rho_i, because the logged responses come from mu, not from the target")
def _dr_unweighted(log_ratios, rewards, reward_hat, target_values):
    return (target_values + (rewards - reward_hat)).mean()


@mistake(doubly_robust, "the log-ratio was used as the weight; the ratio is rho_i = exp(log_ratios[i])")
def _dr_log_weight(log_ratios, rewards, reward_hat, target_values):
    return (target_values + log_ratios * (rewards - reward_hat)).mean()


@mistake(doubly_robust, "the ratio also multiplies v_hat(x_i); the direct-method term is already an expectation "
         "under the target and needs no weight")
def _dr_weighted_dm(log_ratios, rewards, reward_hat, target_values):
    return (torch.exp(log_ratios) * (target_values + rewards - reward_hat)).mean()


@mistake(doubly_robust, "the sign of the correction is flipped: add rho_i (r_i - r_hat), the model's error on the "
         "logged response")
def _dr_sign(log_ratios, rewards, reward_hat, target_values):
    return (target_values - torch.exp(log_ratios) * (rewards - reward_hat)).mean()
