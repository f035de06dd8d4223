"""Every rlkit config dataclass is frozen and validated, field by field, whichever way it is built.

For each config class, and each of its fields found with ``dataclasses.fields`` and classified by
its type annotation (not by the check the class attaches to it, so a field whose check was
forgotten or is too weak fails here):

* assigning (or deleting) the field on an instance raises ``dataclasses.FrozenInstanceError``;
* ``cfg.replace(field=bad)`` raises ValueError/TypeError whose message names ``ClassName.field``;
* ``cfg.replace(field=good)`` returns a NEW config with that field changed and every other field
  equal, and leaves ``cfg`` as it was;
* NaN, +inf and -inf in any float field are refused, naming the field, both on construction and
  through ``replace`` / ``dataclasses.replace``.

None of these float fields legitimately takes an infinite value: each "no limit" is spelled
``None`` (``grad_clip=None``, ``target_kl=None``, ``target_return=None``, ...), so inf is refused
everywhere and no float field is skipped.
"""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing

import pytest

from rlkit.algos.configs import A2CConfig, PPOConfig, ReinforceConfig, StalePPOConfig, TRPOConfig
from rlkit.llm import RLConfig
from rlkit.llm.model import GPTConfig
from rlkit.llm.pretrain import CorpusConfig, TrainConfig
from rlkit.staleness import METRICS, LagDistribution, StaleTrainingConfig, Threshold

CONFIGS = (ReinforceConfig, A2CConfig, PPOConfig, TRPOConfig, StalePPOConfig, RLConfig, StaleTrainingConfig,
           GPTConfig, CorpusConfig, TrainConfig)

_A_THRESHOLD = Threshold(sorted(METRICS)[0], max=1.0)

# Valid replacements the generic rule below would get wrong, each for a stated reason.
_GOOD = {
    (GPTConfig, "n_head"): 8,                 # n_embd = 64 must stay divisible by n_head (5 is not)
    (GPTConfig, "n_embd"): 128,               # ... and by n_head = 4 (65 is not)
    (PPOConfig, "dual_clip"): 2.0,            # the dual-clip constant must be > 1
    (StaleTrainingConfig, "lag"): 2,          # an int is a fixed lag
    (StaleTrainingConfig, "thresholds"): (_A_THRESHOLD,),
    (StaleTrainingConfig, "on_alert"): "rollback",
    (RLConfig, "checker"): "contains",        # any non-empty name
}
# Fields whose good value needs another field changed first (a rule between fields).
_BASE = {
    (StaleTrainingConfig, "behav_clip"): dict(method="decoupled"),       # behav_clip is decoupled-only
    (StaleTrainingConfig, "on_alert"): dict(thresholds=(_A_THRESHOLD,)),  # acting on alerts needs a rule
}
# Wrong values for fields whose annotation is not a plain number, bool or str.
_BAD_OTHER = {
    (StaleTrainingConfig, "lag"): (-1, "2", 1.5),
    (StaleTrainingConfig, "thresholds"): ("x", (1,), [None]),
}


def _kind(cls, name: str) -> str:
    """``"bool"``, ``"float"``, ``"int"``, ``"str"`` or ``"other"`` from the field's annotation."""
    hint = typing.get_type_hints(cls)[name]
    args = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else {hint}
    args.discard(type(None))
    for kind in (bool, float, str):
        if kind in args:
            return kind.__name__
    return "int" if args == {int} else "other"


def _fields(cls):
    return [f.name for f in dataclasses.fields(cls)]


def _float_fields(cls):
    return [n for n in _fields(cls) if _kind(cls, n) == "float"]


