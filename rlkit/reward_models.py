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
    V.int_in(vocab_size, "vocab_size")
    V.int_in(length, "length")
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
    V.int_in(vocab_size, "vocab_size")
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
        V.int_in(n, "n")
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
    V.int_in(length, "length")
    p_flattery = V.real_in(p_flattery, "p_flattery", 0.0, 1.0, lo_open=True, hi_open=True)
    q = V.tensor_in(torch.tensor(V.real_list(quality, "quality"), dtype=torch.float32), "quality")
    V.int_in(q.numel(), "len(quality)")
    V.real_in(flattery_gain, "flattery_gain")
    V.int_in(flattery_budget, "flattery_budget", 0)
    V.real_in(flattery_penalty, "flattery_penalty", 0.0)
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
        self.in_dim = V.int_in(in_dim, "in_dim")
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
    scale = V.real_in(scale, "scale", 0.0, lo_open=True)
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
    epochs = V.int_in(epochs, "epochs")
    lr = V.real_in(lr, "lr", 0.0, lo_open=True)
    weight_decay = V.real_in(weight_decay, "weight_decay", 0.0)
    m = x_chosen.shape[0]
    bs = m if batch_size is None else V.int_in(batch_size, "batch_size")
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
    n_pairs = V.int_in(n_pairs, "n_pairs")
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
    beta = V.real_in(beta, "beta", 0.0, lo_open=True, allow_inf=True)
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
    n = V.int_in(n, "n")
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
    beta = V.real_in(beta, "beta", 0.0)
    steps = V.int_in(steps, "steps", 0)
    lr = V.real_in(lr, "lr", 0.0, lo_open=True)
    record_every = V.int_in(record_every, "record_every")
    if samples is not None:
        samples = V.int_in(samples, "samples", 2)
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


# ----------------------------------------------------------------------------- ensembles (chapter 17)
#
# Chapter 17_uncertainty_risk extends this module: K reward models fitted in one batched pass
# (RewardEnsemble, fit_ensemble_preferences), ensembles built with bootstrap and/or
# initialisation diversity (fit_reward_ensemble), their disagreement as uncertainty
# (ensemble_disagreement), several simulated annotators per pair (simulate_annotators), and the
# exact natural-gradient path of a softmax policy under per-response advantage weights
# (natural_policy_ascent).

__all__ += ["RewardEnsemble", "simulate_annotators", "fit_ensemble_preferences", "standardise_on_reference",
            "ensemble_data", "fit_reward_ensemble", "ensemble_disagreement", "natural_policy_ascent",
            "downweighted_fixed_point"]

DIVERSITY = ("init", "bootstrap", "both", "independent")


