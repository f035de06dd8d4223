"""Input checks shared by rlkit and rlkit.llm.

Every public function checks its arguments on entry with these helpers, so that a wrong call fails
loudly and names the argument instead of silently broadcasting into a wrong answer:

* non-tensors and non-floating tensors raise ``TypeError``;
* shape, dtype and device mismatches raise ``ValueError`` naming both arguments;
* discounts / lambdas / probabilities outside ``[0, 1]`` raise ``ValueError``.

One name per check: an int is :func:`int_in`, a real number :func:`real_in` (finite unless
``allow_inf``), a tensor's range or finiteness :func:`tensor_in`, a 0/1 mask :func:`check_mask`, a
size under a limit :func:`fits`; config fields mirror them (:func:`int_field`, :func:`number_field`).
Extend a check with an argument rather than adding a second name for it.

Range checks cost one fused reduction (``torch.aminmax``) per checked tensor.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

Tensor = torch.Tensor
FloatOrTensor = float | Tensor

__all__ = [
    "layout",
    "real_list",
    "int_in",
    "real_in",
    "instance_of",
    "nonempty_str",
    "is_callable",
    "str_list",
    "same_length",
    "index_tensor",
    "bool_tensor",
    "feature_tensor",
    "fits",
    "distinct",
    "dict_keys",
    "left_padded",
    "divisible",
    "prompt_batch",
    "float_tensor",
    "same_layout",
    "scalar_or_like",
    "check_mask",
    "choice",
    "boolean",
    "config_field",
    "number_field",
    "int_field",
    "choice_field",
    "bool_field",
    "validate_fields",
    "ValidatedConfig",
    "matching_floats",
    "finite_per_row",
    "bool_flags",
    "floating_dtype",
    "has_categories",
    "trainable_params",
    "given",
    "no_float16",
    "radius",
    "exact_shape",
    "distribution",
    "same_kind",
    "tensor_in",
    "probabilities",
    "tuple_of",
    "has_method",
    "per_batch",
    "shared_or_batched",
    "one_of",
    "unused",
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
                shape: Sequence[int] | None = None) -> Tensor:
    """Check that ``x`` has ``ref``'s shape (or ``shape``), dtype and device."""
    want = tuple(ref.shape) if shape is None else tuple(shape)
    if tuple(x.shape) != want:
        what = f"the shape of {ref_name}" if shape is None else "shape"
        raise ValueError(
            f"{name} has shape {tuple(x.shape)} but {what} {want} is required "
            f"(rlkit never broadcasts silently)"
        )
    return same_kind(x, name, ref, ref_name)


def _real_number(x, name: str) -> float:
    """``x`` (a real Python number or a one-element tensor, not a bool) as a float."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise TypeError(f"{name} must be a number, got a tensor of shape {tuple(x.shape)}")
        x = x.item()
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    x = float(x)
    return x


def _inside(mn: float, mx: float, lo: float, hi: float, lo_open: bool, hi_open: bool) -> bool:
    """Whether ``[mn, mx]`` lies in the interval (written so that NaN fails)."""
    return (mn > lo if lo_open else mn >= lo) and (mx < hi if hi_open else mx <= hi)


def _interval(lo: float, hi: float, lo_open: bool, hi_open: bool) -> str:
    """The interval as written in messages, e.g. ``(0.0, 1.0]``."""
    return f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"


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
        return tensor_in(x, name, lo, hi)
    return real_in(x, name, lo, hi)


def check_mask(mask, ref: Tensor, ref_name: str, name: str = "mask", *, as_bool: bool = False) -> Tensor | None:
    """Validate a mask of real tokens/steps: same shape and device as ``ref``, values in {0, 1}.

    Returns the mask converted to ``ref``'s dtype, or to a bool tensor with ``as_bool``
    (``None`` stays ``None``).
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
        return mask if as_bool else mask.to(ref.dtype)
    if mask.is_complex():
        raise TypeError(f"{name} must be bool or real, got {mask.dtype}")
    if mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must hold only 0 and 1 (or be a bool tensor)")
    return mask > 0 if as_bool else mask.to(ref.dtype)


def choice(x, name: str, options: Sequence[str]) -> str:
    """Check that ``x`` is one of ``options``."""
    if x not in options:
        raise ValueError(f"{name} must be one of {list(options)}, got {x!r}")
    return x


