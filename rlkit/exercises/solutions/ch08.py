r"""Checkers for the exercises of chapter 8, ``lessons/08_why_offpolicy.ipynb``.

* ``behaviour_logprobs(logp_versions, versions, mask)``: the behaviour log-probabilities of a batch
  that mixes policy versions. ``logp_versions[v, b, t]`` is the log-probability of token ``t`` of
  response ``b`` under version ``v``; ``versions`` says which version produced each response
  (``[B]``) or each token (``[B, T]``, in-flight weight updates). Returns
  :math:`\log\mu_{b,t} = \log\pi^{(v_{b,t})}(y_{b,t})` ``[B, T]``, 0 at padding.
* ``masked_is_weights(logp_learner, logp_sampler, mask, cap, level)``: masked importance weights for
  the sampler/learner mismatch: the token ratio :math:`\rho_t = \pi_{\text{learner}}(y_t)/\pi_{\text{sampler}}(y_t)`,
  set to 0 where it exceeds the cap (``level="token"``) or on every token of a response whose sequence ratio
  exceeds it (``level="sequence"``), 0 at padding, ``[B, T]``. (The chapter displays
  ``rlkit.offpolicy.importance_ratio``; the truncated weights ``importance_ratio(...).clamp(max=cap)`` are
  one of the mistakes.)
* ``lognormal_tail_share(lengths, token_mean, token_var, low, high)``: the share of sequence ratios
  outside ``[low, high]`` when :math:`\log\rho_{1:T} \sim \mathcal N(T\bar\ell, T s^2)`, with
  :math:`\bar\ell` = ``token_mean`` (:math:`-\kappa` in the chapter) and :math:`s^2` = ``token_var``:
  :math:`\Phi\big(\frac{\log a - T\bar\ell}{s\sqrt T}\big) + 1 - \Phi\big(\frac{\log b - T\bar\ell}{s\sqrt T}\big)`
  with :math:`a, b` = ``low``, ``high``.
* ``stale_advantage_error(v_behaviour, v_current, eps)``: for a 0/1 reward and GRPO's population
  advantage :math:`A_v(R) = (R - v)/(\sqrt{v(1-v)} + \zeta)` (:math:`\zeta` = ``eps``), the expected error
  :math:`\mathbb E_{R\sim\mathrm{Bernoulli}(v_b)}\big|A_{v_b}(R) - A_{v_c}(R)\big|` of advantages
  computed with the behaviour version's statistics instead of the current version's; for
  :math:`\zeta = 0` it equals :math:`|v_c - v_b|/\sqrt{v_c(1-v_c)}` (both differences share a sign).

Shapes: LLM tensors ``[batch, tokens]`` with a 0/1 ``mask``; ``lengths`` ``[N]``; success
probabilities any shape (elementwise).
"""
from __future__ import annotations

import math

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []
F64 = torch.float64


# ------------------------------------------------------------------- 1. behaviour_logprobs

def _bl_cases():
    g = torch.Generator().manual_seed(808)
    lp = -3 * torch.rand(3, 5, 4, generator=g)
    mask = torch.tensor([[1., 1., 1., 1.], [1., 1., 0., 0.], [1., 1., 1., 0.], [1., 0., 0., 0.],
                         [1., 1., 1., 1.]])
    per_row = torch.tensor([0, 2, 1, 0, 2])
    lp2 = -3 * torch.rand(4, 3, 6, generator=g)
    mask2 = torch.tensor([[1., 1., 1., 1., 1., 1.], [1., 1., 1., 1., 0., 0.], [1., 1., 1., 1., 1., 0.]])
    per_token = torch.tensor([[0, 0, 1, 1, 2, 3], [1, 1, 1, 2, 2, 2], [0, 1, 2, 3, 3, 3]])
    return [
        Case(args=(torch.tensor([[[-1.0, -2.0]], [[-0.5, -0.25]]]), torch.tensor([0]), torch.tensor([[1.0, 0.0]])),
             label="one response from version 0 of 2, one padding token: [[-1, 0]]"),
        Case(args=(lp, per_row, mask), label="5 responses from versions 0, 2, 1, 0, 2 of 3"),
        Case(args=(lp2, per_token, mask2),
             label="in-flight weight updates: the version changes inside each response"),
    ]