def _good(cls, base, name):
    """A valid value for ``name`` different from ``base``'s."""
    if (cls, name) in _GOOD:
        return _GOOD[(cls, name)]
    old, kind = getattr(base, name), _kind(cls, name)
    if kind == "bool":
        return True if old is None else not old
    if kind == "int":
        return 2 if old is None else old + 1
    if kind == "float":
        return 0.5 if old is None or old == 0 else old / 2
    if kind == "str":                        # another of the accepted options
        options = next(a for a in dataclasses.fields(cls) if a.name == name).metadata["check"][1][0]
        return next(o for o in options if o is not None and o != old)
    raise AssertionError(f"no good value known for {cls.__name__}.{name}: add it to _GOOD")


def _bad(cls, name):
    """Values of the wrong type or out of every field's range."""
    kind = _kind(cls, name)
    if kind == "float":
        return (math.nan, math.inf, -math.inf, "0.1", True)
    if kind == "int":
        return (-1, "3", 1.5, True)              # every int field of these configs is >= 0
    if kind == "bool":
        return ("yes", 1, 0.0)
    if kind == "str":
        return ("no-such-option", 3) if name != "checker" else ("", 3)
    return _BAD_OTHER[(cls, name)]


def _names(cls, name):
    return re.compile(rf"\b{cls.__name__}\.{name}\b")


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_defaults_construct_and_every_field_is_frozen(cls):
    cfg = cls()
    assert cfg == cls()
    assert _fields(cls), cls
    for name in _fields(cls):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cfg, name, getattr(cfg, name))
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(cfg, name)
    assert cfg == cls()                          # nothing changed


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_replace_with_a_bad_value_is_refused_naming_the_field(cls):
    cfg = cls()
    for name in _fields(cls):
        for bad in _bad(cls, name):
            with pytest.raises((ValueError, TypeError), match=_names(cls, name)):
                cfg.replace(**{name: bad})
    assert cfg == cls()


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_replace_with_a_good_value_changes_that_field_only(cls):
    for name in _fields(cls):
        base = cls(**_BASE.get((cls, name), {}))
        before = dataclasses.asdict(base)
        value = _good(cls, base, name)
        new = base.replace(**{name: value})
        assert type(new) is cls and new is not base
        got = getattr(new, name)
        if (cls, name) == (StaleTrainingConfig, "lag"):
            assert isinstance(got, LagDistribution) and got == LagDistribution.fixed(value)
        else:
            assert got == value and type(got) is type(value), (name, got, value)
        assert got != getattr(base, name)
        for other in _fields(cls):
            if other != name:
                assert getattr(new, other) == getattr(base, other), (name, other)
        assert dataclasses.asdict(base) == before    # the original is untouched


@pytest.mark.parametrize("cls", [c for c in CONFIGS if _float_fields(c)], ids=lambda c: c.__name__)
def test_nan_and_inf_in_every_float_field_are_refused_naming_the_field(cls):
    cfg = cls()
    for name in _float_fields(cls):
        for bad in (math.nan, math.inf, -math.inf):
            change = {name: bad}
            for build, args in ((cls, ()), (cfg.replace, ()), (dataclasses.replace, (cfg,))):
                with pytest.raises(ValueError, match=_names(cls, name)):
                    build(*args, **change)


def test_the_field_classification_sees_the_fields_it_should():
    # guards the annotation-based discovery above against silently finding nothing
    assert {"lr", "gamma", "grad_clip", "clip_eps", "clip_eps_high", "dual_clip", "kl_coef",
            "target_return"} <= set(_float_fields(PPOConfig))
    assert {"lr", "clip_eps", "clip_eps_high", "temperature", "top_p", "grad_clip"} <= set(_float_fields(RLConfig))
    assert set(_float_fields(StaleTrainingConfig)) == {"clip_eps", "eps_stale", "behav_clip", "rollback_lr_factor"}
    assert _float_fields(GPTConfig) == [] and _kind(GPTConfig, "n_layer") == "int"
    assert _kind(PPOConfig, "anneal_lr") == "bool" and _kind(PPOConfig, "mode") == "str"
    assert _kind(StaleTrainingConfig, "lag") == "other"