def matching_floats(*, min_dim: int = 1, **tensors: Tensor) -> Tensor:
    """Check tensors passed as ``name=tensor``: each floating with at least ``min_dim`` dims and
    with the shape, dtype and device of the first one. Returns the first tensor."""
    (ref_name, ref), *rest = tensors.items()
    float_tensor(ref, ref_name, min_dim)
    for name, x in rest:
        float_tensor(x, name, min_dim)
        same_layout(ref, ref_name, x, name)
    return ref


def finite_per_row(x, name: str, ref: Tensor, ref_name: str) -> Tensor:
    """A finite value per row of ``ref`` (shape ``ref.shape[:-1]``): a tensor of that shape, or a
    number used for every row. Returned as a tensor with ``ref``'s dtype and device."""
    rows = tuple(ref.shape[:-1])
    if isinstance(x, torch.Tensor) and x.dim() > 0:
        float_tensor(x, name, min_dim=0)
        same_layout(ref, ref_name, x, name, shape=rows)
        return tensor_in(x, name)
    return torch.full(rows, real_in(x, name), dtype=ref.dtype, device=ref.device)


def bool_flags(x, name: str) -> Tensor:
    """Episode flags as a bool tensor: a torch or numpy bool array, or 0/1 integers; >= 1 dim."""
    try:
        import numpy as np
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(x)
    except ImportError:  # pragma: no cover
        pass
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor or numpy array, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension (time), got a scalar")
    if x.dtype == torch.bool:
        return x
    if torch.is_floating_point(x) or x.is_complex():
        raise TypeError(f"{name} must be bool (or 0/1 integers), got {x.dtype}")
    if x.numel() and not bool(((x == 0) | (x == 1)).all()):
        raise ValueError(f"{name} must hold only 0/1 or True/False")
    return x.bool()


