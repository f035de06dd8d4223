"""Frozen-argument mutants: every argument of every book exercise matters to its checker.

A mutant is an exercise's reference solution with one argument frozen to its value in the exercise's
first case (the answer a student gets by hard-coding, say, ``target=0.01``). ``check`` must fail
every mutant, for every argument of every exercise, tensors included: 270 mutants over 87
exercises when the reliability review ran the probe, of which 10 passed (S9: ``adaptive_kl_beta``'s
``target``, ``kl_lr_update``'s ``threshold``, ``adaptive_centre_loss``'s ``eps`` (now ``adaptive_dual_clip_loss``),
``first_alert_step``'s ``max_value``, ``model_token_mask``'s ``prompt_len`` and ``eos_id``,
``pid_lambdas``'s ``budget``, and ``trl_aggregate``'s ``max_len``, ``per_token_loss`` and ``mask``).

For an argument that is not a tensor (a hyperparameter), failing the check is not enough: some case
must give a different answer, computed here without the checker (the mutant's outputs against the
reference's, to the exercise's tolerance), not merely an exception. The one exception is listed in
``RAISE_ONLY`` with its reason.
"""
from __future__ import annotations

import copy
import inspect

import pytest
import torch

from rlkit.exercises import check, exercises, get

BOOK = [ex.name for ex in exercises() if ex.chapter > 0]

#: (exercise, argument) -> reason, for a non-tensor argument whose frozen value makes every case it
#: changes raise instead of answering differently (such a mutant still fails check()). None now:
#: diversity_bonus's responses was one (the first case's 4 strings fit no other case) until a second
#: case of 4 responses was added.
RAISE_ONLY: dict[tuple[str, str], str] = {}


def _frozen(ex, arg: str):
    """The reference with ``arg`` frozen to its value in the exercise's first case (defaults applied)."""
    sig = inspect.signature(ex.reference)
    first = ex.get_cases()[0]
    bound = sig.bind(*first.args, **first.kwargs)
    bound.apply_defaults()
    value = bound.arguments[arg]

    def mutant(*args, **kwargs):
        b = sig.bind(*args, **kwargs)
        b.arguments[arg] = copy.deepcopy(value)
        return ex.reference(*b.args, **b.kwargs)

    mutant.__signature__ = sig
    mutant.__name__ = ex.name
    return mutant, value


def _leaves(out) -> list:
    if isinstance(out, (tuple, list)):
        return [leaf for o in out for leaf in _leaves(o)]
    return [out]


def _same(a, b, atol: float, rtol: float) -> bool:
    """Do two outputs agree (a float64 comparison to the exercise's tolerance, NaN equal to NaN)?"""
    la, lb = _leaves(a), _leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb):
        if isinstance(x, (torch.Tensor, int, float)) and isinstance(y, (torch.Tensor, int, float)):
            tx = torch.as_tensor(x).detach().to(torch.float64)
            ty = torch.as_tensor(y).detach().to(torch.float64)
            if tx.shape != ty.shape or not torch.allclose(tx, ty, atol=atol, rtol=rtol, equal_nan=True):
                return False
        elif x != y:
            return False
    return True


def _run(ex, fn, case):
    args, kwargs = copy.deepcopy(case.args), copy.deepcopy(case.kwargs)
    return ex.probe(fn, *args, **kwargs) if ex.probe is not None else fn(*args, **kwargs)


def _answers_differently(ex, mutant) -> bool:
    """Is there a case on which the mutant returns (without raising) another answer than the reference?"""
    for case in ex.get_cases():
        expected = _run(ex, ex.reference, case)
        try:
            got = _run(ex, mutant, case)
        except Exception:
            continue
        if not _same(got, expected, ex.atol, ex.rtol):
            return True
    return False


def test_the_probe_covers_every_argument_of_every_book_exercise():
    n = sum(len(inspect.signature(get(name).reference).parameters) for name in BOOK)
    assert len(BOOK) >= 87 and n >= 270, (len(BOOK), n)


@pytest.mark.parametrize("name", BOOK)
def test_every_frozen_argument_fails_the_check(name):
    ex = get(name)
    passed, raise_only = [], []
    for arg in inspect.signature(ex.reference).parameters:
        mutant, value = _frozen(ex, arg)
        if check(mutant, name=name, verbose=False):
            passed.append(arg)
        elif not isinstance(value, torch.Tensor) and not _answers_differently(ex, mutant):
            raise_only.append(arg)
    assert not passed, f"{name}: a reference with {passed} frozen to the first case's value passes the check"
    assert [a for a in raise_only if (name, a) not in RAISE_ONLY] == [], (
        f"{name}: with {raise_only} frozen, no case answers differently (they only raise): add a case "
        "where another value of it changes the answer")


def test_the_raise_only_exceptions_are_still_needed():
    for name, arg in RAISE_ONLY:
        ex = get(name)
        mutant, _ = _frozen(ex, arg)
        assert not check(mutant, name=name, verbose=False)
        assert not _answers_differently(ex, mutant), f"{name}.{arg} now answers differently: drop it from RAISE_ONLY"


# The reviewer's reproducers (S9), each a hard-coded hyperparameter that the checker used to accept.
S9 = [
    ("penalty_beta_trajectory", "target"),
    ("kl_lr_trajectory", "threshold"),
    ("adaptive_dual_clip_loss", "eps"),
    ("first_alert_step", "max_value"),
    ("model_token_mask", "prompt_len"),
    ("model_token_mask", "eos_id"),
    ("pid_lambdas", "budget"),
    ("trl_aggregate", "max_len"),
    ("trl_aggregate", "per_token_loss"),
    ("trl_aggregate", "mask"),
]


@pytest.mark.parametrize("name, arg", S9)
def test_a_hard_coded_hyperparameter_fails(name, arg):
    ex = get(name)
    mutant, _ = _frozen(ex, arg)
    result = check(mutant, name=name, verbose=False)
    assert not result, f"{name} with {arg} hard-coded passed: {result}"
    assert _answers_differently(ex, mutant)


def test_penalty_beta_trajectory_ignoring_target_fails():
    """The review's reproducer (a hard-coded target), written for the exercise that replaced adaptive_kl_beta."""
    ref = get("penalty_beta_trajectory").reference

    def penalty_beta_trajectory(beta0, c, target, steps, power=2.0):
        return ref(beta0, c, 0.01, steps, power)

    assert not check(penalty_beta_trajectory, verbose=False)