@exercise(chapter=8, cases=_bl_cases, description="Behaviour log-probabilities of a batch that mixes policy versions.")
def behaviour_logprobs(logp_versions, versions, mask):
    r""":math:`\log\mu_{b,t} = \text{logp\_versions}[v_{b,t}, b, t]` on real tokens, 0 at padding.

    ``logp_versions [M, B, T]``, ``versions`` long ``[B]`` or ``[B, T]``, ``mask [B, T]`` -> ``[B, T]``.
    """
    sizes = V.layout("M B T", floating=True, logp_versions=logp_versions)
    M, B, T = logp_versions.shape
    per_token = isinstance(versions, torch.Tensor) and versions.dim() == 2
    V.index_tensor(versions, "versions", shape=(B, T) if per_token else (B,),
                   shape_of="[B] or [B, T]", n=sizes["M"])
    m = V.check_mask(mask, logp_versions[0], "one version's log-probs, logp_versions[0]", as_bool=True)
    idx = versions if per_token else versions[:, None].expand(B, T)
    picked = logp_versions.gather(0, idx[None]).squeeze(0)
    return torch.where(m, picked, torch.zeros((), dtype=picked.dtype))


@mistake(behaviour_logprobs, "every response was scored with the NEWEST version; each response (or token) "
         "must be divided by the version that actually produced it")
def _bl_newest(logp_versions, versions, mask):
    return logp_versions[-1] * mask


@mistake(behaviour_logprobs, "version ids were read as lags counted back from the newest version: "
         "versions[b] is an index into logp_versions, 0 = the first (oldest) version kept")
def _bl_lag_index(logp_versions, versions, mask):
    return behaviour_logprobs(logp_versions, logp_versions.shape[0] - 1 - versions, mask)


@mistake(behaviour_logprobs, "one version per response was used, the version of its first token; "
         "with in-flight weight updates (versions of shape [B, T]) every token has its own version")
def _bl_first_token_version(logp_versions, versions, mask):
    return behaviour_logprobs(logp_versions, versions if versions.dim() == 1 else versions[:, 0], mask)


@mistake(behaviour_logprobs, "padding positions keep a log-probability; set them to 0 so that sums over "
         "tokens see only the real response")
def _bl_unmasked(logp_versions, versions, mask):
    return behaviour_logprobs(logp_versions, versions, torch.ones_like(mask))


# ------------------------------------------------------------------- 2. masked_is_weights

def _tis_cases():
    g = torch.Generator().manual_seed(818)
    samp = -4 * torch.rand(4, 7, generator=g)
    learn = samp + 0.8 * torch.randn(4, 7, generator=g)
    mask = (torch.arange(7)[None, :] < torch.tensor([[7], [5], [3], [6]])).float()
    learn_pad = torch.where(mask.bool(), learn, torch.full_like(learn, 30.0))      # garbage in the padding
    extreme_l = torch.tensor([[-0.5, -60.0, -1.0, -2.0], [-1.0, -1.2, -0.9, -3.0]])
    extreme_s = torch.tensor([[-50.5, -10.0, -1.0, -2.0], [-1.1, -1.0, -1.0, -3.0]])
    seq_l = torch.tensor([[-0.5, -0.5, -0.5, -0.5], [-1.0, -1.0, -1.0, -1.0], [-2.0, -0.1, -1.0, 0.0]])
    seq_s = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-1.1, -1.1, -0.8, -1.0], [-1.0, -1.0, -1.0, 0.0]])
    seq_m = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    return [
        Case(args=(torch.tensor([[-0.1, -2.0, -1.0]]), torch.tensor([[-1.1, -1.0, -1.0]]),
                   torch.tensor([[1.0, 1.0, 0.0]]), 2.0),
             label="token level, log-ratios +1 and -1, cap 2: weights [0, e^-1, 0] (e > 2 is masked)"),
        Case(args=(torch.tensor([[-0.1, -2.0, -1.0]]), torch.tensor([[-1.1, -1.0, -1.0]]),
                   torch.tensor([[1.0, 1.0, 0.0]]), 2.0), kwargs={"level": "sequence"},
             label="the same at the sequence level: the response's ratio e^0 = 1 <= 2 keeps [e, e^-1, 0]"),
        Case(args=(seq_l, seq_s, seq_m, 2.0), kwargs={"level": "sequence"},
             label="sequence level: ratios e^2 (dropped), e^0 over 3 real tokens (kept), e^-0.1 (kept)"),
        Case(args=(learn_pad, samp, mask, 2.0), label="token level, 4 responses, padding holds log-probability 30"),
        Case(args=(learn_pad, samp, mask, 5.0), kwargs={"level": "sequence"},
             label="sequence level, cap 5, the same 4 responses with garbage in the padding"),
        Case(args=(extreme_l.double(), extreme_s.double(), torch.ones(2, 4, dtype=torch.float64), 3.0),
             kwargs={"level": "sequence"},
             label="float64, sequence level: a response with token log-ratios +50 and -50 (sum 0: kept)"),
        Case(args=(extreme_l, extreme_s, torch.ones(2, 4), 3.0),
             label="token level, log-ratios of +50 and -50: [0, e^-50, 1, 1]"),
    ]


