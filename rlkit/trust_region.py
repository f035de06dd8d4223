r"""The numerical pieces of TRPO: conjugate gradient, Fisher-vector products, line search.

TRPO (Schulman et al., 2015) maximises the surrogate :math:`L(\theta)` subject to
:math:`\bar D_{\mathrm{KL}}(\pi_{\text{old}}\,\|\,\pi_\theta) \le \delta`. With the gradient
:math:`g = \nabla L` and the Fisher matrix :math:`F` (the Hessian of the mean KL at
:math:`\theta_{\text{old}}`) the step is

1. :math:`s \approx F^{-1} g` by :func:`conjugate_gradient`, which only needs products
   :math:`Fv` (:func:`fisher_vector_product`, two backward passes, no :math:`F` in memory);
2. scaled to the trust-region boundary: :math:`\Delta\theta = \sqrt{2\delta / s^\top F s}\; s`;
3. shrunk by :func:`backtracking_line_search` until the KL constraint holds and the surrogate
   really improves.

Chapter: 04_kl_trpo_ppo.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from . import _validate as V

Tensor = torch.Tensor

__all__ = ["conjugate_gradient", "fisher_vector_product", "backtracking_line_search",
           "flat_grad"]


def conjugate_gradient(Avp: Callable[[Tensor], Tensor], b: Tensor, iters: int = 10,
                       tol: float = 1e-10) -> Tensor:
    r"""Solve :math:`A x = b` for a symmetric positive-definite :math:`A` known only through ``Avp``.

    Standard CG from :math:`x_0 = 0`: residual :math:`r_0 = b`, direction :math:`p_0 = r_0`, and

    .. math::  \alpha_k = \frac{r_k^\top r_k}{p_k^\top A p_k},\quad x_{k+1} = x_k + \alpha_k p_k,
               \quad r_{k+1} = r_k - \alpha_k A p_k,\quad
               p_{k+1} = r_{k+1} + \frac{r_{k+1}^\top r_{k+1}}{r_k^\top r_k}\, p_k .

    Exact after :math:`n` steps in exact arithmetic for an :math:`n\times n` matrix; TRPO uses
    about 10. Stops early when :math:`r^\top r \le` ``tol`` (at once for ``b = 0``, so an empty
    or zero right-hand side gives ``x = 0`` without calling ``Avp``).

    Args:
        Avp: function ``v -> A v`` (a tensor of ``b``'s shape).
        b: right-hand side, a float tensor (usually a flat ``[n]`` vector).
        iters: maximum number of iterations ``>= 1``.
        tol: threshold on the squared residual norm, finite and ``>= 0``.

    Returns:
        ``x`` with ``b``'s shape (no graph).

    Chapter: 04_kl_trpo_ppo.
    """
    V.is_callable(Avp, "Avp")
    V.float_tensor(b, "b", min_dim=1)
    iters = V.int_in(iters, "iters")
    tol = V.real_in(tol, "tol", 0.0)
    b = b.detach()
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = (r * r).sum()
    for _ in range(iters):
        if float(rr) <= tol:
            break
        Ap = V.exact_shape(V.instance_of(Avp(p), "Avp(v)", torch.Tensor), "Avp(v)",
                           b.shape).detach()
        pAp = (p * Ap).sum()
        if float(pAp) <= 0:
            raise ValueError(f"Avp is not positive definite along a CG direction (p^T A p = "
                             f"{float(pAp):.3g}); add damping")
        alpha = rr / pAp
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = (r * r).sum()
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x


def flat_grad(y: Tensor, params: Sequence[Tensor], create_graph: bool = False,
              retain_graph: bool = None) -> Tensor:
    """Gradient of the scalar ``y`` w.r.t. ``params``, flattened and concatenated (zeros for
    parameters ``y`` does not depend on).

    ``y`` is a floating tensor of one element with a graph (``requires_grad``); ``params`` a
    non-empty iterable of tensors with ``requires_grad=True``; ``create_graph`` True or False;
    ``retain_graph`` None (torch's default: ``create_graph``), True or False.
    """
    V.float_tensor(y, "y", min_dim=0)
    if y.numel() != 1 or not y.requires_grad:
        raise ValueError(f"y must be a scalar with a graph (one element, requires_grad=True), got shape "
                         f"{tuple(y.shape)} with requires_grad={y.requires_grad}")
    params = V.trainable_params(params, "params")
    V.boolean(create_graph, "create_graph")
    if retain_graph is not None:
        V.boolean(retain_graph, "retain_graph")
    grads = torch.autograd.grad(y, params, create_graph=create_graph, retain_graph=retain_graph,
                                allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1)
                      for g, p in zip(grads, params)])


def fisher_vector_product(kl_fn: Callable[[], Tensor], params: Iterable[Tensor], v: Tensor,
                          damping: float = 0.1) -> Tensor:
    r"""Fisher-vector product :math:`(F + \text{damping}\cdot I)\,v` by double backprop.

    ``kl_fn()`` must return the mean :math:`\bar D_{\mathrm{KL}}(\pi_{\text{old}}\,\|\,\pi_\theta)`
    with :math:`\pi_{\text{old}}` detached, evaluated at the current parameters (which equal
    :math:`\theta_{\text{old}}` during the TRPO step). There its gradient is 0 and its Hessian is
    the Fisher information matrix :math:`F`, so

    .. math::  F v = \nabla_\theta\big( (\nabla_\theta \bar D_{\mathrm{KL}})^\top v \big),

    two backward passes and no :math:`n\times n` matrix. Damping keeps CG stable when
    :math:`F` is nearly singular.

    Args:
        kl_fn: zero-argument callable returning a 0-dim KL tensor.
        params: the parameters (tensors with ``requires_grad``), e.g. ``list(policy.parameters())``.
        v: flat ``[n]`` vector, ``n`` = total number of parameters.
        damping: finite, ``>= 0``.

    Returns:
        A flat ``[n]`` tensor (no graph).

    Chapter: 04_kl_trpo_ppo.
    """
    V.is_callable(kl_fn, "kl_fn")
    params = V.trainable_params(params, "params")
    V.float_tensor(v, "v", min_dim=1)
    V.exact_shape(v, "v", (sum(p.numel() for p in params),), "[number of parameters]")
    damping = V.real_in(damping, "damping", 0.0)
    kl = V.instance_of(kl_fn(), "kl_fn()", torch.Tensor)
    V.exact_shape(kl.reshape(-1), "kl_fn() (flattened)", (1,), "one number")
    g = flat_grad(kl.reshape(()), params, create_graph=True)
    gv = (g * v.detach().to(g.dtype)).sum()
    if not gv.requires_grad:   # KL does not depend on params at second order
        return damping * v.detach()
    hv = flat_grad(gv, params)
    return hv.detach() + damping * v.detach()


def backtracking_line_search(evaluate: Callable[[Tensor], tuple[float, float]],
                             full_step: Tensor, max_constraint: float,
                             expected_improvement: float = None, backtrack_ratio: float = 0.5,
                             max_backtracks: int = 10, accept_ratio: float = 0.1
                             ) -> tuple[bool, float, dict]:
    r"""Shrink a proposed step until it satisfies the constraint and improves the objective.

    Tries the fractions :math:`f = \beta^k`, :math:`k = 0, 1, \dots,` ``max_backtracks - 1``
    (:math:`\beta` = ``backtrack_ratio``) and accepts the first one with

    .. math::  C(f\,\Delta) \le C_{\max}, \qquad \mathrm{imp}(f) = \mathrm{loss}(0) - \mathrm{loss}(f\Delta) > 0,

    and, if ``expected_improvement`` :math:`e` (the first-order prediction for the FULL step,
    :math:`-\nabla\mathrm{loss}^\top\Delta`) is given, :math:`\mathrm{imp}(f) \ge` ``accept_ratio``
    :math:`\cdot f e`.

    Args:
        evaluate: ``step -> (loss, constraint)`` for parameters ``theta_old + step``, where
            ``loss`` is the quantity to MINIMISE (e.g. minus the surrogate) and ``constraint``
            the mean KL. It must leave the parameters as it found them; it is called once
            with a zero step for the baseline.
        full_step: the proposed step :math:`\Delta` (e.g. the scaled CG direction).
        max_constraint: :math:`C_{\max}` (TRPO's :math:`\delta`), ``>= 0``.
        expected_improvement: optional, a finite number; at most 0 (a first-order prediction
            of no gain) turns the ratio test off.
        backtrack_ratio: :math:`\beta \in (0, 1)`. max_backtracks: ``>= 1``.
        accept_ratio: in ``[0, 1]``.

    Returns:
        ``(accepted, step_fraction, info)``: apply ``step_fraction * full_step`` if
        ``accepted`` (``step_fraction`` is 0.0 otherwise); ``info`` has ``loss_before``,
        ``loss``, ``constraint``, ``improvement``, ``n_evals`` and ``history`` (a list of
        ``(fraction, loss, constraint)``).

    Chapter: 04_kl_trpo_ppo.
    """
    V.is_callable(evaluate, "evaluate")
    V.float_tensor(full_step, "full_step", min_dim=1)
    max_constraint = V.real_in(max_constraint, "max_constraint", 0.0)
    if expected_improvement is not None:
        expected_improvement = V.real_in(expected_improvement, "expected_improvement")
    beta = V.real_in(backtrack_ratio, "backtrack_ratio", 0.0, 1.0, lo_open=True, hi_open=True)
    max_backtracks = V.int_in(max_backtracks, "max_backtracks")
    accept_ratio = V.real_in(accept_ratio, "accept_ratio", 0.0, 1.0)

    def ev(step):
        out = evaluate(step)
        try:
            loss, con = out
            return float(loss), float(con)
        except (TypeError, ValueError):
            raise TypeError(f"evaluate must return two numbers (loss, constraint), got {out!r}") from None

    step = full_step.detach()
    loss0, _ = ev(torch.zeros_like(step))
    history: list[tuple[float, float, float]] = []
    info = {"loss_before": loss0, "loss": loss0, "constraint": 0.0, "improvement": 0.0,
            "n_evals": 1, "history": history}
    frac = 1.0
    for _ in range(max_backtracks):
        loss, con = ev(frac * step)
        history.append((frac, loss, con))
        info["n_evals"] += 1
        imp = loss0 - loss
        ok = con <= max_constraint and imp > 0 and loss == loss   # loss == loss: not NaN
        if ok and expected_improvement is not None and expected_improvement > 0:
            ok = imp >= accept_ratio * frac * expected_improvement
        if ok:
            info.update(loss=loss, constraint=con, improvement=imp)
            return True, frac, info
        frac *= beta
    return False, 0.0, info