def floating_dtype(dtype, name: str) -> torch.dtype:
    """Check that ``dtype`` is a floating torch dtype."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating torch dtype (e.g. torch.float32), got {dtype}")
    return dtype


def has_categories(logits: Tensor, name: str) -> Tensor:
    """Check that a logits tensor has at least one category along its last dimension."""
    float_tensor(logits, name, min_dim=1)
    if logits.shape[-1] == 0:
        raise ValueError(f"{name} must have at least one category along its last dimension, "
                         f"got shape {tuple(logits.shape)}")
    return logits


def int_in(x, name: str, lo: int = 1, hi: float = math.inf) -> int:
    """Check that ``x`` is an integer (not a bool) with ``lo <= x <= hi``; return it as ``int``.

    The default range is the positive integers; ``int_in(n, "n", 0)`` accepts zero too.
    """
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if hi == math.inf:
        if x < lo:
            raise ValueError(f"{name} must be >= {lo}, got {x}")
    elif not lo <= x <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {x}")
    return int(x)


def real_in(x, name: str, lo: float = -math.inf, hi: float = math.inf, *,
            lo_open: bool = False, hi_open: bool = False, allow_inf: bool = False) -> float:
    """Check that ``x`` is a real number in the given interval; return it as a float.

    ``x`` must be FINITE (NaN and infinities fail) unless ``allow_inf``, which lets an infinite
    ``x`` through when the interval holds it (say ``max_kl=math.inf`` for "no limit"); NaN always fails.
    """
    x = _real_number(x, name)
    if allow_inf:
        if not _inside(x, x, lo, hi, lo_open, hi_open):
            raise ValueError(f"{name} must be a number in {_interval(lo, hi, lo_open, hi_open)}, got {x}")
    elif not (math.isfinite(x) and _inside(x, x, lo, hi, lo_open, hi_open)):
        raise ValueError(f"{name} must be a finite number in {_interval(lo, hi, lo_open, hi_open)}, got {x}")
    return x


def instance_of(x, name: str, cls, what: str | None = None):
    """Check ``isinstance(x, cls)`` (``cls`` a class or a tuple of classes); ``what`` describes it."""
    if not isinstance(x, cls):
        if what is None:
            what = " or ".join(c.__name__ for c in (cls if isinstance(cls, tuple) else (cls,)))
        raise TypeError(f"{name} must be a {what}, got {type(x).__name__}")
    return x


def nonempty_str(x, name: str) -> str:
    """Check that ``x`` is a non-empty ``str``."""
    if not isinstance(x, str) or not x:
        raise TypeError(f"{name} must be a non-empty str, got {x!r}")
    return x


def is_callable(x, name: str):
    """Check that ``x`` is callable."""
    if not callable(x):
        raise TypeError(f"{name} must be callable, got {type(x).__name__}")
    return x


def str_list(x, name: str) -> list:
    """Check that ``x`` is a list or tuple of ``str`` (a bare ``str`` is refused); return a list."""
    if isinstance(x, str) or not isinstance(x, (list, tuple)):
        raise TypeError(f"{name} must be a list of str, got {type(x).__name__}")
    for i, s in enumerate(x):
        if not isinstance(s, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(s).__name__}")
    return list(x)


def same_length(a, a_name: str, b, b_name: str) -> None:
    """Check ``len(a) == len(b)`` (two sequences that pair up one to one)."""
    if len(a) != len(b):
        raise ValueError(f"{a_name} has {len(a)} items but {b_name} has {len(b)}; they must pair up")


def index_tensor(x, name: str, dim: int | None = None, shape: Sequence[int] | None = None,
                 shape_of: str | None = None, n: int | None = None) -> Tensor:
    """An int64 tensor of indices (token ids, actions): dims, exact shape and range ``[0, n)``.

    ``shape`` is required exactly (``shape_of`` names where it comes from); with ``n`` every value
    must lie in ``[0, n)`` (one fused reduction). Empty tensors pass the range check.
    """
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int64:
        got = f"dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{name} must be a torch.Tensor of dtype int64 (torch.long), got {got}")
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimension(s), got shape {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        where = f" ({shape_of})" if shape_of else ""
        raise ValueError(f"{name} has shape {tuple(x.shape)} but shape {tuple(shape)}{where} is required "
                         f"(rlkit never broadcasts silently)")
    if n is not None and x.numel():
        mn, mx = (int(v) for v in torch.aminmax(x))
        if mn < 0 or mx >= n:
            raise ValueError(f"{name} must lie in [0, {n}), found values in [{mn}, {mx}]")
    return x


def bool_tensor(x, name: str, ref: Tensor, ref_name: str) -> Tensor:
    """A bool tensor with exactly ``ref``'s shape and device (an attention or prompt mask)."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bool:
        got = f"dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise TypeError(f"{name} must be a bool torch.Tensor, got {got}")
    where = {"shape": (tuple(x.shape), tuple(ref.shape)), "device": (x.device, ref.device)}
    for what, (got, want) in where.items():
        if got != want:
            raise ValueError(f"{name} has {what} {got} but must have the {what} of {ref_name}, {want}")
    return x


def feature_tensor(x, name: str, size: int, like: Tensor | None = None) -> Tensor:
    """A floating tensor ``[..., size]`` (any leading dims), with ``like``'s dtype and device if given.

    For inputs to a network: ``like`` is one of its parameters.
    """
    float_tensor(x, name, min_dim=0)
    if x.dim() < 1 or x.shape[-1] != size:
        raise ValueError(f"{name} must have shape [..., {size}], got {tuple(x.shape)}")
    if like is not None and x.dtype != like.dtype:
        raise ValueError(f"{name} has dtype {x.dtype} but the network's parameters are {like.dtype}; "
                         f"convert one of them (e.g. {name}.to({like.dtype}))")
    if like is not None and x.device != like.device:
        raise ValueError(f"{name} is on {x.device} but the network is on {like.device}")
    return x


def fits(x, name: str, limit, limit_name: str, strict: bool = False):
    """Check ``x <= limit`` (``x < limit`` with ``strict``): a size under a limit, or the two ends of
    a range (``fits(lo, "lo", hi, "hi")``); ``limit_name`` names the limit."""
    if strict and not x < limit:
        raise ValueError(f"{name} is {x}, not less than {limit_name} ({limit})")
    if not x <= limit:
        raise ValueError(f"{name} is {x}, more than {limit_name} ({limit})")
    return x


def boolean(x, name: str) -> bool:
    """Check that ``x`` is ``True`` or ``False`` (a 0/1 int or a string is refused)."""
    if not isinstance(x, bool):
        raise TypeError(f"{name} must be True or False, got {x!r}")
    return x


