"""rlkit._validate: one name per check, and the messages that name the argument and what was expected."""
import math

import pytest
import torch

from rlkit import _validate as V
from rlkit.objectives import normalize_advantages
from rlkit.reward_models import kl_regularised_optimum
from rlkit.risk import downweighted_advantages
from rlkit.staleness import Threshold, geppo_clip_radius


def test_every_exported_name_exists_and_the_synonyms_are_gone():
    assert all(hasattr(V, n) for n in V.__all__)
    for old in ("finite_float", "in_unit_interval", "bool_mask", "ordered", "int_range_field"):
        assert not hasattr(V, old) and old not in V.__all__
    for deprecated in ("positive_int", "int_in_range", "all_finite"):  # TODO(0.3): kept for rl.py, hf.py, tabular.py
        assert deprecated not in V.__all__


def test_int_in():
    assert V.int_in(3, "n") == 3 and V.int_in(0, "n", 0) == 0 and V.int_in(5, "n", 1, 5) == 5
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        V.int_in(0, "n")
    with pytest.raises(ValueError, match=r"k must be an int in \[1, 4\], got 5"):
        V.int_in(5, "k", 1, 4)
    for bad in (True, 1.0, "1"):
        with pytest.raises(TypeError, match="n must be an int"):
            V.int_in(bad, "n")


def test_real_in_rejects_inf_unless_allowed():
    assert V.real_in(2, "x", 0.0) == 2.0
    with pytest.raises(ValueError, match=r"x must be a finite number in \[0.0, inf\], got inf"):
        V.real_in(math.inf, "x", 0.0)
    assert V.real_in(math.inf, "beta", 0.0, lo_open=True, allow_inf=True) == math.inf
    with pytest.raises(ValueError, match=r"beta must be a number in \(0.0, inf\], got nan"):
        V.real_in(math.nan, "beta", 0.0, lo_open=True, allow_inf=True)
    with pytest.raises(ValueError, match=r"beta must be a number in \(0.0, 1.0\], got inf"):
        V.real_in(math.inf, "beta", 0.0, 1.0, lo_open=True, allow_inf=True)


def test_tensor_in_covers_the_unit_interval_and_plain_finiteness():
    p = torch.tensor([0.0, 0.5, 1.0])
    assert V.tensor_in(p, "p", 0.0, 1.0) is p
    with pytest.raises(ValueError, match=r"p must hold finite numbers in \[0.0, 1.0\], found values in \[0.0, 1.5\]"):
        V.tensor_in(torch.tensor([0.0, 1.5]), "p", 0.0, 1.0)
    with pytest.raises(ValueError, match=r"x must be finite, found values in \[0.0, inf\]"):
        V.tensor_in(torch.tensor([0.0, math.inf]), "x")
    with pytest.raises(ValueError, match="x must be finite"):
        V.tensor_in(torch.tensor([0.0, math.nan]), "x")
    V.tensor_in(torch.empty(0), "x", 0.0, 1.0)


def test_check_mask_as_float_or_bool():
    ref = torch.zeros(2, 3)
    m = torch.tensor([[1, 0, 1], [0, 0, 1]])
    assert V.check_mask(m, ref, "ref").dtype == torch.float32
    b = V.check_mask(m, ref, "ref", as_bool=True)
    assert b.dtype == torch.bool and b.tolist() == [[True, False, True], [False, False, True]]
    assert V.check_mask(b, ref, "ref", as_bool=True) is b
    assert V.check_mask(None, ref, "ref", as_bool=True) is None
    with pytest.raises(ValueError, match="mask must hold only 0 and 1"):
        V.check_mask(2 * m, ref, "ref", as_bool=True)


def test_fits_and_its_strict_form():
    assert V.fits(3, "len", 3, "the limit") == 3
    with pytest.raises(ValueError, match=r"len is 4, more than the limit \(3\)"):
        V.fits(4, "len", 3, "the limit")
    with pytest.raises(ValueError, match=r"Threshold.min is 3, not less than Threshold.max \(3\)"):
        V.fits(3, "Threshold.min", 3, "Threshold.max", strict=True)


def test_int_field_bounds():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class C(V.ValidatedConfig):
        n: int = V.int_field(2)
        seed: int = V.int_field(0, 0)
        width: int = V.int_field(4, 1, 8)

    C()
    with pytest.raises(ValueError, match="C.n must be >= 1, got 0"):
        C(n=0)
    with pytest.raises(ValueError, match=r"C.width must be an int in \[1, 8\], got 9"):
        C(width=9)


# Regression: these checks were finite_float, which let inf through although their docstrings
# promise a finite number (or the value is meaningless at inf). They now refuse it.

def test_downweighted_advantages_refuses_an_infinite_alpha():
    a, s = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 1.0])
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        downweighted_advantages(a, s, math.inf)


def test_clip_radius_threshold_and_whitening_refuse_inf():
    with pytest.raises(ValueError, match="eps must be a finite number"):
        geppo_clip_radius(math.inf, [1.0])
    with pytest.raises(ValueError, match="Threshold.max must be a finite number"):
        Threshold("kl", max=math.inf)
    with pytest.raises(ValueError, match="eps must be a finite number"):
        normalize_advantages(torch.randn(4), eps=math.inf)


def test_kl_regularised_optimum_still_takes_beta_inf_as_documented():
    ref = torch.log_softmax(torch.tensor([0.0, 1.0, 2.0]), -1)
    out = kl_regularised_optimum(ref, torch.tensor([3.0, 0.0, -1.0]), math.inf)
    torch.testing.assert_close(out, ref)
    with pytest.raises(ValueError, match="beta must be a number in"):
        kl_regularised_optimum(ref, torch.zeros(3), 0.0)
