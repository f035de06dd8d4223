"""Tests for rlkit.controllers.KLTriggeredLR (chapter 6).

Hand-worked factors, the bounds, input validation, and a closed-loop simulation on a plant whose
KL is quadratic in the learning rate with log-normal noise (the model the controller is built on),
all compared with numbers computed here by hand, not with the controller's own output.
"""
import math

import numpy as np
import pytest
import torch

from rlkit.controllers import KLTriggeredLR


def test_defaults():
    c = KLTriggeredLR()
    assert c.threshold == 0.02 and c.aim == 0.005 and c.gain == 0.5


def test_trigger_cuts_by_square_root_of_overshoot():
    c = KLTriggeredLR(threshold=0.02, aim=0.005)
    # KL = 0.08 = 16 x aim -> cut by sqrt(16) = 4
    assert c(0.08, 0.01) == pytest.approx(0.0025, rel=1e-12)
    # KL = 2.0 = 400 x aim -> sqrt says /20 but a single cut is at most /10
    assert c(2.0, 0.01) == pytest.approx(0.001, rel=1e-12)
    assert c.n_triggered == 2


def test_tracking_below_threshold():
    c = KLTriggeredLR(threshold=0.02, aim=0.005, gain=0.5, max_step=1.25)
    # KL = aim: hold
    assert c(0.005, 0.01) == pytest.approx(0.01, rel=1e-12)
    # KL = 4 x aim (still <= threshold): (1/4)^(1/4) = 0.7071 -> limited to 1/1.25 = 0.8
    assert c(0.02, 0.01) == pytest.approx(0.008, rel=1e-12)
    # KL = 1.6 x aim: (1/1.6)^(1/4) = 0.88914
    assert c(0.008, 0.01) == pytest.approx(0.01 * 1.6 ** -0.25, rel=1e-12)
    # KL = aim / 4: 4^(1/4) = 1.414 -> limited to 1.25
    assert c(0.00125, 0.01) == pytest.approx(0.0125, rel=1e-12)
    # KL = 0: the policy did not move, step up by max_step
    assert c(0.0, 0.01) == pytest.approx(0.0125, rel=1e-12)
    assert c.n_triggered == 0 and c.fraction_within() == 1.0


def test_gain_zero_holds_between_triggers():
    c = KLTriggeredLR(threshold=0.02, gain=0.0)
    for kl in (0.0001, 0.004, 0.019, 0.02):
        assert c(kl, 0.003) == 0.003
    assert c(0.03, 0.003) < 0.003


def test_bounds_and_history():
    c = KLTriggeredLR(threshold=0.02, lr_min=1e-4, lr_max=1e-2)
    assert c(10.0, 2e-4) == 1e-4          # cut below lr_min -> lr_min
    assert c(1e-6, 9.9e-3) == 1e-2        # step above lr_max -> lr_max
    assert [h["triggered"] for h in c.history] == [True, False]
    assert c.history[0]["lr_in"] == 2e-4 and c.history[0]["kl"] == 10.0
    assert c.fraction_within() == 0.5
    assert math.isnan(KLTriggeredLR().fraction_within())


def test_accepts_zero_dim_tensors():
    c = KLTriggeredLR(threshold=0.02, aim=0.005)
    assert c(torch.tensor(0.08), torch.tensor(0.01)) == pytest.approx(0.0025)


@pytest.mark.parametrize("kwargs,match", [
    (dict(threshold=0.0), "threshold"),
    (dict(threshold=0.01, aim=0.02), "aim"),
    (dict(aim=0.0), "aim"),
    (dict(gain=-0.1), "gain"),
    (dict(gain=3.0), "gain"),
    (dict(max_step=0.5), "max_step"),
    (dict(max_cut=0.9), "max_cut"),
    (dict(lr_min=1e-2, lr_max=1e-3), "lr_min"),
    (dict(threshold=float("nan")), "threshold"),
])
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KLTriggeredLR(**kwargs)


def test_call_validation():
    c = KLTriggeredLR()
    with pytest.raises(ValueError, match="kl"):
        c(float("nan"), 1e-3)
    with pytest.raises(ValueError, match="kl"):
        c(-0.01, 1e-3)
    with pytest.raises(ValueError, match="lr"):
        c(0.01, 0.0)
    with pytest.raises(TypeError, match="kl"):
        c("0.01", 1e-3)
    with pytest.raises(TypeError, match="kl"):
        c(torch.tensor([0.01, 0.02]), 1e-3)
    with pytest.raises(TypeError, match="threshold"):
        KLTriggeredLR(threshold=True)


def test_one_trigger_lands_on_the_set_point_of_a_quadratic_plant():
    # plant: KL = c * lr^2 (no noise). A trigger at lr0 puts the next KL exactly on the aim.
    cst, lr0 = 50.0, 0.05                      # KL(lr0) = 0.125 > threshold
    ctl = KLTriggeredLR(threshold=0.02, aim=0.005, max_cut=100.0)
    lr1 = ctl(cst * lr0 ** 2, lr0)
    assert cst * lr1 ** 2 == pytest.approx(0.005, rel=1e-12)
    assert lr1 == pytest.approx(math.sqrt(0.005 / cst), rel=1e-12)


def test_closed_loop_on_noisy_quadratic_plant_keeps_kl_under_threshold():
    # KL_k = c * lr_k^2 * exp(sigma z_k): with sigma = 1 the 90th percentile is e^1.28 = 3.6 x the
    # median, like PPO's per-update KL. Started 20x too high, the controller keeps >= 90% of
    # updates under the threshold and settles near the learning rate that puts the median on aim.
    rng = np.random.default_rng(0)
    cst, sigma = 50.0, 1.0
    lr_star = math.sqrt(0.005 / cst)
    ctl = KLTriggeredLR(threshold=0.02)
    lr, kls, lrs = 20 * lr_star, [], []
    for _ in range(2000):
        kl = cst * lr ** 2 * math.exp(sigma * rng.standard_normal())
        kls.append(kl)
        lrs.append(lr)
        lr = ctl(kl, lr)
    kls = np.array(kls)
    assert np.mean(kls <= 0.02) >= 0.90
    assert ctl.fraction_within() == pytest.approx(np.mean(kls <= 0.02))
    med_lr = np.median(lrs[100:])
    assert 0.5 < med_lr / lr_star < 2.0
    # the same plant without control violates the threshold almost always
    assert np.mean(cst * (20 * lr_star) ** 2 * np.exp(sigma * rng.standard_normal(2000)) <= 0.02) < 0.05