class RewardEnsemble(nn.Module):
    r"""K independent ReLU reward nets, evaluated in one batched pass: features ``[..., F]`` -> ``[K, ...]``.

    Member :math:`k` computes :math:`\hat r_k(x) = W^{(L)}_k{}^\top h_k + b^{(L)}_k` with
    :math:`h_k = \mathrm{ReLU}(W^{(L-1)}_k{}^\top \cdots \mathrm{ReLU}(W^{(1)}_k{}^\top x + b^{(1)}_k)\cdots)`,
    the architecture of :class:`RewardNet`. Its weights are stacked ``[K, in, out]``, so one
    ``baddbmm`` per layer evaluates every member, and members never share a parameter: summing
    their losses and stepping Adam (which acts elementwise) trains each exactly as if alone.

    Args:
        in_dim: feature size. k: number of members. hidden, layers: as :class:`RewardNet`
            (``layers >= 1``).
        seeds: None, or ``k`` ints: member ``i`` starts exactly as ``RewardNet(in_dim, hidden,
            layers)`` built under ``torch.manual_seed(seeds[i])`` (the global RNG is left as it
            was). With None, the members are drawn from the global RNG one after another.

    Chapter: 17_uncertainty_risk.
    """

    def __init__(self, in_dim: int, k: int, hidden: int = 32, layers: int = 2, seeds=None):
        super().__init__()
        self.in_dim = V.int_in(in_dim, "in_dim")
        self.k = V.int_in(k, "k")
        V.int_in(hidden, "hidden")
        V.int_in(layers, "layers")
        if seeds is not None:
            V.instance_of(seeds, "seeds", (list, tuple), "list of ints")
            if len(seeds) != self.k:
                raise ValueError(f"seeds must hold k = {self.k} ints, got {len(seeds)}")
            seeds = [V.int_in(s, f"seeds[{i}]", 0, 2**63 - 1) for i, s in enumerate(seeds)]
        nets = []
        for i in range(self.k):
            if seeds is None:
                nets.append(RewardNet(in_dim, hidden, layers))
            else:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seeds[i])
                    nets.append(RewardNet(in_dim, hidden, layers))
        self._load(nets)

    def _load(self, nets) -> None:
        linears = [[m for m in n.net if isinstance(m, nn.Linear)] for n in nets]
        self.weights = nn.ParameterList(
            [nn.Parameter(torch.stack([ls[j].weight.detach().T for ls in linears]).clone())
             for j in range(len(linears[0]))])
        self.biases = nn.ParameterList(
            [nn.Parameter(torch.stack([ls[j].bias.detach() for ls in linears]).clone())
             for j in range(len(linears[0]))])

    @classmethod
    def from_nets(cls, nets) -> RewardEnsemble:
        """An ensemble whose members are copies of the given :class:`RewardNet` s (same architecture)."""
        nets = V.tuple_of(nets, "nets", RewardNet)
        V.int_in(len(nets), "len(nets)")
        shapes = [[tuple(p.shape) for p in n.parameters()] for n in nets]
        if any(s != shapes[0] for s in shapes):
            raise ValueError("from_nets: every net must have the same architecture")
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out.in_dim, out.k = nets[0].in_dim, len(nets)
        out._load(nets)
        return out

    def hidden_features(self, x: Tensor) -> Tensor:
        """The last hidden layer of every member: ``[..., F]`` -> ``[K, ..., hidden]``."""
        V.feature_tensor(x, "x", self.in_dim)
        lead = x.shape[:-1]
        h = x.reshape(1, -1, self.in_dim).expand(self.k, -1, -1)
        for w, b in zip(self.weights[:-1], self.biases[:-1]):
            h = torch.relu(torch.baddbmm(b[:, None, :], h, w))
        return h.reshape(self.k, *lead, h.shape[-1])

    def forward(self, x: Tensor) -> Tensor:
        h = self.hidden_features(x)
        w, b = self.weights[-1], self.biases[-1]
        return torch.einsum("k...h,kh->k...", h, w[..., 0]) + b[:, 0].reshape(self.k, *([1] * (h.dim() - 2)))

    def member(self, i: int) -> RewardNet:
        """Member ``i`` as a stand-alone :class:`RewardNet` (a copy)."""
        i = V.int_in(i, "i", 0, self.k - 1)
        hidden = self.weights[0].shape[-1]
        net = RewardNet(self.in_dim, hidden, len(self.weights) - 1)
        lins = [m for m in net.net if isinstance(m, nn.Linear)]
        with torch.no_grad():
            for lin, w, b in zip(lins, self.weights, self.biases):
                lin.weight.copy_(w[i].T)
                lin.bias.copy_(b[i])
        return net


def simulate_annotators(r_a: Tensor, r_b: Tensor, n_annotators: int, scale: float = 1.0,
                        generator: torch.Generator | None = None) -> Tensor:
    r"""How many of ``n_annotators`` independent simulated annotators prefer a to b.

    Each annotator draws its own label from Bradley-Terry with noise scale ``s = scale``, as in
    :func:`simulate_preferences`, so the count is Binomial(:math:`n`, :math:`\sigma((r_a-r_b)/s)`)
    and :math:`\hat p = \text{count}/n` is an unbiased estimate of the preference probability.

    Args: r_a, r_b: ``[...]`` true rewards (same shape); n_annotators >= 1; scale > 0.
    Returns: int64 ``[...]`` in ``[0, n_annotators]``. Chapter: 17_uncertainty_risk.
    """
    n = V.int_in(n_annotators, "n_annotators")
    votes = torch.stack([simulate_preferences(r_a, r_b, scale, generator) for _ in range(n)])
    return votes.sum(0)


