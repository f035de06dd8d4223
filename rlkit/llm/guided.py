r"""Value-guided decoding: a frozen model steered at sampling time by a critic of the future.

Chapter: 20_value_guided_decoding.

The source article of Part III writes the guided next-token distribution as

.. math::

    \log\tilde\pi(y_t\mid h_t) = \log\pi(y_t\mid h_t) + \eta\,\big(V(h_{t+1}) - V(h_t)\big),
    \qquad h_{t+1} = h_t \oplus y_t,

and leaves open whether to normalise. :math:`V(h_t)` is the same number for every candidate
:math:`y_t`, so a softmax over candidates cancels it; what is left is
:math:`\tilde\pi(v\mid h)\propto\pi(v\mid h)\,e^{\eta V(h\oplus v)}` with the normaliser

.. math::

    Z(h) = \sum_v \pi(v\mid h)\,e^{\eta\,(V(h\oplus v) - V(h))}.

Three values give three readings (chapter 20, eqs. ``eq-ch20-soft``, ``eq-ch20-bayes``):

* the soft value :math:`V_\beta(h) = \beta\log\mathbb E_\pi[e^{R/\beta}\mid h]` with :math:`\eta = 1/\beta`:
  :math:`Z \equiv 1` and the product of the guided tokens is the KL-regularised optimum
  :math:`\pi(y)e^{R(y)/\beta}/Z_\beta` of chapter 5;
* :math:`V = \log P(\text{success}\mid h)` with :math:`\eta = 1`: :math:`Z\equiv 1`, Bayes' rule
  :math:`\pi(v\mid h, S)` (FUDGE);
* the expected reward :math:`V^\pi = \mathbb E_\pi[R\mid h]` (a PPO critic): :math:`Z\ne1`, an
  approximation that needs the softmax.

What is here:

* the exact small case, a complete token tree: :func:`random_token_tree`, :func:`tree_values`,
  :func:`tree_guided_logprobs`;
* the guidance arithmetic: :data:`GUIDANCE_KINDS`, :func:`guidance_term`, :func:`guided_logits`,
  :func:`log_normaliser`;
* a learned success critic on the frozen model's hidden states, :class:`SuccessCritic` (one
  pass gives :math:`\log\hat P(S\mid h, v)` for every candidate :math:`v`, where FUDGE runs its
  discriminator once per candidate on the base model's top-:math:`k`) and
  :func:`fit_success_critic`;
* the logits processor for :func:`rlkit.llm.sample`, :class:`GuidedProcessor` (truncation of the
  base model before guidance, or none), and :func:`guided_token_kl`, the KL of what it samples
  from the base model;
* exact accuracy and KL for a binary reward: :func:`kl_optimum_binary` (guidance with a perfect
  critic) and :func:`best_of_n_binary` (best-of-n with a perfect verifier).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import _validate as V
from .sampling import Rollout, apply_logits_processor, call_model, sampling_logprobs

__all__ = ["GUIDANCE_KINDS", "TREE_VALUE_KINDS", "guidance_term", "guided_logits", "log_normaliser",
           "random_token_tree", "tree_values", "tree_guided_logprobs", "SuccessCritic", "fit_success_critic",
           "GuidedProcessor", "guided_token_kl", "kl_optimum_binary", "best_of_n_binary"]

Tensor = torch.Tensor

#: How a success probability :math:`p = P(S\mid h\oplus v)` becomes guidance (:func:`guidance_term`).
GUIDANCE_KINDS = ("soft", "log_success", "value")
#: The values :func:`tree_values` computes.
TREE_VALUE_KINDS = ("soft", "mean", "log_success")


def _log_probs(x, name: str) -> Tensor:
    """A float tensor of log-probabilities: no NaN, nothing above 0 (``-inf`` allowed)."""
    V.float_tensor(x, name)
    if x.numel():
        if bool(torch.isnan(x).any()):
            raise ValueError(f"{name} must be log-probabilities, found NaN")
        mx = float(x.max())
        if mx > 1e-6:
            raise ValueError(f"{name} must be log-probabilities (<= 0), found a value {mx}")
    return x.clamp(max=0.0)


def _eta(eta) -> float:
    return V.real_in(eta, "eta", 0.0)


def guidance_term(log_success: Tensor, kind: str, eta: float) -> Tensor:
    r"""The guidance :math:`\eta\,V(h\oplus v)` added to :math:`\log\pi(v\mid h)`, from success probabilities.

    With :math:`p = P(S\mid h\oplus v)` for a binary (success/failure) reward :math:`R\in\{0,1\}`:

    * ``"soft"``: :math:`\eta V_\beta(h\oplus v)` with :math:`\beta = 1/\eta`, where
      :math:`V_\beta = \beta\log\mathbb E[e^{R/\beta}] = \beta\log(1 - p + p\,e^{1/\beta})`, i.e.
      :math:`\log(1 - p + p\,e^{\eta})` (chapter 20, eq. ``eq-ch20-soft-binary``);
    * ``"log_success"``: :math:`\eta\log p` (FUDGE; ``eta = 1`` is Bayes' rule);
    * ``"value"``: :math:`\eta\,p`, the expected reward, as a PPO critic would give it.

    ``eta = 0`` gives zeros for every kind (no guidance), even where :math:`p = 0`.

    Args:
        log_success: ``[..., V]`` float, :math:`\log p` for every candidate (``-inf`` where success
            is impossible).
        kind: one of :data:`GUIDANCE_KINDS`.
        eta: the guidance strength :math:`\eta`, a finite number ``>= 0``.

    Returns:
        ``[..., V]``, the same dtype (``-inf`` where ``kind="log_success"`` and :math:`p = 0`).
        Chapter: 20_value_guided_decoding.
    """
    lp = _log_probs(log_success, "log_success")
    kind = V.choice(kind, "kind", GUIDANCE_KINDS)
    eta = _eta(eta)
    if eta == 0.0:
        return torch.zeros_like(lp)
    if kind == "log_success":
        return eta * lp
    if kind == "value":
        return eta * lp.exp()
    log_fail = torch.log(-torch.expm1(lp))                         # log(1 - p), -inf at p = 1
    return torch.logaddexp(log_fail, lp + eta)


def guided_logits(logits: Tensor, next_values: Tensor, eta: float) -> Tensor:
    r"""Unnormalised guided scores :math:`\log\pi(v\mid h) + \eta\,V(h\oplus v)`.

    The article's :math:`-\eta V(h_t)` is left out: it is the same for every candidate :math:`v`,
    so it changes no softmax and no argmax (eq. ``eq-ch20-cancel``). Normalise with
    ``log_softmax`` to get :math:`\log\tilde\pi`.

    Args:
        logits: ``[..., V]`` float, the model's logits (or log-probs) at :math:`h`.
        next_values: ``[..., V]`` float, :math:`V(h\oplus v)` for every candidate (``-inf`` bans it).
        eta: :math:`\eta \ge 0`; ``eta = 0`` returns :math:`\log\pi` (even where a value is ``-inf``).

    Returns:
        ``[..., V]``. Chapter: 20_value_guided_decoding.
    """
    V.has_categories(logits, "logits")
    V.float_tensor(next_values, "next_values")
    V.same_layout(logits, "logits", next_values, "next_values")
    if bool(torch.isnan(next_values).any()) or bool(torch.isposinf(next_values).any()):
        raise ValueError("next_values must be finite or -inf (a banned candidate), found NaN or +inf")
    eta = _eta(eta)
    logp = F.log_softmax(logits, dim=-1)
    return logp if eta == 0.0 else logp + eta * next_values


def log_normaliser(logits: Tensor, next_values: Tensor, value: Tensor, eta: float) -> Tensor:
    r"""The log-normaliser of the article's formula, :math:`\log Z(h)`, exactly.

    .. math::  \log Z(h) = \log\sum_v \pi(v\mid h)\,e^{\eta\,(V(h\oplus v) - V(h))}.

    It is 0 (to rounding) for the soft value with :math:`\eta = 1/\beta` and for the log-success
    value with :math:`\eta = 1`, whenever the values are *consistent* (computed from :math:`\pi`
    itself); for a learned critic it measures how far the critic is from that consistency. Rows
    where :math:`V(h) = -\infty` and every :math:`V(h\oplus v) = -\infty` (success impossible, the
    guidance undefined) get 0.

    Args:
        logits: ``[..., V]`` the model's logits at :math:`h`; next_values: ``[..., V]``;
        value: ``[...]``, :math:`V(h)`; eta: :math:`\eta\ge 0`.

    Returns:
        ``[...]``. Chapter: 20_value_guided_decoding (eq. ``eq-ch20-normaliser``).
    """
    V.has_categories(logits, "logits")
    V.float_tensor(next_values, "next_values")
    V.same_layout(logits, "logits", next_values, "next_values")
    V.float_tensor(value, "value", min_dim=0)
    V.same_layout(logits, "logits", value, "value", shape=logits.shape[:-1])
    eta = _eta(eta)
    if eta == 0.0:
        return torch.zeros_like(value)
    lse = torch.logsumexp(guided_logits(logits, next_values, eta), dim=-1)
    undefined = torch.isneginf(value) & torch.isneginf(lse)
    out = lse - eta * value
    return torch.where(undefined, torch.zeros_like(out), out)


# ------------------------------------------------------------------------- the exact small case

def random_token_tree(branching: int, depth: int, *, generator: torch.Generator | None = None,
                      scale: float = 1.5, dtype: torch.dtype = torch.float64) -> tuple[list[Tensor], Tensor]:
    r"""A complete token tree: a random next-token policy at every node and a reward at every leaf.

    Node ``i`` at depth ``d`` is the prefix whose tokens are the base-``K`` digits of ``i``
    (``K = branching``); its child by token ``v`` is node ``i * K + v`` at depth ``d + 1``. All
    :math:`K^D` responses have ``depth`` tokens, so every expectation over the tree is a finite sum.

    Args:
        branching: :math:`K \ge 2` tokens. depth: :math:`D \ge 1` tokens per response
            (:math:`K^D \le 10^6`).
        generator: for the draws. scale: the logits are ``scale`` times standard normals.
        dtype: a floating dtype.

    Returns:
        ``(logits, reward)``: ``logits[d]`` is ``[K^d, K]`` for ``d < D``; ``reward`` is ``[K^D]``,
        uniform in ``[0, 1]``. Chapter: 20_value_guided_decoding.
    """
    K = V.int_in(branching, "branching", 2)
    D = V.int_in(depth, "depth")
    if K ** D > 10 ** 6:
        raise ValueError(f"branching ** depth = {K ** D} leaves is too many to enumerate (at most 10**6)")
    scale = V.real_in(scale, "scale", 0.0)
    dtype = V.floating_dtype(dtype, "dtype")
    if generator is not None:
        V.instance_of(generator, "generator", torch.Generator)
    logits = [scale * torch.randn(K ** d, K, generator=generator, dtype=dtype) for d in range(D)]
    return logits, torch.rand(K ** D, generator=generator, dtype=dtype)


def _tree(logits, reward=None):
    V.instance_of(logits, "logits", (list, tuple), "list of [K^d, K] tensors")
    V.int_in(len(logits), "len(logits)")
    K = V.has_categories(logits[0], "logits[0]").shape[-1]
    for d, lg in enumerate(logits):
        V.float_tensor(lg, f"logits[{d}]", 2)
        V.exact_shape(lg, f"logits[{d}]", (K ** d, K), "(one row per node at that depth)")
    if reward is not None:
        V.float_tensor(reward, "reward")
        V.exact_shape(reward, "reward", (K ** len(logits),), "(one reward per leaf)")
        V.tensor_in(reward, "reward")
    return K, len(logits)


def tree_values(logits: Sequence[Tensor], reward: Tensor, kind: str = "soft", beta: float = 1.0) -> list[Tensor]:
    r"""Exact values of every node of a token tree under its policy :math:`\pi`, by backward recursion.

    * ``"soft"``: :math:`V_\beta(h) = \beta\log\mathbb E_\pi[e^{R/\beta}\mid h]`, i.e.
      :math:`V_\beta(h) = \beta\log\sum_v\pi(v\mid h)\,e^{V_\beta(h\oplus v)/\beta}`, :math:`V_\beta = R` at a leaf;
    * ``"mean"``: :math:`V^\pi(h) = \mathbb E_\pi[R\mid h] = \sum_v\pi(v\mid h)\,V^\pi(h\oplus v)`;
    * ``"log_success"``: :math:`\log P(S\mid h)` where a leaf succeeds with probability :math:`R\in[0,1]`:
      :math:`\log\sum_v\pi(v\mid h)\,P(S\mid h\oplus v)`, :math:`\log R` at a leaf.

    Args:
        logits: ``D`` tensors, ``logits[d]`` ``[K^d, K]`` (:func:`random_token_tree`).
        reward: ``[K^D]`` leaf rewards (in ``[0, 1]`` for ``"log_success"``).
        kind: one of :data:`TREE_VALUE_KINDS`. beta: :math:`\beta > 0` (``"soft"`` only).

    Returns:
        ``D + 1`` tensors, ``values[d]`` ``[K^d]``; ``values[D]`` are the leaf values.
        Chapter: 20_value_guided_decoding (eq. ``eq-ch20-soft``).
    """
    K, D = _tree(logits, reward)
    kind = V.choice(kind, "kind", TREE_VALUE_KINDS)
    beta = V.real_in(beta, "beta", 0.0, lo_open=True)
    if kind == "log_success":
        V.tensor_in(reward, "reward", 0.0, 1.0)
        leaf = reward.log()
    else:
        leaf = reward.clone()
    values = [leaf]
    for d in range(D - 1, -1, -1):
        child = values[0].view(K ** d, K)
        logp = F.log_softmax(logits[d], dim=-1)
        if kind == "soft":
            v = beta * torch.logsumexp(logp + child / beta, dim=-1)
        elif kind == "mean":
            v = (logp.exp() * child).sum(-1)
        else:
            v = torch.logsumexp(logp + child, dim=-1)
        values.insert(0, v)
    return values


def tree_guided_logprobs(logits: Sequence[Tensor], values: Sequence[Tensor], eta: float,
                         normalise: bool = True) -> tuple[Tensor, list[Tensor]]:
    r"""Log-probabilities of every leaf under token-by-token guidance, and :math:`\log Z` at every node.

    Each node's candidates get :math:`\log\pi(v\mid h) + \eta\,(V(h\oplus v) - V(h))`; with
    ``normalise=True`` a softmax over candidates follows (:func:`guided_logits`, the article's
    :math:`V(h)` cancelling), with ``normalise=False`` the scores are used as they are, as the
    article's formula reads literally. A leaf's log-probability is the sum over its tokens.

    Args:
        logits: ``D`` tensors ``[K^d, K]``; values: ``D + 1`` tensors ``[K^d]`` (:func:`tree_values`).
        eta: :math:`\eta \ge 0`. normalise: softmax at every node.

    Returns:
        ``(leaf_logprobs [K^D], log_normalisers)``, ``log_normalisers[d]`` ``[K^d]`` =
        :func:`log_normaliser` at every node of depth ``d``. Without normalisation the leaf
        "log-probabilities" sum to :math:`\log\sum_y` of a measure that is not a distribution
        unless every :math:`Z = 1`. Chapter: 20_value_guided_decoding.
    """
    K, D = _tree(logits)
    V.instance_of(values, "values", (list, tuple), "list of D + 1 tensors")
    if len(values) != D + 1:
        raise ValueError(f"values must hold D + 1 = {D + 1} tensors (one per depth, leaves last), got {len(values)}")
    for d, v in enumerate(values):
        V.exact_shape(V.float_tensor(v, f"values[{d}]"), f"values[{d}]", (K ** d,))
    eta = _eta(eta)
    V.boolean(normalise, "normalise")
    lp = torch.zeros(1, dtype=logits[0].dtype, device=logits[0].device)
    log_z = []
    for d in range(D):
        child = values[d + 1].view(K ** d, K)
        scores = guided_logits(logits[d], child, eta)
        log_z.append(log_normaliser(logits[d], child, values[d], eta))
        step = F.log_softmax(scores, dim=-1) if normalise else scores - (0.0 if eta == 0 else eta * values[d][:, None])
        lp = (lp[:, None] + step).reshape(-1)
    return lp, log_z


# ------------------------------------------------------------------------- a learned success critic

class SuccessCritic(nn.Module):
    r"""A success critic on a frozen LM's hidden states: :math:`\hat P(S\mid h\oplus v)` for every candidate.

    :math:`s_\phi(z_t)_v = \mathrm{MLP}(z_t)_v` is the logit of :math:`\hat P(S\mid h_t\oplus v)`, where
    :math:`z_t` is the final hidden state of the frozen ``lm`` after reading :math:`h_t`
    (``lm(ids, attention_mask, return_hidden=True)``). One pass scores all ``vocab_size``
    candidates, instead of one critic call per candidate; FUDGE {cite}`yang2021fudge` instead keeps the
    base model's top-:math:`k` candidates (200 in its released code) and runs its discriminator once on
    each candidate prefix. The head costs about ``n_embd * hidden + hidden * vocab_size`` multiply-adds
    per token.

    ``forward(ids [B, T], attention_mask=None) -> [B, T, vocab_size]`` success logits;
    ``out[:, t, v]`` scores the sequence ``ids[:, :t + 1]`` followed by ``v``.
    :meth:`log_success` is the ``log_success_fn`` that :class:`GuidedProcessor` takes. The body
    is never trained (its parameters are not the critic's); only the head is.

    Args:
        lm: a model whose ``forward`` accepts ``return_hidden=True`` (:class:`~rlkit.llm.GPT`).
        hidden: width of the MLP's hidden layer.
        vocab_size, n_embd: default ``lm.config.vocab_size`` and ``lm.config.n_embd``.

    Chapter: 20_value_guided_decoding.
    """

    accepts_attention_mask = True

    def __init__(self, lm: nn.Module, hidden: int = 128, vocab_size: int | None = None, n_embd: int | None = None):
        super().__init__()
        V.instance_of(lm, "lm", nn.Module)
        cfg = getattr(lm, "config", None)
        vocab_size = getattr(cfg, "vocab_size", None) if vocab_size is None else vocab_size
        n_embd = getattr(cfg, "n_embd", None) if n_embd is None else n_embd
        V.given(vocab_size, "vocab_size", "lm has no config.vocab_size")
        V.given(n_embd, "n_embd", "lm has no config.n_embd")
        self._lm = [lm]                                   # a list: the frozen body is not a submodule
        self.vocab_size = V.int_in(vocab_size, "vocab_size")
        self.head = nn.Sequential(nn.Linear(V.int_in(n_embd, "n_embd"), V.int_in(hidden, "hidden")),
                                  nn.GELU(), nn.Linear(hidden, self.vocab_size))

    @property
    def lm(self) -> nn.Module:
        """The frozen language model whose hidden states the head reads."""
        return self._lm[0]

    @torch.no_grad()
    def features(self, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """The frozen model's final hidden states ``[B, T, n_embd]`` (no gradient)."""
        _, z = self.lm(ids, attention_mask=attention_mask, return_hidden=True)
        width = self.head[0].in_features
        if z.shape[-1] != width:
            raise ValueError(f"n_embd={width} does not match lm, whose hidden states have {z.shape[-1]} features")
        return z

    def forward(self, ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        return self.head(self.features(ids, attention_mask))

    @torch.no_grad()
    def log_success(self, context_ids: Tensor, context_mask: Tensor) -> Tensor:
        """``[N, vocab_size]`` log success probabilities after ``context_ids [N, L]`` (int64, ``L >= 1``),
        ``context_mask [N, L]`` bool: a ``log_success_fn`` for :class:`GuidedProcessor`."""
        V.index_tensor(context_ids, "context_ids", dim=2, n=self.vocab_size)
        V.int_in(context_ids.shape[1], "the context length context_ids.shape[1]")
        V.bool_tensor(context_mask, "context_mask", context_ids, "context_ids")
        r""":math:`\log\hat P(S\mid h\oplus v)` ``[N, vocab_size]`` at the last position of each context row."""
        return F.logsigmoid(self.head(self.features(context_ids, context_mask)[:, -1]).float())

    def head_macs(self) -> int:
        """Multiply-adds of the head per scored position (its weight count)."""
        return sum(m.weight.numel() for m in self.head if isinstance(m, nn.Linear))


def fit_success_critic(critic: SuccessCritic, rollout: Rollout, rewards: Tensor, *, steps: int = 300,
                       lr: float = 3e-3, weight_decay: float = 0.0) -> Tensor:
    r"""Fit a :class:`SuccessCritic` to sampled responses by Monte Carlo classification.

    Every real token :math:`y_t` of response :math:`i` is one example: the head's logit for the
    token actually taken, :math:`s_\phi(z_t)_{y_t}`, is trained towards the response's final
    outcome :math:`R_i\in[0,1]` with the binary cross-entropy,

    .. math::  \mathcal L(\phi) = -\frac{1}{\sum_i L_i}\sum_i\sum_{t<L_i}
               \big[R_i\log\sigma(s_{i,t}) + (1 - R_i)\log(1-\sigma(s_{i,t}))\big],

    whose minimiser, where the data reach, is :math:`\sigma(s) = P_\pi(S\mid h_t, y_t)` for the policy
    :math:`\pi` that sampled the responses (CD-FUDGE's prefix scorer). Candidates never sampled at a
    state get no gradient: there the head extrapolates. Full-batch Adam on features computed once.

    Args:
        critic: the critic to train (its head, in place).
        rollout: responses sampled from the frozen model (:func:`rlkit.llm.sample`).
        rewards: ``[N]`` outcomes in ``[0, 1]``, one per response.
        steps: Adam steps (``>= 1``); lr: learning rate ``> 0``; weight_decay: ``>= 0``.

    Returns:
        ``[steps]`` training losses. Chapter: 20_value_guided_decoding (eq. ``eq-ch20-critic-loss``).
    """
    V.instance_of(critic, "critic", SuccessCritic)
    V.instance_of(rollout, "rollout", Rollout)
    V.float_tensor(rewards, "rewards")
    V.exact_shape(rewards, "rewards", (len(rollout),), "(one outcome per response)")
    V.tensor_in(rewards, "rewards", 0.0, 1.0)
    steps = V.int_in(steps, "steps")
    lr = V.real_in(lr, "lr", 0.0, lo_open=True)
    weight_decay = V.real_in(weight_decay, "weight_decay", 0.0)
    P, T = rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]
    real = rollout.mask.bool()
    if not bool(real.any()):
        raise ValueError("rollout has no real response tokens to learn from")
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    att = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_ids, dtype=torch.bool)], 1)
    z = critic.features(ids, att)[:, P - 1:P - 1 + T][real].float()
    taken = rollout.response_ids[real]
    target = rewards.to(z.device, z.dtype)[:, None].expand(-1, T)[real]
    opt = torch.optim.Adam(critic.head.parameters(), lr=lr, weight_decay=weight_decay)
    losses = torch.zeros(steps)
    for k in range(steps):
        s = critic.head(z).gather(-1, taken[:, None]).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(s, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses[k] = float(loss.detach())
    return losses


class GuidedProcessor:
    r"""A logits processor that guides a frozen model with success probabilities.

    At each step, with the base log-probs :math:`\log\pi(\cdot\mid h)` and
    :math:`\log p_v = \log P(S\mid h\oplus v)` from ``log_success_fn``:

    .. math::  f(h, z)_v = \log\pi_{S}(v\mid h) + g_\eta(p_v),

    where :math:`\pi_S` is :math:`\pi` truncated to its own top-k / top-p support and renormalised
    (``top_k``/``top_p`` here: *filter, then guide*; tokens outside get :math:`-\infty`) or
    :math:`\pi` itself, and :math:`g_\eta` is :func:`guidance_term`. Pass it as
    ``logits_processor`` to :func:`rlkit.llm.sample` (which then softmaxes, and applies its own
    ``top_k``/``top_p`` *after* guidance if given: *guide, then filter*), to
    :func:`rlkit.llm.token_logprobs` to recompute :math:`\log\tilde\pi`, or to
    :func:`rlkit.llm.train`. A row whose every candidate inside the support has :math:`p_v = 0`
    under ``"log_success"`` (conditioning on an impossible event) is left unguided.
    ``critic_rows`` counts the rows scored so far (for compute accounting).

    Args:
        log_success_fn: ``f(context_ids [N, L], context_mask [N, L]) -> [N, V]`` log success
            probabilities (e.g. :meth:`SuccessCritic.log_success`).
        eta: :math:`\eta\ge0`. kind: one of :data:`GUIDANCE_KINDS`.
        top_k, top_p: truncate the BASE distribution before guidance (None: no truncation).

    Chapter: 20_value_guided_decoding.
    """

    def __init__(self, log_success_fn: Callable[[Tensor, Tensor], Tensor], eta: float, kind: str = "log_success",
                 top_k: int | None = None, top_p: float | None = None):
        self.log_success_fn = V.is_callable(log_success_fn, "log_success_fn")
        self.eta = _eta(eta)
        self.kind = V.choice(kind, "kind", GUIDANCE_KINDS)
        self.top_k = None if top_k is None else V.int_in(top_k, "top_k")
        self.top_p = None if top_p is None else V.real_in(top_p, "top_p", 0.0, 1.0, lo_open=True)
        self.critic_rows = 0

    def __repr__(self) -> str:
        return f"GuidedProcessor(kind={self.kind!r}, eta={self.eta}, top_k={self.top_k}, top_p={self.top_p})"

    def __call__(self, context_ids: Tensor, context_mask: Tensor, logits: Tensor) -> Tensor:
        V.index_tensor(context_ids, "context_ids", dim=2)
        V.bool_tensor(context_mask, "context_mask", context_ids, "context_ids")
        V.has_categories(logits, "logits")
        V.exact_shape(logits, "logits", (context_ids.shape[0], logits.shape[-1]), "[N, V] (N rows of context_ids)")
        logp = sampling_logprobs(logits.float(), 1.0, self.top_k, self.top_p)
        if self.eta == 0.0:
            return logp
        ls = self.log_success_fn(context_ids, context_mask)
        if not isinstance(ls, Tensor) or ls.shape != logp.shape:
            got = tuple(ls.shape) if isinstance(ls, Tensor) else type(ls).__name__
            raise ValueError(f"log_success_fn must return log-probabilities of the shape of logits, "
                             f"{tuple(logp.shape)}, got {got}")
        self.critic_rows += logp.shape[0]
        g = guidance_term(ls.to(logp.dtype), self.kind, self.eta)
        out = logp + g
        dead = torch.isneginf(out).all(-1, keepdim=True)             # every supported candidate has p = 0
        return torch.where(dead, logp, out)


@torch.no_grad()
def guided_token_kl(model, rollout: Rollout, logits_processor=None, *, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None) -> Tensor:
    r"""Exact next-token KL of the sampling distribution from the base model, summed over each response.

    .. math::  \widehat{\mathrm{KL}}_i = \sum_{t < L_i}\sum_v q(v\mid h_t)\,\log\frac{q(v\mid h_t)}{\pi(v\mid h_t)},

    with :math:`q` the distribution :func:`rlkit.llm.sample` drew from (``logits_processor``,
    then ``temperature``/``top_k``/``top_p``) and :math:`\pi` the model at temperature 1. For
    responses sampled from :math:`q` its mean is :math:`\mathrm{KL}(q(\cdot\mid x)\,\|\,\pi(\cdot\mid x))`
    by the chain rule of KL (chapter 14, ``eq-ch14-chain``), with less variance than the sampled
    log-ratio. :math:`0\log0 = 0`.

    Args:
        model: the base model (LM protocol). rollout: responses sampled from :math:`q`.
        logits_processor, temperature, top_k, top_p: exactly as passed to :func:`rlkit.llm.sample`.

    Returns:
        ``[N]`` float32, 0 for empty responses. Chapter: 20_value_guided_decoding.
    """
    V.is_callable(model, "model")
    if logits_processor is not None:
        V.is_callable(logits_processor, "logits_processor")
    V.instance_of(rollout, "rollout", Rollout)
    N, T = rollout.response_ids.shape
    P = rollout.prompt_ids.shape[1]
    if N == 0 or T == 0:
        return torch.zeros(N, device=rollout.mask.device)
    real = rollout.mask.bool()
    ids = torch.cat([rollout.prompt_ids, rollout.response_ids], 1)
    att = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.response_ids, dtype=torch.bool)], 1)
    logits = call_model(model, ids, att)[:, P - 1:P - 1 + T].float()
    out = torch.zeros(N, device=logits.device)
    for t in range(T):
        alive = real[:, t]
        if not bool(alive.any()):
            break
        z = logits[:, t]
        logq = sampling_logprobs(apply_logits_processor(logits_processor, ids[:, :P + t], att[:, :P + t], z),
                                 temperature, top_k, top_p)
        logp = F.log_softmax(z, -1)
        q = logq.exp()
        kl = (q * (logq - logp)).masked_fill(q == 0, 0.0).sum(-1)
        out = out + torch.where(alive, kl, torch.zeros_like(kl))
    return out