def config_field(default, check, *args, optional: bool = False, **kwargs):
    """A dataclass field whose value :func:`validate_fields` checks with ``check(value, name, *args, **kwargs)``.

    ``optional=True`` also accepts ``None`` (documented per field: "None means ...").
    """
    import dataclasses
    return dataclasses.field(default=default, metadata={"check": (check, args, kwargs, optional)})


def number_field(default, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
                 hi_open: bool = False, optional: bool = False):
    """A config field holding a FINITE real number in the interval (:func:`real_in`), stored as float."""
    return config_field(default, real_in, lo, hi, lo_open=lo_open, hi_open=hi_open, optional=optional)


def int_field(default, lo: int = 1, hi: float = math.inf, *, optional: bool = False):
    """A config field holding an int in ``[lo, hi]`` (:func:`int_in`; by default a positive int)."""
    return config_field(default, int_in, lo, hi, optional=optional)


def choice_field(default, options: Sequence, *, optional: bool = False):
    """A config field holding one of ``options`` (:func:`choice`)."""
    return config_field(default, choice, tuple(options), optional=optional)


def bool_field(default, *, optional: bool = False):
    """A config field holding ``True`` or ``False`` (:func:`boolean`)."""
    return config_field(default, boolean, optional=optional)


def validate_fields(obj) -> None:
    """Check every field of the dataclass instance ``obj`` that carries a check (:func:`config_field`).

    Errors name the field as ``ClassName.field`` (e.g. ``PPOConfig.grad_clip must be a finite
    number in (0.0, inf], got -1.0``). The checked value (an ``int`` given for a float field
    becomes a ``float``) is written back, also on frozen dataclasses.
    """
    import dataclasses
    for f in dataclasses.fields(obj):
        spec = f.metadata.get("check")
        if spec is None:
            continue
        check, args, kwargs, optional = spec
        value = getattr(obj, f.name)
        if value is None and optional:
            continue
        object.__setattr__(obj, f.name, check(value, f"{type(obj).__name__}.{f.name}", *args, **kwargs))


class ValidatedConfig:
    """Base of rlkit's frozen config dataclasses: every field is checked when the object is built.

    Subclasses are ``@dataclasses.dataclass(frozen=True)`` with fields made by :func:`number_field`,
    :func:`int_field`, :func:`choice_field`, :func:`bool_field` or :func:`config_field`; rules that
    tie several fields together go in an overriding ``__post_init__`` that calls this one first.
    Since the object is frozen, a field cannot be changed without a new check:
    ``cfg.replace(lr=1e-3)`` is a validated copy.
    """

    def __post_init__(self):
        validate_fields(self)

    def replace(self, **changes):
        """A copy with ``changes`` applied, validated again (``dataclasses.replace``)."""
        import dataclasses
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """The fields as a plain dict (for a run's record, json, a table)."""
        import dataclasses
        return dataclasses.asdict(self)


def distinct(x, name: str, reserved: Sequence = ()) -> None:
    """Check that the items of ``x`` (a str or a sequence) are distinct and none is ``reserved``."""
    seen, dup = set(), []
    for item in x:
        if item in seen and item not in dup:
            dup.append(item)
        seen.add(item)
    if dup:
        raise ValueError(f"{name} must not repeat items, repeated: {dup}")
    taken = [r for r in reserved if r in seen]
    if taken:
        raise ValueError(f"{name} must not contain the reserved items {taken}")


def no_float16(x: Tensor, name: str) -> Tensor:
    """Refuse float16: ``exp`` of a log-ratio above 11 overflows it (use bfloat16 or float32)."""
    if x.dtype == torch.float16:
        raise TypeError(f"{name} is float16, which overflows at ratios above 65504 (log-ratio > 11); "
                        f"use bfloat16 or float32")
    return x