def fit_ensemble_preferences(ensemble: RewardEnsemble, features: Tensor, idx_a: Tensor, idx_b: Tensor,
                             p_a: Tensor | None = None, weights: Tensor | None = None, epochs: int = 300,
                             lr: float = 1e-2, weight_decay: float = 0.0) -> Tensor:
    r"""Fit every member of an ensemble to its own preference data, full batch, with Adam.

    Member :math:`k` minimises :func:`rlkit.risk.soft_bradley_terry_loss` on its pairs
    :math:`(a_{ki}, b_{ki})` with labels :math:`\hat p_{ki}` (the probability that a is preferred;
    None: a is the chosen one, :math:`\hat p = 1`) and pair weights :math:`w_{ki}` (None: 1). The
    network is evaluated once per *distinct* feature row that the pairs use, which gives the same
    loss and gradient as scoring every pair and is much cheaper when responses share features
    (token counts). With one member, hard labels and no weights this is :func:`fit_bradley_terry`
    with ``batch_size=None``.

    Args:
        ensemble: a :class:`RewardEnsemble` with K members.
        features: ``[N, F]`` features of every response. idx_a, idx_b: int64 ``[K, M]`` indices into it.
        p_a: ``[K, M]`` in [0, 1] or None. weights: ``[K, M]`` >= 0 or None.
        epochs, lr, weight_decay: Adam's steps (full batch), learning rate and L2 coefficient.

    Returns: the training loss of every member at every epoch, ``[epochs, K]``. Chapter: 17_uncertainty_risk.
    """
    V.instance_of(ensemble, "ensemble", RewardEnsemble)
    V.feature_tensor(features, "features", ensemble.in_dim)
    V.layout("N F", features=features)
    n = features.shape[0]
    sizes = V.layout("K M", {"K": ensemble.k}, idx_a=V.index_tensor(idx_a, "idx_a", n=n),
                     idx_b=V.index_tensor(idx_b, "idx_b", n=n))
    if p_a is not None:
        V.float_tensor(p_a, "p_a", min_dim=2)
        V.layout("K M", sizes, p_a=p_a)
        V.tensor_in(p_a, "p_a", 0.0, 1.0)
    if weights is not None:
        V.float_tensor(weights, "weights", min_dim=2)
        V.layout("K M", sizes, weights=weights)
        V.tensor_in(weights, "weights", 0.0)
    epochs = V.int_in(epochs, "epochs")
    lr = V.real_in(lr, "lr", 0.0, lo_open=True)
    weight_decay = V.real_in(weight_decay, "weight_decay", 0.0)
    used, inv = torch.unique(torch.cat([idx_a, idx_b], 1), return_inverse=True)
    x, row = torch.unique(features[used], dim=0, return_inverse=True)   # distinct feature rows only
    inv = row[inv]
    ua, ub = inv[:, :idx_a.shape[1]], inv[:, idx_a.shape[1]:]
    p = torch.ones(idx_a.shape, dtype=x.dtype) if p_a is None else p_a.to(x.dtype)
    opt = torch.optim.Adam(ensemble.parameters(), lr=lr, weight_decay=weight_decay)
    losses = torch.zeros(epochs, ensemble.k)
    for e in range(epochs):
        s = ensemble(x)                                          # [K, U]
        ra, rb = s.gather(1, ua), s.gather(1, ub)
        per = _soft_bt_rows(ra, rb, p, None if weights is None else weights.to(x.dtype))
        opt.zero_grad()
        per.sum().backward()
        opt.step()
        losses[e] = per.detach()
    return losses


def _soft_bt_rows(ra: Tensor, rb: Tensor, p: Tensor, weights: Tensor | None) -> Tensor:
    # rlkit.risk.soft_bradley_terry_loss of every row, vectorised over the members: [K, M] -> [K]
    d = ra - rb
    per = p * nn.functional.softplus(-d) + (1 - p) * nn.functional.softplus(d)
    if weights is None:
        return per.mean(1)
    total = weights.sum(1)
    return (weights * per).sum(1) / torch.where(total > 0, total, torch.ones_like(total))


