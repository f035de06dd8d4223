r"""Learned, imperfect reward models, and policies optimised against them (chapter 5).

An RLHF reward model is a network fitted to a *limited* sample of comparisons between responses
that a *reference* policy (the SFT model) wrote.  Where the reference policy rarely goes, the
reward model has seen no data and extrapolates; a policy optimised hard enough against it goes
exactly there.  This module holds everything the chapter needs to watch that happen on a problem
small enough to be solved exactly:

* a "response" space: every sequence of ``length`` tokens from a vocabulary of ``vocab_size``
  (:func:`enumerate_responses`), featurised by token counts (:func:`token_counts`);
* :class:`ResponseBandit`, a one-prompt contextual bandit over that space with a known true
  reward and a reference policy (:func:`flattery_bandit` builds the chapter's instance);
* a small MLP reward net (:class:`RewardNet`) fitted to simulated Bradley-Terry preferences
  (:func:`simulate_preferences`, :func:`bradley_terry_loss`, :func:`fit_bradley_terry`; the
  whole step in one call: :func:`fit_reward_model`);
* the policies one gets by optimising the learned (proxy) reward:

  - :func:`kl_regularised_optimum`, the closed form
    :math:`\pi_\beta(y) \propto \pi_{ref}(y)\,e^{\hat r(y)/\beta}` of
    :math:`\max_\pi \mathbb E_\pi[\hat r] - \beta\,\mathrm{KL}(\pi\,\|\,\pi_{ref})`;
  - :func:`optimise_policy`, gradient ascent on that objective (exact gradient, or the sampled
    REINFORCE estimate with the KL folded into the reward, as RLHF trainers do);
  - :func:`best_of_n`, the exact distribution of best-of-n sampling under the proxy;

* :func:`policy_summary`, exact :math:`\mathrm{KL}(\pi\,\|\,\pi_{ref})` and expected rewards.

Policies over the response space are given by log-probabilities (or logits) ``[N]`` over the
``N = vocab_size ** length`` responses: the bandit view of an LLM, where the prompt is the state
and the whole response is one action.

Chapter: 05_onpolicy_offpolicy_drift (reward-model drift, reward hacking, the Goodhart curve of
Gao et al., 2023).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from . import _validate as V
from .divergences import kl_categorical
from .nets import mlp

Tensor = torch.Tensor

__all__ = ["enumerate_responses", "token_counts", "ResponseBandit", "flattery_bandit", "RewardNet",
           "simulate_preferences", "bradley_terry_loss", "fit_bradley_terry", "fit_reward_model",
           "kl_regularised_optimum", "best_of_n", "policy_summary", "optimise_policy"]

_MAX_RESPONSES = 2_000_000


# ----------------------------------------------------------------------------- the response space

def _per_response(**tensors: Tensor) -> None:
    """Check tensors ``[N]`` over the enumerated responses: 1-D, floating, one shape, dtype and device."""
    V.layout("N", **tensors)
    V.matching_floats(**tensors)


def enumerate_responses(vocab_size: int, length: int) -> Tensor:
    """Every sequence of ``length`` tokens from ``{0, ..., vocab_size - 1}``, in lexicographic order.

    Row ``i`` is ``i`` written in base ``vocab_size`` with the first token most significant.

    Returns: int64 ``[vocab_size ** length, length]``.  Chapter: 05_onpolicy_offpolicy_drift.
    """
    V.positive_int(vocab_size, "vocab_size")
    V.positive_int(length, "length")
    n = V.fits(vocab_size ** length, "vocab_size ** length", _MAX_RESPONSES, "the most responses enumerated")
    idx = torch.arange(n)
    powers = vocab_size ** torch.arange(length - 1, -1, -1)
    return (idx[:, None] // powers) % vocab_size


def token_counts(responses: Tensor, vocab_size: int) -> Tensor:
    """Bag-of-words features: ``counts[..., v]`` = how often token ``v`` occurs in a response.

    Args:
        responses: int64 ``[..., length]`` token ids in ``[0, vocab_size)``.

    Returns: float32 ``[..., vocab_size]`` (each row sums to ``length``).
    """
    V.positive_int(vocab_size, "vocab_size")
    V.layout("... length", responses=V.index_tensor(responses, "responses", n=vocab_size))
    return nn.functional.one_hot(responses, vocab_size).sum(-2).float()


@dataclass
class ResponseBandit:
    """A one-prompt contextual bandit over an enumerated response space.

    Attributes:
        responses: int64 ``[N, L]`` every response.
        features: float32 ``[N, F]`` what a reward model sees of each response.
        true_reward: float32 ``[N]`` the reward we actually care about (the "gold" reward).
        ref_logprobs: float32 ``[N]`` log pi_ref(y) of the reference (SFT) policy, normalised.
        token_names: a name per token id (for plots).
    """
    responses: Tensor
    features: Tensor
    true_reward: Tensor
    ref_logprobs: Tensor
    token_names: tuple

    def sample(self, n: int, logprobs: Tensor | None = None, generator: torch.Generator | None = None) -> Tensor:
        """Indices ``[n]`` of responses drawn from ``softmax(logprobs)`` (default: pi_ref)."""
        V.positive_int(n, "n")
        lp = self.ref_logprobs if logprobs is None else logprobs
        V.exact_shape(V.float_tensor(lp, "logprobs"), "logprobs", self.true_reward.shape, "[N], one per response")
        return torch.multinomial(torch.softmax(lp, -1), n, replacement=True, generator=generator)


def flattery_bandit(length: int = 6, p_flattery: float = 0.06, quality=(0.0, 0.25, 0.5, 1.0),
                    content_probs=(0.1, 0.2, 0.3, 0.4), flattery_gain: float = 0.35,
                    flattery_budget: int = 3, flattery_penalty: float = 0.8) -> ResponseBandit:
    r"""The chapter's hackable task: answers made of content tokens and a "flattery" token.

    Vocabulary: content tokens ``c0 .. c{K-1}`` with qualities ``quality`` and a flattery token
    ``F`` (id ``K``).  A response is ``length`` tokens.  With :math:`n_F` flattery tokens,

    .. math::  r^*(y) = \frac1L \sum_{t:\,y_t \ne F} q(y_t) \;+\; g\,n_F \;-\; d\,\max(0,\, n_F - b)^2 ,

    the mean content quality (flattery carries none) plus a politeness bonus: each of the first
    ``b = flattery_budget`` flattery tokens is worth ``g = flattery_gain``, and every one beyond
    costs more and more (``d = flattery_penalty``): an answer that is mostly flattery reads as spam.
    The reference policy writes every position independently: ``F`` with probability
    ``p_flattery``, a content token otherwise (in proportion to ``content_probs``; ``None``
    means uniform).  With the defaults it writes :math:`n_F > b = 3` with probability
    :math:`1.7\cdot 10^{-4}`: the region where the true reward turns down is all but absent from
    any data it produces.  Features are the token counts.

    Returns: a :class:`ResponseBandit` with ``(K + 1) ** length`` responses.
    """
    V.positive_int(length, "length")
    p_flattery = V.real_in(p_flattery, "p_flattery", 0.0, 1.0, lo_open=True, hi_open=True)
    q = V.tensor_in(torch.tensor(V.real_list(quality, "quality"), dtype=torch.float32), "quality")
    V.positive_int(q.numel(), "len(quality)")
    V.finite_float(flattery_gain, "flattery_gain")
    V.positive_int(flattery_budget, "flattery_budget", minimum=0)
    V.finite_float(flattery_penalty, "flattery_penalty", 0.0)
    k = q.numel()
    vocab = k + 1
    responses = enumerate_responses(vocab, length)
    counts = token_counts(responses, vocab)
    n_f = counts[:, k]
    excess = (n_f - flattery_budget).clamp(min=0)
    true = (counts[:, :k] @ q) / length + flattery_gain * n_f - flattery_penalty * excess ** 2
    if content_probs is None:
        pc = torch.full((k,), 1.0 / k)
    else:
        pc = torch.tensor(V.real_list(content_probs, "content_probs"), dtype=torch.float32)
        V.exact_shape(pc, "content_probs", (k,), "one per quality")
        pc = V.tensor_in(pc, "content_probs", 0.0, lo_open=True) / pc.sum()
    p_tok = torch.cat([(1.0 - p_flattery) * pc, torch.tensor([p_flattery])])
    ref_logprobs = (counts @ p_tok.log()).float()
    ref_logprobs = ref_logprobs - torch.logsumexp(ref_logprobs, -1)
    names = tuple(f"c{i}" for i in range(k)) + ("F",)
    return ResponseBandit(responses, counts, true.float(), ref_logprobs, names)


# ----------------------------------------------------------------------------- the reward model

class RewardNet(nn.Module):
    r"""A small MLP reward model :math:`\hat r_\phi(x)`: features ``[..., in_dim]`` -> rewards ``[...]``.

    ReLU hidden layers by default: a ReLU network extrapolates *linearly* outside its data, which
    is the honest picture of why a reward model keeps rewarding "more of the same" far beyond
    anything it was trained on.  Chapter: 05_onpolicy_offpolicy_drift.
    """

    def __init__(self, in_dim: int, hidden: int = 32, layers: int = 2, activation: type[nn.Module] = nn.ReLU):
        super().__init__()
        self.in_dim = V.positive_int(in_dim, "in_dim")
        self.net = mlp(in_dim, 1, hidden, layers, out_std=1.0, activation=activation)

    def forward(self, x: Tensor) -> Tensor:
        V.feature_tensor(x, "x", self.in_dim)
        return self.net(x).squeeze(-1)


def simulate_preferences(r_a: Tensor, r_b: Tensor, scale: float = 1.0,
                         generator: torch.Generator | None = None) -> Tensor:
    r"""Simulated annotators: ``True`` where response a is preferred to b, drawn from Bradley-Terry,

    .. math::  P(a \succ b) = \sigma\big((r_a - r_b) / s\big),

    with noise scale ``s = scale`` (smaller: more reliable annotators).

    Args: r_a, r_b: ``[...]`` true rewards of the two responses (same shape).
    Returns: bool ``[...]``.
    """
    V.float_tensor(r_a, "r_a", min_dim=0)
    V.float_tensor(r_b, "r_b", min_dim=0)
    V.same_layout(r_a, "r_a", r_b, "r_b")
    scale = V.finite_float(scale, "scale", 0.0, lo_open=True)
    p = torch.sigmoid((r_a - r_b) / scale)
    u = torch.rand(p.shape, generator=generator, dtype=p.dtype, device=p.device)
    return u < p


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
    r"""Negative log-likelihood of the preferences under Bradley-Terry, averaged:

    .. math::  L = -\frac1M \sum_i \log \sigma\big(\hat r(y^+_i) - \hat r(y^-_i)\big)
               = \frac1M \sum_i \operatorname{softplus}\big(\hat r(y^-_i) - \hat r(y^+_i)\big).

    Computed with ``softplus`` so that a margin of +-50 gives 0 or 50, never inf or NaN.

    Args: r_chosen, r_rejected: ``[M]`` rewards of the preferred and the other response.
    Returns: a scalar to minimise.  Chapter: 05_onpolicy_offpolicy_drift.
    """
    V.float_tensor(r_chosen, "r_chosen")
    V.float_tensor(r_rejected, "r_rejected")
    V.same_layout(r_chosen, "r_chosen", r_rejected, "r_rejected")
    return nn.functional.softplus(r_rejected - r_chosen).mean()


def fit_bradley_terry(net: nn.Module, x_chosen: Tensor, x_rejected: Tensor, epochs: int = 300,
                      lr: float = 1e-2, weight_decay: float = 0.0, batch_size: int | None = None,
                      generator: torch.Generator | None = None) -> list[float]:
    """Fit a reward net to preference pairs with Adam on :func:`bradley_terry_loss`.

    Args:
        net: maps features ``[..., F]`` to rewards ``[...]`` (e.g. :class:`RewardNet`).
        x_chosen, x_rejected: ``[M, F]`` features of the preferred and the other response.
        epochs: passes over the pairs; ``batch_size`` None means full batch.
        weight_decay: Adam's L2 coefficient.
    Returns: the training loss of every epoch (mean over its minibatches).
    """
    V.instance_of(net, "net", nn.Module, "torch.nn.Module")
    V.float_tensor(x_chosen, "x_chosen", min_dim=2)
    V.float_tensor(x_rejected, "x_rejected", min_dim=2)
    V.same_layout(x_chosen, "x_chosen", x_rejected, "x_rejected")
    epochs = V.positive_int(epochs, "epochs")
    lr = V.finite_float(lr, "lr", 0.0, lo_open=True)
    weight_decay = V.finite_float(weight_decay, "weight_decay", 0.0)
    m = x_chosen.shape[0]
    bs = m if batch_size is None else V.positive_int(batch_size, "batch_size")
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    losses = []
    for _ in range(epochs):
        perm = torch.randperm(m, generator=generator) if bs < m else torch.arange(m)
        total, count = 0.0, 0
        for start in range(0, m, bs):
            idx = perm[start:start + bs]
            loss = bradley_terry_loss(net(x_chosen[idx]), net(x_rejected[idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * idx.numel()
            count += idx.numel()
        losses.append(total / count)
    return losses


def fit_reward_model(task: ResponseBandit, n_pairs: int = 1000, noise: float = 0.1, hidden: int = 32,
                     layers: int = 2, epochs: int = 300, lr: float = 1e-2, weight_decay: float = 0.0,
                     generator: torch.Generator | None = None) -> tuple[RewardNet, Tensor]:
    r"""The whole RLHF reward-modelling step on a :class:`ResponseBandit`.

    Draw ``n_pairs`` pairs of responses from pi_ref, let simulated annotators compare them by the
    true reward (:func:`simulate_preferences` with ``scale=noise``), fit a :class:`RewardNet` with
    :func:`fit_bradley_terry`, and score every response.  Bradley-Terry fixes a reward only up to
    an additive constant (and the annotators' noise sets its scale), so the scores are
    standardised on the reference policy, as RLHF pipelines do:

    .. math::  \hat r(y) = \frac{r_\phi(y) - \mathbb E_{\pi_{ref}}[r_\phi]}{\operatorname{sd}_{\pi_{ref}}[r_\phi]} .

    Returns: ``(net, proxy)`` with ``proxy`` ``[N]`` the standardised reward of every response
    (detached).  The training pairs are ``net.pairs = (chosen_idx, rejected_idx)``.  With a
    ``generator`` everything (pairs, labels, initial weights) is drawn from it, so the same
    generator seed gives the same reward model whatever ran before.
    """
    V.instance_of(task, "task", ResponseBandit)
    n_pairs = V.positive_int(n_pairs, "n_pairs")
    a = task.sample(n_pairs, generator=generator)
    b = task.sample(n_pairs, generator=generator)
    a_wins = simulate_preferences(task.true_reward[a], task.true_reward[b], scale=noise, generator=generator)
    chosen, rejected = torch.where(a_wins, a, b), torch.where(a_wins, b, a)
    if generator is None:
        net = RewardNet(task.features.shape[-1], hidden=hidden, layers=layers)
    else:  # initialise from the generator too, so that the result does not depend on the global RNG
        init_seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)
            net = RewardNet(task.features.shape[-1], hidden=hidden, layers=layers)
    fit_bradley_terry(net, task.features[chosen], task.features[rejected], epochs=epochs, lr=lr,
                      weight_decay=weight_decay, generator=generator)
    net.pairs = (chosen, rejected)
    with torch.no_grad():
        raw = net(task.features)
    p = task.ref_logprobs.exp()
    mean = (p * raw).sum()
    sd = ((p * (raw - mean) ** 2).sum()).sqrt().clamp_min(1e-12)
    return net, ((raw - mean) / sd).detach()


# ----------------------------------------------------------------------------- optimising against it

def kl_regularised_optimum(ref_logprobs: Tensor, reward: Tensor, beta: float) -> Tensor:
    r"""Log-probabilities of the maximiser of :math:`\mathbb E_\pi[r] - \beta\,\mathrm{KL}(\pi\,\|\,\pi_{ref})`:

    .. math::  \pi_\beta(y) = \frac{\pi_{ref}(y)\, e^{r(y)/\beta}}{\sum_{y'} \pi_{ref}(y')\, e^{r(y')/\beta}} ,

    computed as ``log_softmax(ref_logprobs + reward / beta)`` (no overflow for any beta > 0).
    ``beta = inf`` returns pi_ref itself (normalised).

    Args:
        ref_logprobs: ``[..., N]`` log pi_ref (or unnormalised logits).
        reward: ``[..., N]`` reward of every response (same shape).
        beta: the KL coefficient, > 0.
    Returns: ``[..., N]`` normalised log-probabilities.  Chapter: 05_onpolicy_offpolicy_drift
    (the theorem on the KL-regularised optimum).
    """
    V.float_tensor(ref_logprobs, "ref_logprobs")
    V.float_tensor(reward, "reward")
    V.same_layout(ref_logprobs, "ref_logprobs", reward, "reward")
    beta = V.finite_float(beta, "beta", 0.0, math.inf, lo_open=True) if beta != math.inf else math.inf
    if beta == math.inf:
        return torch.log_softmax(ref_logprobs, -1)
    return torch.log_softmax(ref_logprobs + reward / beta, -1)


def best_of_n(ref_logprobs: Tensor, proxy: Tensor, n: int) -> Tensor:
    r"""Exact log-probabilities of best-of-n sampling: draw n responses from pi_ref, keep the one
    with the highest proxy reward.

    With :math:`F(v) = P_{\pi_{ref}}(\hat r \le v)` and :math:`F(v^-) = P_{\pi_{ref}}(\hat r < v)`,
    the kept response has proxy value v with probability :math:`F(v)^n - F(v^-)^n`; that mass is
    shared among the responses with :math:`\hat r = v` in proportion to pi_ref (ties are broken
    uniformly at random among the draws).  Its KL to pi_ref is at most
    :math:`\log n - (n-1)/n` (Beirami et al., 2024), the value usually quoted for it, which is
    reached only in the continuous limit (many responses, each unlikely, no ties).

    Args: ref_logprobs, proxy: ``[N]``; n: number of draws (>= 1).
    Returns: ``[N]`` log-probabilities (``-inf`` where impossible).
    """
    _per_response(ref_logprobs=ref_logprobs, proxy=proxy)
    n = V.positive_int(n, "n")
    p = torch.softmax(ref_logprobs.double(), -1)
    values, group = torch.unique(proxy.double(), sorted=True, return_inverse=True)
    mass = torch.zeros(values.numel(), dtype=torch.float64, device=p.device).index_add_(0, group, p)
    cdf = mass.cumsum(0).clamp(max=1.0)
    below = torch.cat([cdf.new_zeros(1), cdf[:-1]])
    p_group = cdf ** n - below ** n
    share = torch.where(mass[group] > 0, p / mass[group], torch.zeros_like(p))
    out = (p_group[group] * share).log()
    return out.to(ref_logprobs.dtype)


def policy_summary(logprobs: Tensor, ref_logprobs: Tensor, **rewards: Tensor) -> dict[str, float]:
    r"""Exact statistics of a policy over an enumerated response space.

    Returns ``{"kl": KL(pi || pi_ref), name: E_pi[reward] for each keyword}``, with
    :math:`\mathrm{KL}(\pi\,\|\,\pi_{ref}) = \sum_y \pi(y) \log\frac{\pi(y)}{\pi_{ref}(y)}`.

    Args: logprobs, ref_logprobs and every reward: ``[N]`` (logits are normalised first).
    """
    _per_response(logprobs=logprobs, ref_logprobs=ref_logprobs, **rewards)
    out = {"kl": float(kl_categorical(logprobs, ref_logprobs))}
    p = torch.softmax(logprobs, -1)
    for name, r in rewards.items():
        out[name] = float((p * r).sum())
    return out


def optimise_policy(ref_logprobs: Tensor, proxy: Tensor, beta: float = 0.0, steps: int = 300,
                    lr: float = 0.05, samples: int | None = None, generator: torch.Generator | None = None,
                    record_every: int = 1, callback: Callable[[int, Tensor], None] | None = None,
                    **track: Tensor) -> tuple[Tensor, dict[str, list[float]]]:
    r"""Maximise :math:`J(\theta) = \mathbb E_{\pi_\theta}[\hat r] - \beta\,\mathrm{KL}(\pi_\theta\,\|\,\pi_{ref})`
    over a softmax policy on the responses, starting from pi_ref, with Adam.

    * ``samples=None``: the exact gradient (autograd through the sum over all responses).
    * ``samples=m``: the RLHF estimate.  Draw :math:`y_1..y_m \sim \pi_\theta`, fold the KL into
      the reward, :math:`R_i = \hat r(y_i) - \beta\,(\log\pi_\theta(y_i) - \log\pi_{ref}(y_i))`
      (held constant), subtract the batch mean and minimise
      :math:`-\frac1m\sum_i (R_i - \bar R)\log\pi_\theta(y_i)`.  Unbiased for :math:`\nabla J`,
      because :math:`\mathbb E_\pi[\nabla\log\pi] = 0` removes the derivative of the log inside R.

    Args:
        ref_logprobs: ``[N]`` log pi_ref; proxy: ``[N]`` the reward being optimised.
        beta: KL coefficient (>= 0; 0 is unpenalised optimisation).
        steps, lr: Adam steps and learning rate on the ``[N]`` logits.
        record_every: record the statistics every this many steps (and at step 0 and the end).
        callback: ``callback(step, logits)`` after each recording.
        **track: more ``[N]`` rewards whose expectation to record (e.g. ``true=...``).
    Returns:
        ``(logits [N], history)`` with ``history["step"]``, ``["kl"]``, ``["proxy"]`` and one list per
        tracked reward.
    """
    _per_response(ref_logprobs=ref_logprobs, proxy=proxy)
    beta = V.finite_float(beta, "beta", 0.0)
    steps = V.positive_int(steps, "steps", minimum=0)
    lr = V.finite_float(lr, "lr", 0.0, lo_open=True)
    record_every = V.positive_int(record_every, "record_every")
    if samples is not None:
        samples = V.positive_int(samples, "samples", minimum=2)
    ref = torch.log_softmax(ref_logprobs.detach(), -1)
    proxy = proxy.detach()
    logits = ref.clone().requires_grad_(True)
    opt = torch.optim.Adam([logits], lr=lr)
    hist: dict[str, list[float]] = {"step": [], "kl": [], "proxy": []}
    for name in track:
        hist[name] = []

    def record(step):
        with torch.no_grad():
            s = policy_summary(logits.detach(), ref, proxy=proxy, **track)
        hist["step"].append(step)
        for k, v in s.items():
            hist[k].append(v)
        if callback is not None:
            callback(step, logits.detach())

    record(0)
    for step in range(1, steps + 1):
        logp = torch.log_softmax(logits, -1)
        if samples is None:
            p = logp.exp()
            loss = -(p * proxy).sum() + beta * kl_categorical(logits, ref)
        else:
            with torch.no_grad():
                idx = torch.multinomial(logp.exp(), samples, replacement=True, generator=generator)
                shaped = proxy[idx] - beta * (logp[idx] - ref[idx])
                adv = shaped - shaped.mean()
            loss = -(adv * logp[idx]).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % record_every == 0 or step == steps:
            record(step)
    return logits.detach(), hist
