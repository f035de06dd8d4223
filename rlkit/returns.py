r"""Returns and advantages computed backwards in time.

Conventions (the book's notation page): time is the LAST dimension and any leading dimensions are
batch dimensions. For a step ``t`` of a trajectory segment of length ``T``

* ``rewards[..., t]``      :math:`r_t`,
* ``values[..., t]``       :math:`V(s_t)`,
* ``next_values[..., t]``  :math:`V(s_{t+1})` (at a truncation: V of the final observation),
* ``discounts[..., t]``    :math:`\gamma_t = \gamma\,(1 - \text{terminated}_t)`,
* ``lam``                  a float or a tensor :math:`\lambda_t` shaped like ``rewards`` that is 0
  where a trace must stop (a truncation, an autoreset boundary).

Every quantity here is a *backward linear recurrence*

.. math::  y_t = b_t + a_t\, y_{t+1}, \qquad y_T = y_{\text{init}},

with a different choice of :math:`a_t, b_t`. Each function below is written as its recursion: a
loop over ``t`` from ``T-1`` down to 0, each step one vectorised operation over the whole batch.
Without autograd and for longer segments the same numbers come from a private blocked scan
(``_scan_blocked``, ``C + K`` small steps instead of ``T``), which the tests prove equal to
the loops and ``benchmarks/bench_returns.py`` shows to pay (``blocked_scan_pays``).

Chapters: 01_policy_gradient (discounted returns), 02_advantage_gae (GAE, lambda-returns,
``from_gymnasium``), Part III (n-step and lambda-returns for long text).
"""
from __future__ import annotations

import threading

import torch

from . import _validate as V

Tensor = torch.Tensor
FloatOrTensor = float | Tensor

__all__ = [
    "discounted_returns",
    "n_step_returns",
    "lambda_returns",
    "gae",
    "from_gymnasium",
    "td_errors",
    "release_workspace",
]


# ----------------------------------------------------------------------------------------------
# The one recurrence behind everything in this module
# ----------------------------------------------------------------------------------------------

_WORKSPACE = threading.local()
_WORKSPACE_MAX_BYTES = 256 * 2 ** 20


