r"""Probes: how a checker obtains a function's outputs on a case when the return value is not all.

An exercise declared with ``probe=...`` (see :func:`rlkit.exercises.exercise`) runs every function
(the student's, the reference, each registered mistake) as ``probe(fn, *args, **kwargs)`` and
compares what the probe returns. The probes live here, on the student's side, because
:func:`rlkit.exercises.check` runs the student's function through them in the student bundle too;
the stored expected outputs (``rlkit/exercises/expected/chNN.pt``) name the probe they were
recorded with, and :data:`PROBES` maps that name back to the function.
"""
from __future__ import annotations

import torch

__all__ = ["PROBES", "loss_probe"]


def loss_probe(fn, logits, actions, weights, mask):
    r"""Run a loss function on a case and return ``(loss, d loss / d logits)``.

    The weights passed to ``fn`` have the case's values but depend on the logits, as advantages
    from a critic that shares the policy's network would: ``w + c(z) - sg[c(z)]`` with
    :math:`c(z) = \sum_a z_a \cos(a + 1)`. A loss that detaches its weights has the REINFORCE
    gradient; one that does not also differentiates :math:`c`. A loss with no gradient at all
    (everything detached) gets a gradient of NaN.
    """
    logits = logits.detach().clone().requires_grad_(True)
    c = (logits * torch.cos(torch.arange(1, logits.shape[-1] + 1, dtype=logits.dtype))).sum(-1)
    live = weights + c - c.detach()
    loss = fn(logits, actions, live, mask)
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return loss, torch.full_like(logits, float("nan"))
    (grad,) = torch.autograd.grad(loss, logits, allow_unused=True)
    return loss.detach(), torch.zeros_like(logits) if grad is None else grad


#: every probe by the name the stored expectations record (the function's ``__name__``)
PROBES = {fn.__name__: fn for fn in (loss_probe,)}