def standardise_on_reference(raw: Tensor, ref_logprobs: Tensor) -> Tensor:
    r"""Standardise reward scores on the reference policy, as :func:`fit_reward_model` does:

    .. math::  \hat r(y) = \frac{r(y) - \mathbb E_{\pi_{ref}}[r]}{\operatorname{sd}_{\pi_{ref}}[r]} .

    Args:
        raw: ``[..., N]`` scores of every response (e.g. one row per ensemble member).
        ref_logprobs: ``[N]`` log pi_ref.

    Returns:
        ``[..., N]`` (detached).
        Chapter: 17_uncertainty_risk.
    """
    V.float_tensor(raw, "raw")
    V.float_tensor(ref_logprobs, "ref_logprobs")
    sizes = V.layout("... N", raw=raw)
    V.layout("N", {"N": sizes["N"]}, ref_logprobs=ref_logprobs)
    p = torch.softmax(ref_logprobs.detach().to(raw.dtype), -1)
    raw = raw.detach()
    mean = (p * raw).sum(-1, keepdim=True)
    sd = (p * (raw - mean) ** 2).sum(-1, keepdim=True).sqrt().clamp_min(1e-12)
    return (raw - mean) / sd


def ensemble_data(task: ResponseBandit, k: int = 5, diversity: str = "both", n_pairs: int = 1000,
                  noise: float = 0.1, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, list[int]]:
    r"""Preference data and initialisation seeds for the :math:`K` members of an ensemble.

    Pairs are drawn as in :func:`fit_reward_model` (two responses from pi_ref, one simulated
    label with noise ``noise``). ``diversity`` says what differs between the members:

    * ``"init"``: one data set for all; each member has its own random initialisation (deep
      ensembles; Lakshminarayanan et al., 2017).
    * ``"bootstrap"``: one initialisation for all; each member gets its own bootstrap resample
      (``n_pairs`` pairs drawn with replacement) of the one data set.
    * ``"both"``: bootstrap resamples and separate initialisations.
    * ``"independent"``: each member gets fresh pairs and labels of its own (``k`` times the
      annotation budget: a reference point, not a practical ensemble).

    Returns: ``(chosen, rejected, seeds)``: int64 ``[K, n_pairs]`` response indices (the preferred
    response first) and ``K`` initialisation seeds for :class:`RewardEnsemble`, all drawn from
    ``generator``. Chapter: 17_uncertainty_risk.
    """
    V.instance_of(task, "task", ResponseBandit)
    k = V.int_in(k, "k")
    diversity = V.choice(diversity, "diversity", DIVERSITY)
    n_pairs = V.int_in(n_pairs, "n_pairs")

    def draw_pairs():
        a = task.sample(n_pairs, generator=generator)
        b = task.sample(n_pairs, generator=generator)
        win = simulate_preferences(task.true_reward[a], task.true_reward[b], scale=noise, generator=generator)
        return torch.where(win, a, b), torch.where(win, b, a)

    if diversity == "independent":
        pairs = [draw_pairs() for _ in range(k)]
        chosen, rejected = torch.stack([c for c, _ in pairs]), torch.stack([r for _, r in pairs])
    else:
        c, r = draw_pairs()
        if diversity == "init":
            rows = torch.arange(n_pairs).expand(k, n_pairs)
        else:
            rows = torch.randint(0, n_pairs, (k, n_pairs), generator=generator)
        chosen, rejected = c[rows], r[rows]
    seeds = [int(s) for s in torch.randint(0, 2**62, (k,), generator=generator)]
    if diversity == "bootstrap":
        seeds = [seeds[0]] * k
    return chosen, rejected, seeds