@exercise(chapter=8, cases=_tis_cases, rtol=1e-5,
          description="Masked importance weights: ratios above the cap are dropped, by token or by response.")
def masked_is_weights(logp_learner, logp_sampler, mask, cap, level="token"):
    r"""Token ratios :math:`\rho_t = \pi_{\text{learner}}/\pi_{\text{sampler}}`; ``level="token"``: 0 where
    :math:`\rho_t > C`; ``level="sequence"``: every token of a response whose ratio
    :math:`\exp\sum_t m_t\log\rho_t` exceeds :math:`C` gets 0. Kept tokens keep :math:`\rho_t`; padding 0."""
    V.matching_floats(logp_learner=logp_learner, logp_sampler=logp_sampler)
    m = V.check_mask(mask, logp_learner, "logp_learner", as_bool=True)
    cap = V.real_in(cap, "cap (typically 2 to 10)", 0.0, lo_open=True)
    if level not in ("token", "sequence"):
        raise ValueError(f"level: expected 'token' or 'sequence', got {level!r}")
    zero = torch.zeros((), dtype=logp_learner.dtype)
    log_rho = torch.where(m, logp_learner - logp_sampler, zero)
    if level == "token":
        keep = log_rho <= math.log(cap)
    else:
        keep = (log_rho.sum(-1, keepdim=True) <= math.log(cap)).expand_as(log_rho)
    return torch.where(m & keep, torch.exp(torch.where(keep, log_rho, zero)), zero)


@mistake(masked_is_weights, "you truncated the token ratios, min(ratio, cap), at both levels: masked importance "
         "sampling DROPS a token whose ratio exceeds the cap (weight 0), where truncation keeps it at the cap, and "
         "level='sequence' drops whole responses")
def _mis_truncated_tokens(logp_learner, logp_sampler, mask, cap, level="token"):
    m = mask.bool()
    log_rho = torch.where(m, logp_learner - logp_sampler, torch.zeros_like(logp_learner))
    return torch.where(m, torch.exp(log_rho.clamp(max=math.log(cap))), torch.zeros_like(log_rho))


@mistake(masked_is_weights, "you truncated, min(ratio, cap): masked importance sampling DROPS a token (or a "
         "response) whose ratio exceeds the cap, weight 0, where truncation would keep it at the cap")
def _mis_truncated(logp_learner, logp_sampler, mask, cap, level="token"):
    m = mask.bool()
    log_rho = torch.where(m, logp_learner - logp_sampler, torch.zeros_like(logp_learner))
    if level == "token":
        w = torch.exp(log_rho.clamp(max=math.log(cap)))
    else:
        s = log_rho.sum(-1, keepdim=True)
        w = torch.exp(log_rho) * torch.exp(torch.clamp(math.log(cap) - s, max=0.0))
    return torch.where(m, w, torch.zeros_like(w))


@mistake(masked_is_weights, "ratios below 1/cap were dropped too; the mask removes only ratios ABOVE the cap "
         "(the ones that blow up the variance): a token the sampler over-produced keeps its small weight")
def _mis_two_sided(logp_learner, logp_sampler, mask, cap, level="token"):
    m = mask.bool()
    log_rho = torch.where(m, logp_learner - logp_sampler, torch.zeros_like(logp_learner))
    s = log_rho if level == "token" else log_rho.sum(-1, keepdim=True).expand_as(log_rho)
    keep = (s <= math.log(cap)) & (s >= -math.log(cap))
    return torch.where(m & keep, torch.exp(torch.where(keep, log_rho, torch.zeros_like(log_rho))),
                       torch.zeros_like(log_rho))


@mistake(masked_is_weights, "the mask is ignored: padding positions got the weight of whatever "
         "log-probabilities they hold; they are not tokens of the response and must get weight 0")
def _mis_unmasked(logp_learner, logp_sampler, mask, cap, level="token"):
    ones = torch.ones_like(logp_learner)
    return masked_is_weights(logp_learner, logp_sampler, ones, cap, level)


@mistake(masked_is_weights, "the padding was summed into the sequence log-ratio: only the real tokens of a "
         "response make its ratio, exp(sum_t m_t log rho_t)")