def radius(eps, name: str, ref: Tensor, ref_name: str, hi: float = math.inf) -> FloatOrTensor:
    """A clip radius in ``(0, hi]``: a number, or a floating tensor of per-sample radii shaped like ``ref``.

    Numbers come back as floats; tensors come back detached and cast to ``ref``'s dtype.
    """
    if not isinstance(eps, torch.Tensor) or eps.dim() == 0:
        return real_in(eps, name, 0.0, hi, lo_open=True)
    if not torch.is_floating_point(eps):
        raise TypeError(f"{name} must be a number or a floating tensor, got dtype {eps.dtype}")
    if tuple(eps.shape) != tuple(ref.shape):
        raise ValueError(f"{name} has shape {tuple(eps.shape)} but per-sample radii must have the shape of "
                         f"{ref_name}, {tuple(ref.shape)} (rlkit never broadcasts silently)")
    if eps.device != ref.device:
        raise ValueError(f"{name} is on {eps.device} but {ref_name} is on {ref.device}")
    if eps.numel():
        mn, mx = (float(v) for v in torch.aminmax(eps.detach()))
        if not (mn > 0.0 and mx <= hi):          # written so that NaN fails
            raise ValueError(f"{name} must lie in (0, {hi}], found values in [{mn}, {mx}]")
    return eps.detach().to(ref.dtype)


def exact_shape(x: Tensor, name: str, shape: Sequence[int], what: str = "") -> Tensor:
    """Check that ``x`` has exactly ``shape`` (``what`` says what the dims mean, e.g. ``"[*B, S, A]"``)."""
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {what + ' = ' if what else ''}{tuple(shape)}, "
                         f"got {tuple(x.shape)}")
    return x


def distribution(x, name: str, what: str = "", shape: Sequence[int] | None = None, min_dim: int = 1,
                 atol: float = 1e-6) -> Tensor:
    """Check that ``x`` is a floating tensor (of exactly ``shape`` if given) holding probability
    distributions over its last dimension: finite, >= 0, summing to 1 (``what`` says over what)."""
    float_tensor(x, name, min_dim)
    if shape is not None:
        exact_shape(x, name, shape)
    why = f" ({what})" if what else ""
    if x.numel() == 0:
        return x
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf")
    if float(x.min()) < -atol:
        raise ValueError(f"{name} must be non-negative{why}")
    err = float((x.sum(-1) - 1).abs().max())
    if err > atol:
        raise ValueError(f"{name} must sum to 1 over its last dimension{why}; max |sum - 1| = {err:.3g}")
    return x


def dict_keys(x, name: str, required: Sequence[str], optional: Sequence[str] = ()) -> dict:
    """Check that ``x`` is a dict holding every ``required`` key and no key outside ``optional``."""
    instance_of(x, name, dict)
    missing = [k for k in required if k not in x]
    if missing:
        raise ValueError(f"{name} lacks the keys {missing}")
    unknown = sorted(str(k) for k in x if k not in required and k not in optional)
    if unknown:
        raise ValueError(f"{name} has unknown keys {unknown}; allowed: {list(required) + list(optional)}")
    return x


def left_padded(mask: Tensor, name: str) -> Tensor:
    """Check that a ``[B, T]`` bool mask is LEFT-padded: in each row, once a token is real, every
    later one is too (so the last column is all real when ``T > 0``)."""
    if mask.shape[-1] > 1 and bool((mask[..., 1:] < mask[..., :-1]).any()):
        raise ValueError(f"{name} must be LEFT-padded (padding first, then the real tokens, which "
                         f"end in the last column); use CharTokenizer.encode_batch")
    if mask.shape[-1] and not bool(mask[..., -1].all()):
        raise ValueError(f"{name} must be LEFT-padded: every row's last column must be a real token "
                         f"(a row with no real token at all is refused too); use CharTokenizer.encode_batch")
    return mask


class Sizes(dict):
    """The sizes :func:`layout` returns: a dict of dimension sizes that also remembers, in ``source``,
    which argument fixed each one, so a later call's error names both tensors."""

    def __init__(self, sizes=(), source=None):
        super().__init__(sizes)
        self.source = dict(source or {})