def fit_reward_ensemble(task: ResponseBandit, k: int = 5, diversity: str = "both", n_pairs: int = 1000,
                        noise: float = 0.1, hidden: int = 32, layers: int = 2, epochs: int = 300, lr: float = 1e-2,
                        weight_decay: float = 0.0,
                        generator: torch.Generator | None = None) -> tuple[RewardEnsemble, Tensor]:
    r"""An ensemble of :math:`K` reward models on a :class:`ResponseBandit` with a chosen source of diversity.

    :func:`ensemble_data` draws each member's preference pairs and initialisation (``diversity``
    is ``"init"``, ``"bootstrap"``, ``"both"`` or ``"independent"``),
    :func:`fit_ensemble_preferences` fits all members in one batched pass, and every member's
    scores are standardised on pi_ref (:func:`standardise_on_reference`). To fit several
    ensembles at once, concatenate their :func:`ensemble_data` along the member dimension.

    Returns: ``(ensemble, proxies)`` with ``proxies`` ``[K, N]`` (detached) and
    ``ensemble.pairs = (chosen, rejected)`` ``[K, n_pairs]``. Everything is drawn from
    ``generator`` when one is given. Chapter: 17_uncertainty_risk.
    """
    chosen, rejected, seeds = ensemble_data(task, k, diversity, n_pairs, noise, generator)
    ens = RewardEnsemble(task.features.shape[-1], k, hidden=hidden, layers=layers, seeds=seeds)
    fit_ensemble_preferences(ens, task.features, chosen, rejected, epochs=epochs, lr=lr, weight_decay=weight_decay)
    ens.pairs = (chosen, rejected)
    with torch.no_grad():
        raw = ens(task.features)
    return ens, standardise_on_reference(raw, task.ref_logprobs)


def ensemble_disagreement(scores: Tensor, dim: int = 0) -> Tensor:
    r"""Disagreement of an ensemble as an uncertainty: the population standard deviation over members,

    .. math::  \sigma(y) = \Big(\frac1K\sum_{j=1}^K \big(\hat r_j(y) - \bar r(y)\big)^2\Big)^{1/2},

    0 for a single member. This is an uncertainty about the *sequence* reward of a response; a
    per-token :math:`\sigma_t` is this value broadcast over the response's tokens (or the
    disagreement of value heads at :math:`h_t`, a different quantity).

    Args: scores: ``[..., K, ...]`` finite, ``dim`` the members. Returns: ``scores`` without ``dim``.
    Chapter: 17_uncertainty_risk.
    """
    V.float_tensor(scores, "scores")
    dim = V.int_in(dim, "dim", -scores.dim(), scores.dim() - 1)
    V.int_in(scores.shape[dim], "the number of members (scores.shape[dim])")
    V.tensor_in(scores, "scores")
    return ((scores - scores.mean(dim, keepdim=True)) ** 2).mean(dim).sqrt()


