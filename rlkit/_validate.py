"""Input checks shared by rlkit's math modules.

Every public function in :mod:`rlkit.returns`, :mod:`rlkit.offpolicy`, :mod:`rlkit.divergences`,
:mod:`rlkit.objectives` and :mod:`rlkit.trust_region` checks its arguments on entry with these
helpers, so that a wrong call fails loudly and names the argument instead of silently broadcasting
into a wrong answer:

* non-tensors and non-floating tensors raise ``TypeError``;
* shape, dtype and device mismatches raise ``ValueError`` naming both arguments;
* discounts / lambdas / probabilities outside ``[0, 1]`` raise ``ValueError``.

Range checks cost one fused reduction (``torch.aminmax``) per checked tensor.
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union

import torch

Tensor = torch.Tensor
FloatOrTensor = Union[float, Tensor]

__all__ = [
    "float_tensor",
    "same_layout",
    "in_unit_interval",
    "scalar_or_like",
    "check_mask",
    "positive_int",
    "finite_float",
    "choice",
]


def float_tensor(x, name: str, min_dim: int = 1) -> Tensor:
    """Return ``x`` if it is a floating-point tensor with at least ``min_dim`` dims, else raise."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of floating dtype, got {type(x).__name__}"
        )
    if not torch.is_floating_point(x):
        raise TypeError(
            f"{name} must have a floating dtype (float32/float64/...), got {x.dtype}; "
            f"convert it with {name}.float()"
        )
    if x.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dimension(s) (time is the last one), "
            f"got shape {tuple(x.shape)}"
        )
    return x


def same_layout(ref: Tensor, ref_name: str, x: Tensor, name: str,
                shape: Optional[Sequence[int]] = None) -> Tensor:
    """Check that ``x`` has ``ref``'s shape (or ``shape``), dtype and device."""
    want = tuple(ref.shape) if shape is None else tuple(shape)
    if tuple(x.shape) != want:
        what = f"the shape of {ref_name}" if shape is None else "shape"
        raise ValueError(
            f"{name} has shape {tuple(x.shape)} but {what} {want} is required "
            f"(rlkit never broadcasts silently)"
        )
    if x.dtype != ref.dtype:
        raise ValueError(
            f"{name} has dtype {x.dtype} but {ref_name} has dtype {ref.dtype}; use one dtype"
        )
    if x.device != ref.device:
        raise ValueError(
            f"{name} is on {x.device} but {ref_name} is on {ref.device}; put them on one device"
        )
    return x


def in_unit_interval(x: Tensor, name: str, lo: float = 0.0, hi: float = 1.0) -> Tensor:
    """Check ``lo <= x <= hi`` elementwise (NaN fails too). One pass over ``x``."""
    if x.numel() == 0:
        return x
    mn, mx = torch.aminmax(x.detach())
    mn, mx = float(mn), float(mx)
    if not (mn >= lo and mx <= hi):  # written so that NaN fails
        raise ValueError(
            f"{name} must lie in [{lo}, {hi}], found values in [{mn}, {mx}]"
        )
    return x


def finite_float(x, name: str, lo: float = -float("inf"), hi: float = float("inf"),
                 lo_open: bool = False) -> float:
    """Check that ``x`` is a real Python/0-dim number in the given range and return it as float."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise TypeError(f"{name} must be a number, got a tensor of shape {tuple(x.shape)}")
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    x = float(x)
    ok = (x > lo if lo_open else x >= lo) and x <= hi
    if not ok:
        left = "(" if lo_open else "["
        raise ValueError(f"{name} must lie in {left}{lo}, {hi}], got {x}")
    return x


def scalar_or_like(x, name: str, ref: Tensor, ref_name: str,
                   lo: float = 0.0, hi: float = 1.0) -> FloatOrTensor:
    """A coefficient given as a Python number or as a tensor shaped like ``ref``.

    Numbers (and 0-dim tensors) are returned as Python floats after a range check; tensors must
    match ``ref`` in shape, dtype and device and lie in ``[lo, hi]``.
    """
    if isinstance(x, torch.Tensor) and x.dim() > 0:
        if not torch.is_floating_point(x):
            raise TypeError(
                f"{name} must be a float or a floating tensor shaped like {ref_name}, "
                f"got dtype {x.dtype}"
            )
        same_layout(ref, ref_name, x, name)
        return in_unit_interval(x, name, lo, hi)
    return finite_float(x, name, lo, hi)


def check_mask(mask, ref: Tensor, ref_name: str, name: str = "mask") -> Optional[Tensor]:
    """Validate a mask of real tokens/steps: same shape and device as ``ref``, values in {0, 1}.

    Returns the mask converted to ``ref``'s dtype (``None`` stays ``None``).
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (bool or 0/1 float) or None, "
                        f"got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(ref.shape):
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)} but must have the shape of {ref_name}, "
            f"{tuple(ref.shape)}"
        )
    if mask.device != ref.device:
        raise ValueError(f"{name} is on {mask.device} but {ref_name} is on {ref.device}")
    if mask.dtype == torch.bool:
        return mask.to(ref.dtype)
    if mask.is_complex():
        raise TypeError(f"{name} must be bool or real, got {mask.dtype}")
    if mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must hold only 0 and 1 (or be a bool tensor)")
    return mask.to(ref.dtype)


def positive_int(x, name: str, minimum: int = 1) -> int:
    """Check that ``x`` is an integer >= ``minimum``."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return int(x)


def choice(x, name: str, options: Sequence[str]) -> str:
    """Check that ``x`` is one of ``options``."""
    if x not in options:
        raise ValueError(f"{name} must be one of {list(options)}, got {x!r}")
    return x