def layout(spec: str, sizes: dict | None = None, *, floating: bool = False, **tensors) -> Sizes:
    """Check tensors (passed as ``name=tensor``) against named dimensions; return the sizes.

    ``spec`` names the dimensions, e.g. ``"B T"`` or ``"... S A"``: a leading ``...`` stands for any
    leading (batch) dimensions, the same in every tensor. A name that repeats (``"S A S"``) or that
    ``sizes`` (returned by an earlier call) already holds must have one size throughout::

        sizes = layout("N T A", floating=True, logits=logits)
        layout("N T", sizes, actions=actions)

    A non-tensor (with ``floating``, a non-floating tensor too) raises ``TypeError``; a shape that
    does not fit raises ``ValueError`` naming the argument, its shape and the size required.
    """
    names = spec.split()
    batch = bool(names) and names[0] == "..."
    dims = names[1:] if batch else names
    known = getattr(sizes, "source", {})
    sizes = Sizes(sizes or {})
    source = {d: known.get(d, "an earlier argument") for d in sizes}
    shown = "[" + ", ".join(names) + "]"
    for name, x in tensors.items():
        if floating:
            float_tensor(x, name, min_dim=0)
        elif not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        shape = tuple(x.shape)
        if len(shape) < len(dims) or (not batch and len(shape) != len(dims)):
            least = "at least " if batch else ""
            raise ValueError(f"{name} has shape {shape} but must have {least}{len(dims)} dimension(s), {shown}")
        lead = len(shape) - len(dims)
        for d, size in ([("...", shape[:lead])] if batch else []) + list(zip(dims, shape[lead:])):
            if d not in sizes:
                sizes[d], source[d] = size, name
            elif sizes[d] != size:
                what = "the leading dimensions" if d == "..." else d
                raise ValueError(f"{name} has shape {shape}, which does not fit {shown}: {what} must be "
                                 f"{sizes[d]} (as in {source[d]}), got {size} (rlkit never broadcasts silently)")
    sizes.source = source
    return sizes


def real_list(x, name: str) -> list:
    """A list or tuple of real numbers, or a 1-D tensor, as a list of floats (NaN and inf are kept)."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 1 or x.is_complex():
            raise ValueError(f"{name} must be a 1-D real tensor (or a list of numbers), got shape "
                             f"{tuple(x.shape)} and dtype {x.dtype}")
        return [float(v) for v in x.tolist()]
    if not isinstance(x, (list, tuple)):
        raise TypeError(f"{name} must be a list of numbers (or a 1-D tensor), got {type(x).__name__}")
    for i, v in enumerate(x):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name}[{i}] must be a real number, got {type(v).__name__}")
    return [float(v) for v in x]


def trainable_params(params, name: str) -> list:
    """A non-empty iterable of tensors that all require grad, returned as a list."""
    if isinstance(params, Tensor):
        params = [params]
    else:
        try:
            params = list(params)
        except TypeError:
            raise TypeError(f"{name} must be an iterable of tensors (e.g. model.parameters()), "
                            f"got {type(params).__name__}") from None
    if not params or not all(isinstance(p, Tensor) and p.requires_grad for p in params):
        raise ValueError(f"{name} must be a non-empty list of tensors with requires_grad=True")
    return params


def given(x, name: str, why: str):
    """Check that an optional argument was passed (is not ``None``); ``why`` says what needs it."""
    if x is None:
        raise ValueError(f"{name} is required: {why}")
    return x


def divisible(x: int, name: str, by: int, by_name: str) -> int:
    """Check that the integer ``x`` is a multiple of ``by``."""
    if x % by:
        raise ValueError(f"{name} ({x}) must be divisible by {by_name} ({by})")
    return x


def prompt_batch(ids, mask, n: int | None = None, ids_name: str = "prompt_ids",
                 mask_name: str = "prompt_mask") -> tuple:
    """A batch of prompts: ``ids`` ``[B, P]`` int64 with ``P >= 1`` (values in ``[0, n)`` if ``n``
    is given) and ``mask`` None or a LEFT-padded bool ``[B, P]``. Returns ``(ids, mask)``, with an
    all-True mask for None."""
    index_tensor(ids, ids_name, dim=2, n=n)
    int_in(ids.shape[1], f"the prompt length {ids_name}.shape[1]")
    if mask is None:
        return ids, torch.ones_like(ids, dtype=torch.bool)
    bool_tensor(mask, mask_name, ids, ids_name)
    return ids, left_padded(mask, mask_name)


def same_kind(x: Tensor, name: str, ref: Tensor, ref_name: str) -> Tensor:
    """Check that the tensor ``x`` has ``ref``'s dtype and device (shapes may differ)."""
    if x.dtype != ref.dtype:
        raise ValueError(f"{name} has dtype {x.dtype} but {ref_name} has dtype {ref.dtype}; use one dtype")
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}; put them on one device")
    return x