def natural_policy_ascent(ref_logprobs: Tensor, reward: Tensor, weights: Tensor | None = None, beta: float = 0.0,
                          steps: int = 300, lr=0.1, record_every: int = 1,
                          callback: Callable[[int, Tensor], None] | None = None, kl: str = "reward",
                          **track: Tensor) -> tuple[Tensor, dict[str, list[float]]]:
    r"""The exact (expected) natural-gradient path of a softmax policy with per-response advantage weights.

    Starting from :math:`\theta_0 = \log\pi_{ref}`, every step is

    .. math::
        R_t(y) = r(y) - \beta\log\frac{\pi_t(y)}{\pi_{ref}(y)},\qquad
        \theta_{t+1}(y) = \theta_t(y) + \eta\,w(y)\,\big(R_t(y) - \mathbb E_{\pi_t}[R_t]\big),

    the natural policy gradient of a tabular softmax policy (Kakade, 2001), with the KL folded into
    the reward as RLHF trainers do and the advantage of every response scaled by :math:`w(y) > 0`
    (e.g. :math:`1/(1+\alpha\sigma(y))`). With :math:`w \equiv 1` and :math:`\beta = 0` the path is
    exactly the family :math:`\pi_t \propto \pi_{ref}\,e^{\eta t\,r}` of
    :func:`kl_regularised_optimum` at :math:`\beta = 1/(\eta t)`. For any :math:`w > 0` a fixed point
    has :math:`R_t \equiv` const, i.e. it is :math:`\pi_\beta` of :math:`r` (for :math:`\beta > 0`),
    whatever the weights: they change the speed, not the destination. Stable for
    :math:`\eta\,\beta\,\max w \le 1`.

    With ``kl="separate"`` the KL is a gradient term of its own, outside the weighted advantage (the
    form :math:`\nabla J \approx \mathbb E[\hat A\,\nabla\log\pi] - \beta\nabla\mathrm{KL}` with
    :math:`\hat A` replaced by :math:`w\hat A`, as GRPO-style trainers apply a KL loss):

    .. math::
        \theta_{t+1}(y) = \theta_t(y) + \eta\Big(w(y)\big(r(y) - \mathbb E_{\pi_t}[r]\big)
        - \beta\big(\log\tfrac{\pi_t(y)}{\pi_{ref}(y)} - \mathrm{KL}(\pi_t\,\|\,\pi_{ref})\big)\Big).

    Its fixed points are :math:`\pi^*(y) \propto \pi_{ref}(y)\,e^{w(y)(r(y) - b^*)/\beta}` with
    :math:`b^* = \mathbb E_{\pi^*}[r]` (:func:`downweighted_fixed_point`): they *do* depend on the
    weights. With :math:`w \equiv 1` the two forms are the same update. Stable for :math:`\eta\beta \le 1`.

    Args:
        ref_logprobs: ``[N]`` log pi_ref; reward: ``[N]``; weights: ``[N]`` > 0 or None (all 1).
        beta: KL coefficient >= 0. steps: number of steps.
        lr: :math:`\eta > 0`, one number, or a sequence of ``steps`` positive numbers (one per step,
            e.g. growing geometrically to cover a long time :math:`\sum_t\eta_t` in few steps).
        record_every, callback, \*\*track: as :func:`optimise_policy`.
        kl: ``"reward"`` (default: the KL folded into the reward, inside the weighted advantage) or
            ``"separate"`` (the KL as its own, unweighted gradient term).

    Returns: ``(logits [N], history)`` with ``history["step"]``, ``["kl"]``, ``["proxy"]`` (the
    expected ``reward``) and one list per tracked reward. Chapter: 17_uncertainty_risk.
    """
    _per_response(ref_logprobs=ref_logprobs, reward=reward)
    if weights is None:
        weights = torch.ones_like(reward)
    else:
        _per_response(ref_logprobs=ref_logprobs, weights=weights)
        V.tensor_in(weights, "weights", 0.0, lo_open=True)
    V.tensor_in(reward, "reward")
    beta = V.real_in(beta, "beta", 0.0)
    kl = V.choice(kl, "kl", ("reward", "separate"))
    steps = V.int_in(steps, "steps", 0)
    if isinstance(lr, (list, tuple)) or (isinstance(lr, Tensor) and lr.dim() > 0):
        lrs = V.real_list(lr, "lr")
        if len(lrs) != steps:
            raise ValueError(f"lr must be one number or {steps} numbers (one per step), got {len(lrs)}")
        lrs = [V.real_in(x, f"lr[{i}]", 0.0, lo_open=True) for i, x in enumerate(lrs)]
    else:
        lrs = [V.real_in(lr, "lr", 0.0, lo_open=True)] * steps
    record_every = V.int_in(record_every, "record_every")
    ref = torch.log_softmax(ref_logprobs.detach(), -1)
    reward, weights = reward.detach(), weights.detach()
    theta = ref.clone()
    hist: dict[str, list[float]] = {"step": [], "kl": [], "proxy": []}
    for name in track:
        hist[name] = []

    def record(step):
        s = policy_summary(theta, ref, proxy=reward, **track)
        hist["step"].append(step)
        for key, v in s.items():
            hist[key].append(v)
        if callback is not None:
            callback(step, theta.clone())

    with torch.no_grad():
        record(0)
        for step in range(1, steps + 1):              # theta is kept normalised: it is log pi_t
            if kl == "separate":                       # w (r - E r) - beta (log pi/pi_ref - KL); the KL is a constant
                step_dir = weights * (reward - (theta.exp() * reward).sum())
                if beta > 0:
                    step_dir = step_dir - beta * (theta - ref)
                theta = torch.log_softmax(theta + lrs[step - 1] * step_dir, -1)
            else:
                shaped = reward - beta * (theta - ref) if beta > 0 else reward
                adv = shaped - (theta.exp() * shaped).sum()
                theta = torch.log_softmax(theta + lrs[step - 1] * weights * adv, -1)
            if step % record_every == 0 or step == steps:
                record(step)
    return theta, hist