def _workspace(numel: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Scratch memory for the blocked scan, kept between calls (CPU only, per thread).

    Freshly allocated multi-megabyte buffers cost page faults on first touch, and the
    transposed writes of the scan touch pages in a scattered order, which made them cost more
    than the arithmetic. GPUs have a caching allocator already, so there we just allocate.
    """
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes > _WORKSPACE_MAX_BYTES:
        return torch.empty(numel, dtype=dtype, device=device)
    bufs = getattr(_WORKSPACE, "bufs", None)
    if bufs is None:
        bufs = _WORKSPACE.bufs = {}
    buf = bufs.get(dtype)
    if buf is None or buf.numel() < numel:
        buf = bufs[dtype] = torch.empty(numel, dtype=dtype, device=device)
    return buf[:numel]


def release_workspace() -> None:
    """Free the scratch memory the blocked scan keeps between calls (this thread's)."""
    _WORKSPACE.bufs = {}


def _scan_blocked(a: Tensor, b: Tensor, init: Tensor, block: int = 0, a_scale: float = 1.0,
                  out: Tensor = None) -> Tensor:
    """Fast path for y_t = b_t + (a_scale * a_t) y_{t+1} on [N, T] tensors (no autograd).

    The time axis is cut into ``K`` blocks of ``C`` steps (``C ~ sqrt(T)``, the last block padded
    with ``a = 1, b = 0``), and the data is transposed to time-major ``[K, C, N]`` so that every
    step below reads and writes contiguous rows of ``N`` numbers.

    1. Inside all blocks at once, solve with a zero carry: ``u_t = b_t + a_t u_{t+1}``, and keep
       the running product ``p_t = a_t p_{t+1}`` (``p_t`` = product of ``a`` from ``t`` to the
       end of its block), overwriting ``a``. A loop of ``C`` steps over ``[K, N]`` slabs.
    2. Carry across blocks, last to first: ``y_start(k) = u_start(k) + p_start(k) * carry_k``,
       where ``carry_k`` is ``y`` at the first step of block ``k+1`` (``init`` for the last
       block). A loop of ``K`` steps over ``[N]`` rows.
    3. One fused pass: ``y_t = u_t + p_t * carry_{block(t)}``; transpose back into ``out``
       (a contiguous ``[N, T]`` buffer, which may be ``a`` or ``b`` itself).

    ``C + K`` small steps instead of ``T`` (64 instead of 1024 at T=1024); the cost is then
    dominated by the two transposes in and the one out. Same sums as the loops of the public
    functions, associated differently, so the two agree to rounding (tested).
    """
    N, T = b.shape
    C = block if block > 0 else min(64, max(8, int(round(T ** 0.5))))
    K = -(-T // C)
    TP = K * C
    ws = _workspace(2 * TP * N, b.dtype, b.device)
    ap = ws[:TP * N].view(TP, N)        # a, then (in place) the in-block products p
    u = ws[TP * N:].view(TP, N)         # b, then (in place) the in-block solution u, then y
    ap[:T].copy_(a.t())
    u[:T].copy_(b.t())
    if a_scale != 1.0:
        ap[:T].mul_(a_scale)
    if TP > T:   # padding: a = 1, b = 0 lets init pass through unchanged
        ap[T:].fill_(1.0)
        u[T:].zero_()
    ap = ap.view(K, C, N)
    u = u.view(K, C, N)
    a_c, u_c = ap.unbind(1), u.unbind(1)         # C views of shape [K, N] each
    for c in range(C - 2, -1, -1):
        u_c[c].addcmul_(a_c[c], u_c[c + 1])       # u_c = b_c + a_c u_{c+1}
        a_c[c].mul_(a_c[c + 1])                   # p_c = a_c p_{c+1}
    carries = []
    y = init
    u0, p0 = u_c[0].unbind(0), a_c[0].unbind(0)   # block starts, K views of shape [N]
    for k in range(K - 1, -1, -1):
        carries.append(y)
        y = torch.addcmul(u0[k], p0[k], y)
    carry = torch.stack(carries[::-1]).unsqueeze(1)   # [K, 1, N]
    u.addcmul_(ap, carry)
    if out is None:
        out = torch.empty(N, T, dtype=b.dtype, device=b.device)
    out.copy_(u.view(TP, N)[:T].t())
    return out


def reverse_scan(a: Tensor, b: Tensor, init: Tensor, a_scale: float = 1.0, out: Tensor = None) -> Tensor:
    """``_scan_blocked`` on ``[..., T]`` tensors: ``y_t = b_t + a_scale * a_t * y_{t+1}``.

    ``out`` (optional) is a contiguous tensor shaped like ``b`` that may be overwritten (it may
    be ``b`` itself). No autograd: only called where ``blocked_scan_pays``.
    """
    shape, T = b.shape, b.shape[-1]
    with torch.no_grad():
        o = out.view(-1, T) if out is not None and out.is_contiguous() else None
        y = _scan_blocked(a.reshape(-1, T), b.reshape(-1, T), init.reshape(-1),
                          a_scale=a_scale, out=o)
    return y.view(shape)


# The readable loops cost a few small tensor operations per time step; the blocked scan costs
# C + K ~ 2 sqrt(T) of them plus three passes over memory. `python benchmarks/bench_returns.py
# --crossover` times both (gae, 1 thread): the loop is faster up to T = 4, the scan from T = 8
# on at every batch size tried (1 to 4096 rows; 1.1x to 1.7x at T = 8, 4x to 66x at T = 1024).
# The scan is used for T > 8 (rlkit 0.1's threshold, which keeps results bitwise unchanged) and
# never under autograd, which it does not support.
_LOOP_MAX_T = 8


def blocked_scan_pays(*xs) -> bool:
    """Whether a function of this module uses the blocked scan instead of its loop."""
    ref = xs[0]
    return ref.shape[-1] > _LOOP_MAX_T and ref.numel() > 0 and not (
        torch.is_grad_enabled() and any(isinstance(x, Tensor) and x.requires_grad for x in xs))


def per_step(x: FloatOrTensor, like: Tensor) -> Tensor:
    """A per-step coefficient as a ``[..., T]`` tensor (a float becomes a broadcast view)."""
    return x if isinstance(x, Tensor) else like.new_tensor(x).expand(like.shape)


# ----------------------------------------------------------------------------------------------
# Public functions: each is its recursion, a loop over t vectorised over the batch
# ----------------------------------------------------------------------------------------------

def discounted_returns(rewards: Tensor, discounts: Tensor, bootstrap: FloatOrTensor) -> Tensor:
    r"""Discounted returns (reward-to-go) with a bootstrap value after the last step.

    .. math::  G_t = r_t + \gamma_t\, G_{t+1}, \qquad G_T = \text{bootstrap},

    i.e. :math:`G_t = \sum_{k=t}^{T-1} \big(\prod_{j=t}^{k-1}\gamma_j\big) r_k
    + \big(\prod_{j=t}^{T-1}\gamma_j\big)\,\text{bootstrap}`. A terminal step has
    :math:`\gamma_t = 0`, which stops the sum there, so several episodes can sit in one row.

    Args:
        rewards: ``[..., T]`` float tensor.
        discounts: ``[..., T]``, values in ``[0, 1]``,
            :math:`\gamma_t = \gamma(1-\text{terminated}_t)`.
        bootstrap: value of the state after the last step, a finite tensor of shape
            ``rewards.shape[:-1]`` or a finite Python number used for every row (pass 0.0 for
            complete episodes).

    Returns:
        ``[..., T]`` returns :math:`G_t` (empty if ``T = 0`` or the batch is empty).

    Chapter: 01_policy_gradient (reward-to-go for REINFORCE).
    """
    V.matching_floats(rewards=rewards, discounts=discounts)
    V.tensor_in(discounts, "discounts", 0.0, 1.0)
    G = V.finite_per_row(bootstrap, "bootstrap", rewards, "rewards")     # G_T
    if blocked_scan_pays(rewards, discounts, G):
        return reverse_scan(discounts, rewards, G)
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[-1])):
        G = rewards[..., t] + discounts[..., t] * G
        returns[..., t] = G
    return returns


def td_errors(rewards: Tensor, values: Tensor, next_values: Tensor, discounts: Tensor) -> Tensor:
    r"""One-step TD errors :math:`\delta_t = r_t + \gamma_t V(s_{t+1}) - V(s_t)`.

    Args:
        rewards, values, next_values, discounts: ``[..., T]`` float tensors.

    Returns:
        ``[..., T]``.

    Chapter: 02_advantage_gae.
    """
    V.matching_floats(rewards=rewards, values=values, next_values=next_values,
                      discounts=discounts)
    V.tensor_in(discounts, "discounts", 0.0, 1.0)
    return rewards + discounts * next_values - values


def n_step_returns(rewards: Tensor, discounts: Tensor, next_values: Tensor, n: int) -> Tensor:
    r"""n-step bootstrapped returns.

    .. math::  G^{(n)}_t = \sum_{k=0}^{m-1}\Big(\prod_{j=0}^{k-1}\gamma_{t+j}\Big) r_{t+k}
               + \Big(\prod_{j=0}^{m-1}\gamma_{t+j}\Big) V(s_{t+m}), \qquad m = \min(n, T - t).

    A window that runs past the end of the segment is cut there and bootstraps from the last
    available next value, ``next_values[..., T-1]``. With ``n >= T`` every window reaches the end,
    so the result is the Monte Carlo return bootstrapped with ``next_values[..., -1]``. A terminal
    step (:math:`\gamma = 0`) inside a window zeroes everything after it, as it should.

    Computed by the recursion :math:`G^{(k)}_t = r_t + \gamma_t G^{(k-1)}_{t+1}`,
    :math:`G^{(0)}_{t+1} = V(s_{t+1})`, applied ``min(n, T)`` times to whole tensors.

    Args:
        rewards, discounts, next_values: ``[..., T]``
            (``next_values[..., t]`` = :math:`V(s_{t+1})`).
        n: number of steps, an int ``>= 1``.

    Returns:
        ``[..., T]``.

    Chapter: Part III, "n-step and TD(lambda) for long text".
    """
    V.matching_floats(rewards=rewards, discounts=discounts, next_values=next_values)
    V.tensor_in(discounts, "discounts", 0.0, 1.0)
    n = V.int_in(n, "n")
    # h[..., t] holds G^{(k-1)}_{t+1}: the (k-1)-step return starting at t+1, with the
    # convention that a window starting past the end is next_values[..., T-1].
    h = next_values
    g = next_values.clone()
    last = next_values[..., -1:]
    for _ in range(min(n, rewards.shape[-1])):
        g = rewards + discounts * h
        h = torch.cat([g[..., 1:], last], dim=-1)
    return g


def lambda_returns(rewards: Tensor, discounts: Tensor, next_values: Tensor,
                   lam: FloatOrTensor) -> Tensor:
    r"""TD(lambda) returns.

    .. math::  G^\lambda_t = r_t + \gamma_t\big[(1-\lambda_t)\,V(s_{t+1})
               + \lambda_t\, G^\lambda_{t+1}\big], \qquad G^\lambda_T = V(s_T),

    so the last step bootstraps fully: :math:`G^\lambda_{T-1} = r_{T-1} + \gamma_{T-1} V(s_T)`.
    ``lam=1`` gives the Monte Carlo return bootstrapped at the end; ``lam=0`` the one-step TD
    target. A per-step ``lam`` that is 0 at step ``t`` makes step ``t`` bootstrap from
    ``next_values[..., t]`` and ignore everything later: use it where a trace must stop
    (truncation, see :func:`from_gymnasium`).

    Args:
        rewards, discounts, next_values: ``[..., T]``.
        lam: a float in ``[0, 1]`` or a ``[..., T]`` tensor with values in ``[0, 1]``.

    Returns:
        ``[..., T]``.

    Chapter: 02_advantage_gae, and Part III for long text.
    """
    V.matching_floats(rewards=rewards, discounts=discounts, next_values=next_values)
    V.tensor_in(discounts, "discounts", 0.0, 1.0)
    lam = V.scalar_or_like(lam, "lam", rewards, "rewards")
    if blocked_scan_pays(rewards, discounts, next_values, lam):
        return _lambda_returns_blocked(rewards, discounts, next_values, lam)
    lam, T = per_step(lam, rewards), rewards.shape[-1]
    returns = torch.zeros_like(rewards)
    G = next_values[..., T - 1] if T else None                     # G_T = V(s_T)
    for t in reversed(range(T)):
        G = rewards[..., t] + discounts[..., t] * (
            (1 - lam[..., t]) * next_values[..., t] + lam[..., t] * G)
        returns[..., t] = G
    return returns


def gae(rewards: Tensor, values: Tensor, next_values: Tensor, discounts: Tensor,
        lam: FloatOrTensor) -> tuple[Tensor, Tensor]:
    r"""Generalised advantage estimation (Schulman et al., 2016).

    .. math::  \delta_t = r_t + \gamma_t V(s_{t+1}) - V(s_t), \qquad
               \hat A_t = \delta_t + \gamma_t \lambda_t \hat A_{t+1}, \quad \hat A_T = 0,

    i.e. :math:`\hat A_t = \sum_{l\ge 0} \big(\prod_{j=0}^{l-1}\gamma_{t+j}\lambda_{t+j}\big)
    \delta_{t+l}`, and the value targets are ``returns = advantages + values``.

    Special cases (tested): ``lam=0`` gives :math:`\hat A_t = \delta_t`; ``lam=1`` gives the
    discounted return bootstrapped with ``next_values[..., -1]`` minus ``values`` (when
    ``next_values[..., t] == values[..., t+1]`` inside an episode). When ``next_values`` is
    ``values`` shifted by one inside episodes, ``returns`` equals :func:`lambda_returns`.

    Args:
        rewards, values, next_values, discounts: ``[..., T]`` float tensors, one dtype and device.
        lam: a float in ``[0, 1]`` or a ``[..., T]`` tensor (0 where the trace must stop).

    Returns:
        ``(advantages, returns)``, both ``[..., T]``. Gradients flow through all inputs (use
        ``torch.no_grad()`` or detached values as usual).

    Chapter: 02_advantage_gae.
    """
    V.matching_floats(rewards=rewards, values=values, next_values=next_values,
                      discounts=discounts)
    V.tensor_in(discounts, "discounts", 0.0, 1.0)
    lam = V.scalar_or_like(lam, "lam", rewards, "rewards")
    if blocked_scan_pays(rewards, values, next_values, discounts, lam):   # same numbers, faster
        advantages = _gae_blocked(rewards, values, next_values, discounts, lam)
        return advantages, advantages + values
    lam = per_step(lam, rewards)
    advantages = torch.zeros_like(rewards)
    A = rewards.new_zeros(rewards.shape[:-1])                      # A_T = 0
    for t in reversed(range(rewards.shape[-1])):                   # t = T-1, ..., 0
        delta = rewards[..., t] + discounts[..., t] * next_values[..., t] - values[..., t]
        A = delta + discounts[..., t] * lam[..., t] * A            # A_t from A_{t+1}
        advantages[..., t] = A
    return advantages, advantages + values


def from_gymnasium(terminated, truncated, gamma: float,
                   dtype: torch.dtype = None) -> tuple[Tensor, Tensor]:
    r"""Turn gymnasium's ``terminated`` / ``truncated`` flags into ``(discounts, lam_mask)``.

    .. math::  \gamma_t = \gamma\,(1 - \text{terminated}_t), \qquad
               \text{lam\_mask}_t = 1 - \text{truncated}_t .

    * A **termination** is a true end: nothing follows, so the discount is 0 and the bootstrap
      term :math:`\gamma_t V(s_{t+1})` vanishes.
    * A **truncation** (time limit) is not an end of the task: the discount stays
      :math:`\gamma`, and the step must bootstrap from the value of the observation the episode
      stopped in. So ``next_values[..., t]`` MUST hold V(final observation) at a truncated step
      (with gymnasium >= 1.0 vector envs, build them with
      ``autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP`` and read
      ``infos["final_obs"]``; the observation returned at that step is already the reset one).
      What must stop is the *trace*: the next step in the row belongs to a new episode, so
      multiply your lambda by ``lam_mask`` (``lam = 0.95 * lam_mask``), which makes
      :func:`gae` and :func:`lambda_returns` cut the recursion at ``t``.
    * With the default NEXT_STEP autoreset, the step after every end is a dummy reset step;
      mask it out of the loss (and give it ``lam_mask = 0`` too).

    Args:
        terminated, truncated: ``[..., T]`` bool tensors or numpy arrays (0/1 ints are accepted).
        gamma: discount factor in ``[0, 1]``.
        dtype: floating dtype of the outputs (default: ``torch.get_default_dtype()``).

    Returns:
        ``(discounts, lam_mask)``, two ``[..., T]`` float tensors on the flags' device.

    Chapter: 02_advantage_gae (the section on truncation and autoreset).
    """
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
    term = V.bool_flags(terminated, "terminated")
    trunc = V.same_layout(term, "terminated", V.bool_flags(truncated, "truncated"), "truncated")
    dtype = V.floating_dtype(torch.get_default_dtype() if dtype is None else dtype, "dtype")
    discounts = (~term).to(dtype) * gamma
    lam_mask = (~trunc).to(dtype)
    return discounts, lam_mask


# ----------------------------------------------------------------------------------------------
# Fast paths: the same recursions, vectorised in time by the blocked scan (no autograd). Written
# with few full-size temporaries: on a CPU each fresh one costs page faults.
# ----------------------------------------------------------------------------------------------

def _lambda_returns_blocked(rewards, discounts, next_values, lam) -> Tensor:
    # G_t = [r_t + gamma_t (1 - lam_t) V(s_{t+1})] + (gamma_t lam_t) G_{t+1}, G_T = V(s_T)
    init = next_values[..., -1]
    if isinstance(lam, float):
        b = torch.addcmul(rewards, discounts, next_values, value=1.0 - lam)
        return reverse_scan(discounts, b, init, a_scale=lam, out=b)
    a = discounts * lam
    b = rewards + (discounts - a) * next_values
    return reverse_scan(a, b, init, out=b)


def _gae_blocked(rewards, values, next_values, discounts, lam) -> Tensor:
    # A_t = delta_t + (gamma_t lam_t) A_{t+1}, A_T = 0 (solved in place of delta)
    delta = torch.addcmul(rewards, discounts, next_values).sub_(values)
    zero = delta.new_zeros(delta.shape[:-1])
    if isinstance(lam, float):
        return reverse_scan(discounts, delta, zero, a_scale=lam, out=delta)
    return reverse_scan(discounts * lam, delta, zero, out=delta)