# ------------------------------------------------------------------------- exact binary-reward frontiers

def _p_success(p) -> Tensor:
    V.float_tensor(p, "p_success")
    V.tensor_in(p, "p_success", 0.0, 1.0)
    return p


def _binary_kl(a: Tensor, p: Tensor) -> Tensor:
    """KL(Bernoulli(a) || Bernoulli(p)) with 0 log 0 = 0."""
    def term(x, y):
        return torch.where(x > 0, x * (torch.log(x.clamp_min(1e-300)) - torch.log(y.clamp_min(1e-300))),
                           torch.zeros_like(x))
    return term(a, p) + term(1 - a, 1 - p)


def kl_optimum_binary(p_success: Tensor, eta: float) -> tuple[Tensor, Tensor]:
    r"""Accuracy and KL of the KL-regularised optimum for a binary reward, per prompt, exactly.

    With :math:`p = \pi(S\mid x)` and :math:`\beta = 1/\eta`, the optimum
    :math:`\pi(y)e^{\eta R(y)}/Z` (chapter 5, ``eq-ch05-kl-optimum``) keeps :math:`\pi`'s shape inside
    the successes and inside the failures and moves the success mass to

    .. math::  a = \frac{p\,e^{\eta}}{1 - p + p\,e^{\eta}},\qquad
               \mathrm{KL} = a\log\frac ap + (1-a)\log\frac{1-a}{1-p}.

    It is also what token-by-token soft-value guidance samples with a perfect critic (eq.
    ``eq-ch20-soft``). Both are ``[...]`` tensors like ``p_success``.
    Chapter: 20_value_guided_decoding.
    """
    p = _p_success(p_success)
    eta = _eta(eta)
    a = p * math.exp(eta) / (1 - p + p * math.exp(eta)) if eta < 700 else (p > 0).to(p.dtype)
    return a, _binary_kl(a, p)


def best_of_n_binary(p_success: Tensor, n: int) -> tuple[Tensor, Tensor]:
    r"""Accuracy and KL of best-of-n with a perfect binary verifier, per prompt, exactly.

    Draw :math:`n` responses from :math:`\pi` and keep a correct one if there is one. The kept
    response is correct with probability :math:`a = 1 - (1-p)^n`, and inside the successes (and
    inside the failures) it is distributed as :math:`\pi`, so it is the same two-outcome tilt as
    :func:`kl_optimum_binary` with :math:`\mathrm{KL} = a\log\frac ap + (1-a)\log\frac{1-a}{1-p}`,
    which is below the :math:`\log n - (n-1)/n` usually quoted (that holds for continuous rewards).
    Chapter: 20_value_guided_decoding.
    """
    p = _p_success(p_success)
    n = V.int_in(n, "n")
    a = 1 - (1 - p) ** n
    return a, _binary_kl(a, p)