def _mis_padding_in_sum(logp_learner, logp_sampler, mask, cap, level="token"):
    if level == "token":
        return masked_is_weights(logp_learner, logp_sampler, mask, cap, level)
    m = mask.bool()
    log_rho = logp_learner - logp_sampler
    keep = (log_rho.sum(-1, keepdim=True) <= math.log(cap)).expand_as(log_rho)
    return torch.where(m & keep, torch.exp(torch.where(m & keep, log_rho, torch.zeros_like(log_rho))),
                       torch.zeros_like(log_rho))


@mistake(masked_is_weights, "every kept token got the response's ratio: at the sequence level the RESPONSE is kept "
         "or dropped, but each kept token keeps its own token ratio rho_t")
def _mis_sequence_ratio_on_tokens(logp_learner, logp_sampler, mask, cap, level="token"):
    if level == "token":
        return masked_is_weights(logp_learner, logp_sampler, mask, cap, level)
    m = mask.bool()
    log_rho = torch.where(m, logp_learner - logp_sampler, torch.zeros_like(logp_learner))
    s = log_rho.sum(-1, keepdim=True).expand_as(log_rho)
    keep = s <= math.log(cap)
    return torch.where(m & keep, torch.exp(torch.where(keep, s, torch.zeros_like(s))), torch.zeros_like(s))


@mistake(masked_is_weights, "the ratio is upside down: the weight corrects samples of the SAMPLER towards the "
         "LEARNER, pi_learner / pi_sampler")
def _mis_inverted(logp_learner, logp_sampler, mask, cap, level="token"):
    return masked_is_weights(logp_sampler, logp_learner, mask, cap, level)


@mistake(masked_is_weights, "the level was ignored: level='sequence' drops whole responses whose sequence ratio "
         "exceeds the cap, not single tokens")
def _mis_token_always(logp_learner, logp_sampler, mask, cap, level="token"):
    return masked_is_weights(logp_learner, logp_sampler, mask, cap, "token")


# ------------------------------------------------------------------- 3. lognormal_tail_share

def _tails(mean, std, low, high):
    r"""The shares below and above the band,
    :math:`(\Phi(\frac{\log \ell - \mu}{\sigma}),\ 1 - \Phi(\frac{\log h - \mu}{\sigma}))`."""
    below = torch.special.ndtr((math.log(low) - mean) / std)
    above = 1.0 - torch.special.ndtr((math.log(high) - mean) / std)
    return below, above


def _lts_cases():
    lengths = torch.tensor([1, 4, 16, 64, 256, 1024])
    return [
        Case(args=(torch.tensor([1.0]), 0.0, 1.0), kwargs={"low": math.exp(-1.0), "high": math.e},
             label="one token, log-ratio ~ N(0, 1), band [1/e, e]: 2(1 - Phi(1)) = 0.3173"),
        Case(args=(lengths, -0.0085, 0.017), label="lengths 1 to 1024, per-token mean -0.0085, variance 0.017"),
        Case(args=(lengths.double(), -0.02, 0.04), kwargs={"low": 0.8, "high": 1.25},
             label="PPO-like band [0.8, 1.25], a larger per-token mismatch"),
    ]


@exercise(chapter=8, cases=_lts_cases, atol=1e-9, rtol=1e-7,
          description="Gaussian prediction of the share of sequence ratios outside [low, high].")
def lognormal_tail_share(lengths, token_mean, token_var, low=0.5, high=2.0):
    r""":math:`P(\rho_{1:T}\notin[a,b])` for :math:`\log\rho_{1:T}\sim\mathcal N(T\bar\ell, Ts^2)`;
    ``lengths [N]`` -> ``[N]`` float64."""
    V.layout("N", lengths=lengths)
    V.tensor_in(lengths, "lengths (response lengths)", 1, math.inf)
    token_mean = V.real_in(token_mean, "token_mean")
    token_var = V.real_in(token_var, "token_var", 0.0, lo_open=True)
    low = V.real_in(low, "low", 0.0, lo_open=True)
    high = V.real_in(high, "high (above low)", low, lo_open=True)
    T = lengths.to(F64)
    below, above = _tails(T * token_mean, torch.sqrt(T * token_var), low, high)
    return below + above


@mistake(lognormal_tail_share, "the drift is missing: log rho_{1:T} has mean T * token_mean (= -T * KL per token), "
         "and this drift is what pushes most sequence ratios below `low`")
def _lts_no_drift(lengths, token_mean, token_var, low=0.5, high=2.0):
    return lognormal_tail_share(lengths, 0.0, token_var, low, high)


@mistake(lognormal_tail_share, "the spread grows like sqrt(T) (a sum of T independent terms has variance "
         "T * token_var), not like T")
def _lts_std_linear(lengths, token_mean, token_var, low=0.5, high=2.0):
    T = lengths.to(F64)
    return sum(_tails(T * token_mean, T * math.sqrt(token_var), low, high))