def downweighted_fixed_point(ref_logprobs: Tensor, reward: Tensor, weights: Tensor | None, beta: float,
                             kl: str = "separate", tol: float = 1e-12) -> tuple[Tensor, Tensor]:
    r"""The fixed point of :func:`natural_policy_ascent` with advantage weights :math:`w > 0` and a KL term.

    * ``kl="reward"`` (the KL folded into the weighted advantage): the fixed point is
      :math:`\pi_\beta \propto \pi_{ref}\,e^{r/\beta}` whatever the weights
      (:func:`kl_regularised_optimum`).
    * ``kl="separate"`` (the KL as its own gradient term): a fixed point satisfies
      :math:`w(y)(r(y) - b) - \beta\log\frac{\pi(y)}{\pi_{ref}(y)} = \text{const}` with
      :math:`b = \mathbb E_\pi[r]`, so

      .. math::
          \pi^*(y) = \frac{\pi_{ref}(y)\,e^{w(y)(r(y) - b^*)/\beta}}{Z},\quad
          Z = \sum_{y'}\pi_{ref}(y')\,e^{w(y')(r(y') - b^*)/\beta},\quad b^* = \mathbb E_{\pi^*}[r],

      which depends on :math:`w`: responses with a small weight are pulled toward the baseline.
      :math:`g(b) = \mathbb E_{\pi_b}[r] - b` is continuous, :math:`\ge 0` at :math:`b = \min r`
      and :math:`\le 0` at :math:`b = \max r`, so a root exists in that interval; it is found by
      bisection in float64. If :math:`g` has several roots (possible when :math:`r` and :math:`w`
      covary strongly against each other), one of them is returned.

    Args:
        ref_logprobs: ``[..., N]`` log pi_ref (normalised here). reward: ``[..., N]`` finite.
        weights: ``[..., N]`` > 0, or None (all 1: then both forms give :math:`\pi_\beta`).
        beta: the KL coefficient, a finite number > 0.
        kl: ``"separate"`` or ``"reward"``.
        tol: bisection stops when the bracket on :math:`b^*` is narrower than ``tol`` times the
            reward's range (a number in (0, 1)).

    Returns: ``(logprobs [..., N], baseline [...])``: the fixed point, in float64, and
    :math:`b^* = \mathbb E_{\pi^*}[r]`. Chapter: 17_uncertainty_risk.
    """
    V.float_tensor(ref_logprobs, "ref_logprobs")
    V.float_tensor(reward, "reward")
    V.same_layout(ref_logprobs, "ref_logprobs", reward, "reward")
    V.tensor_in(reward, "reward")
    if weights is None:
        weights = torch.ones_like(reward)
    else:
        V.float_tensor(weights, "weights")
        V.same_layout(ref_logprobs, "ref_logprobs", weights, "weights")
        V.tensor_in(weights, "weights", 0.0, lo_open=True)
    beta = V.real_in(beta, "beta", 0.0, lo_open=True)
    kl = V.choice(kl, "kl", ("reward", "separate"))
    tol = V.real_in(tol, "tol", 0.0, 1.0, lo_open=True, hi_open=True)
    ref = torch.log_softmax(ref_logprobs.detach().double(), -1)
    r, w = reward.detach().double(), weights.detach().double()
    if kl == "reward":
        lp = torch.log_softmax(ref + r / beta, -1)
        return lp, (lp.exp() * r).sum(-1)

    def policy(b):
        return torch.log_softmax(ref + w * (r - b[..., None]) / beta, -1)

    lo, hi = r.amin(-1), r.amax(-1)
    width = (hi - lo).clamp(min=1e-300)
    for _ in range(200):
        if bool(((hi - lo) <= tol * width).all()):
            break
        mid = 0.5 * (lo + hi)
        up = (policy(mid).exp() * r).sum(-1) > mid        # g(mid) > 0: the root lies above mid
        lo, hi = torch.where(up, mid, lo), torch.where(up, hi, mid)
    b = 0.5 * (lo + hi)
    return policy(b), b