def tensor_in(x: Tensor, name: str, lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False,
              hi_open: bool = False) -> Tensor:
    """Check that every entry of the tensor ``x`` is FINITE and in the interval (NaN and inf fail).

    ``tensor_in(x, "x")`` checks only that ``x`` is finite; ``tensor_in(p, "p", 0.0, 1.0)`` checks
    probabilities. One fused reduction (``torch.aminmax``); an empty tensor passes.
    """
    if x.numel():
        mn, mx = (float(v) for v in torch.aminmax(x.detach()))
        if not (math.isfinite(mn) and math.isfinite(mx) and _inside(mn, mx, lo, hi, lo_open, hi_open)):
            where = "" if (lo, hi) == (-math.inf, math.inf) else f" in {_interval(lo, hi, lo_open, hi_open)}"
            what = "must hold finite numbers" + where if where else "must be finite"
            raise ValueError(f"{name} {what}, found values in [{mn}, {mx}]")
    return x


def probabilities(x, name: str, atol: float = 1e-6) -> tuple:
    """A probability vector (a list, tuple or 1-D tensor): non-empty, each entry finite and ``>= 0``,
    summing to 1 within ``atol``. Returned as a tuple of floats."""
    p = real_list(x, name)
    if not p:
        raise ValueError(f"{name} must hold at least one probability")
    for i, v in enumerate(p):
        real_in(v, f"{name}[{i}]", 0.0)
    s = math.fsum(p)
    if abs(s - 1.0) > atol:
        raise ValueError(f"{name} must sum to 1, got {s:.6g}")
    return tuple(p)


def tuple_of(x, name: str, cls, what: str | None = None) -> tuple:
    """A list or tuple whose every item is an instance of ``cls``; returned as a tuple."""
    what = what or cls.__name__
    instance_of(x, name, (list, tuple), f"tuple of {what}")
    for i, item in enumerate(x):
        instance_of(item, f"{name}[{i}]", cls, what)
    return tuple(x)


def has_method(x, name: str, method: str):
    """Check that ``x`` has a callable attribute ``method`` (duck typing, e.g. ``state_dict``)."""
    if not callable(getattr(x, method, None)):
        raise TypeError(f"{name} must have a {method}() method, got a {type(x).__name__}")
    return x


def per_batch(x, name: str, shape: Sequence[int], like: Tensor, lo: float = -math.inf, hi: float = math.inf, *,
              lo_open: bool = False, hi_open: bool = False) -> Tensor:
    """A coefficient per batch element: a number (or a 0-dim tensor), used for every element, or a real
    tensor of exactly ``shape``; finite and in the interval. Returned as a tensor of ``shape`` with
    ``like``'s dtype and device."""
    if isinstance(x, torch.Tensor) and x.dim() > 0:
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"{name} must be a number or a real tensor, got dtype {x.dtype}")
        t = exact_shape(x, name, shape, "(a number, or one per batch element)")
        t = t.to(device=like.device, dtype=like.dtype, copy=True)
    else:
        t = torch.full(tuple(shape), real_in(x, name, lo, hi, lo_open=lo_open, hi_open=hi_open),
                       dtype=like.dtype, device=like.device)
    return tensor_in(t, name, lo, hi, lo_open=lo_open, hi_open=hi_open)


def shared_or_batched(x: Tensor, name: str, batch: Sequence[int], shape: Sequence[int], what: str) -> Tensor:
    """A tensor of ``shape`` shared by every batch element, or ``[*batch, *shape]`` (one per element);
    returned expanded to ``[*batch, *shape]``. ``what`` names the two forms, e.g. ``"[M] or [*B, M]"``."""
    if tuple(x.shape) == tuple(shape):
        return x.expand(*batch, *shape)
    return exact_shape(x, name, (*batch, *shape), what)


def one_of(**args) -> str:
    """Check that exactly one of the arguments (passed as ``name=value``) is not None; return its name."""
    passed = [k for k, v in args.items() if v is not None]
    if len(passed) != 1:
        raise ValueError(f"give exactly one of {', '.join(args)}; got {', '.join(passed) or 'none'}")
    return passed[0]


def unused(x, name: str, when: str) -> None:
    """Check that an optional argument that would be ignored is None; ``when`` says when it is used."""
    if x is not None:
        raise ValueError(f"{name} is only used {when}; here it would be ignored, so leave it None")


# --- end of validators: add new checks above this line ---