@mistake(lognormal_tail_share, "the mean of a sum of T tokens is T * token_mean, not token_mean")
def _lts_mean_not_scaled(lengths, token_mean, token_var, low=0.5, high=2.0):
    T = lengths.to(F64)
    return sum(_tails(torch.full_like(T, token_mean), torch.sqrt(T * token_var), low, high))


@mistake(lognormal_tail_share, "only ratios above `high` were counted; ratios below `low` count too (and are "
         "the majority once the drift dominates)")
def _lts_upper_only(lengths, token_mean, token_var, low=0.5, high=2.0):
    T = lengths.to(F64)
    return _tails(T * token_mean, torch.sqrt(T * token_var), low, high)[1]


@mistake(lognormal_tail_share, "token_var is a variance; the per-token standard deviation is its square root")
def _lts_var_as_std(lengths, token_mean, token_var, low=0.5, high=2.0):
    return lognormal_tail_share(lengths, token_mean, token_var ** 2, low, high)


# ------------------------------------------------------------------- 4. stale_advantage_error

def _adv(r, v, eps):
    return (r - v) / (torch.sqrt(v * (1 - v)) + eps)


def _sae_cases():
    g = torch.Generator().manual_seed(848)
    vb = 0.02 + 0.96 * torch.rand(12, generator=g, dtype=F64)
    vc = (vb + 0.3 * torch.randn(12, generator=g, dtype=F64)).clamp(0.02, 0.98)
    return [
        Case(args=(torch.tensor([0.2], dtype=F64), torch.tensor([0.9], dtype=F64), 0.0),
             label="v_b = 0.2, v_c = 0.9, eps = 0: 0.2 |2 - 1/3| + 0.8 |-0.5 + 3| = 7/3"),
        Case(args=(torch.tensor([0.5, 0.3], dtype=F64), torch.tensor([0.5, 0.3], dtype=F64)),
             label="fresh statistics: error 0"),
        Case(args=(vb, vc), label="12 prompts whose success probability moved"),
        Case(args=(vb.reshape(3, 4), vc.reshape(3, 4), 1e-3), label="a [3, 4] batch, eps = 1e-3"),
    ]


@exercise(chapter=8, cases=_sae_cases, atol=1e-9, rtol=1e-7,
          description="Expected error of GRPO advantages computed with stale group statistics.")
def stale_advantage_error(v_behaviour, v_current, eps=1e-6):
    r""":math:`v_b\,|A_{v_b}(1) - A_{v_c}(1)| + (1 - v_b)\,|A_{v_b}(0) - A_{v_c}(0)|`, elementwise."""
    V.matching_floats(min_dim=0, v_behaviour=v_behaviour, v_current=v_current)
    V.tensor_in(v_behaviour, "v_behaviour (success probabilities)", 0.0, 1.0)
    V.tensor_in(v_current, "v_current (success probabilities)", 0.0, 1.0)
    eps = V.real_in(eps, "eps", 0.0)
    vb, vc = v_behaviour, v_current
    return (vb * (_adv(1.0, vb, eps) - _adv(1.0, vc, eps)).abs()
            + (1 - vb) * (_adv(0.0, vb, eps) - _adv(0.0, vc, eps)).abs())


@mistake(stale_advantage_error, "your error is |v_c - v_b| / sqrt(v_b (1 - v_b)): either both advantages were "
         "divided by the behaviour version's standard deviation (the fresh one uses sqrt(v_c (1 - v_c))), or the "
         "expectation was taken with the current success probability (the responses were sampled by the "
         "behaviour version, so R = 1 has probability v_behaviour)")
def _sae_behaviour_std(v_behaviour, v_current, eps=1e-6):
    # both advantages divided by the behaviour std (equivalently: expectation under v_current)
    vb, vc = v_behaviour, v_current
    s = torch.sqrt(vb * (1 - vb)) + eps
    return vb * ((1 - vb) / s - (1 - vc) / s).abs() + (1 - vb) * ((-vb) / s - (-vc) / s).abs()


@mistake(stale_advantage_error, "that is the error of the raw advantage R - v; GRPO also divides by the "
         "group's standard deviation sqrt(v (1 - v)), which moves with v too")
def _sae_unnormalised(v_behaviour, v_current, eps=1e-6):
    return (v_current - v_behaviour).abs()


@mistake(stale_advantage_error, "the error is signed; the exercise asks for the expected ABSOLUTE error, which is "
         "never negative")
def _sae_signed(v_behaviour, v_current, eps=1e-6):
    return (v_current - v_behaviour) / (torch.sqrt(v_current * (1 - v_current)) + eps)
