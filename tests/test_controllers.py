"""Tests for rlkit.controllers: the one interface and its three rules (chapters 4 and 6).

Hand-worked factors, the bounds, input validation, and a closed-loop simulation on a plant whose
KL is quadratic in the learning rate with log-normal noise (the model the controller is built on),
all compared with numbers computed here by hand, not with the controller's own output.
"""
import math

import numpy as np
import pytest
import torch

from rlkit.controllers import AdaptiveKLController, KLController, KLLearningRateController, KLTriggeredLR


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
    assert c.n_triggered == 1
    assert c.history[0] == dict(kl=10.0, value_in=2e-4, value_out=1e-4)
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
    (dict(lr_min=1e-2, lr_max=1e-3), "lr_max"),
    (dict(lr_min=0.0), "lr_min"),
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


# ----------------------------------------------------------------------------------------------
# the one interface: new = controller(kl, value) = clip(value * factor(kl), min, max)
# ----------------------------------------------------------------------------------------------

ALL = [lambda: AdaptiveKLController(1.0, 0.01, "ppo"), lambda: AdaptiveKLController(1.0, 0.01, "proportional"),
       lambda: KLLearningRateController(), lambda: KLTriggeredLR()]


@pytest.mark.parametrize("make", ALL)
def test_every_controller_has_the_one_interface(make):
    c = make()
    assert isinstance(c, KLController)
    for kl, v in [(0.0, 1e-3), (0.004, 0.5), (0.02, 2e-2), (3.0, 1e-4)]:
        f = c.factor(kl)
        assert c(kl, v) == pytest.approx(min(max(v * f, c.value_min), c.value_max), rel=1e-15)
    assert [h["kl"] for h in c.history] == [0.0, 0.004, 0.02, 3.0]
    with pytest.raises(ValueError, match="kl"):
        c(float("inf"), 1e-3)
    with pytest.raises(ValueError, match=c.knob):
        c(0.01, -1.0)


def test_kl_learning_rate_controller_factor_by_hand():
    # (the trainer-level rule is tested in tests/test_algos.py); here the factor and the band edges
    c = KLLearningRateController(target_kl=0.02, factor=1.5, band=2.0)
    assert c.factor(0.0400001) == 1 / 1.5 and c.factor(0.04) == 1.0      # above band * target: divide
    assert c.factor(0.0099999) == 1.5 and c.factor(0.01) == 1.0          # below target / band: multiply
    assert c.lr_min == c.value_min == 1e-6 and c.lr_max == c.value_max == 0.1
    with pytest.raises(ValueError, match="factor"):
        KLLearningRateController(factor=0.5)


def test_the_ppo_trainer_call_site_works_with_every_lr_controller():
    # rlkit.algos.train_ppo does: lr = lr_controller(kl, lr)
    for c in (KLLearningRateController(), KLTriggeredLR()):
        lr = 1e-3
        for kl in (0.1, 0.0, 0.005):
            lr = float(c(kl, lr))
            assert 0 < lr < 1


# ----------------------------------------------------------------------------------------------
# the adaptive KL coefficient (chapter 4)
# ----------------------------------------------------------------------------------------------

def test_adaptive_kl_rules():
    t = 0.01
    ppo = AdaptiveKLController(1.0, t, "ppo")
    art = AdaptiveKLController(1.0, t, "article")
    assert ppo.update(0.02) == 2.0 and art.update(0.02) == 2.0          # > 1.5 target
    assert ppo.update(0.012) == 2.0 and art.update(0.012) == 2.0        # dead band
    # 0.6 * target: below target/1.5 (halve under "ppo") but above 0.5 * target ("article")
    assert ppo.update(0.006) == 1.0 and art.update(0.006) == 2.0
    assert ppo.update(0.004) == 0.5 and art.update(0.004) == 1.0
    # proportional: beta * exp(k e n / H), the error clipped at +-0.2
    prop = AdaptiveKLController(1.0, t, "proportional", k_beta=0.1, horizon=1.0)
    assert math.isclose(prop.update(10 * t), math.exp(0.1 * 0.2))
    b = prop.beta
    assert math.isclose(prop.update(1.1 * t), b * math.exp(0.1 * 0.1))
    b = prop.beta
    assert math.isclose(prop.update(0.0), b * math.exp(-0.1 * 0.2))
    trl = AdaptiveKLController(0.5, t, "proportional", k_beta=1.0, horizon=10_000)
    assert math.isclose(trl.update(2 * t, n_steps=256), 0.5 * math.exp(0.2 * 256 / 10_000))
    # for small steps it is TRL's linear 1 + x to second order
    assert abs(math.exp(0.2 * 256 / 10_000) - (1 + 0.2 * 256 / 10_000)) < 0.2 * 256 / 10_000 * 0.03
    assert math.isclose(trl.update(torch.tensor(t), n_steps=256), trl.beta)
    # the stateless form of the one interface gives the same numbers
    assert AdaptiveKLController(1.0, t, "ppo")(0.02, 3.0) == 6.0


@pytest.mark.parametrize("rule", AdaptiveKLController.RULES)
@pytest.mark.parametrize("n_steps", [1, 100, 10_000, 10 ** 9])
def test_adaptive_kl_beta_stays_positive_and_finite(rule, n_steps):
    # the old linear proportional rule reached beta = 1 - 0.1 * 0.2 * 100 - 1 = -1 at n_steps = 100
    c = AdaptiveKLController(1.0, 0.01, rule)
    for kl in [0.0] * 50 + [10.0] * 100 + [0.0] * 3000:
        beta = c.update(kl, n_steps)
        assert math.isfinite(beta) and c.value_min <= beta <= c.value_max and beta > 0


def test_adaptive_kl_validation():
    with pytest.raises(ValueError, match="rule"):
        AdaptiveKLController(1.0, 0.01, "pid")
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(1.0, 0.0)
    with pytest.raises(ValueError, match="init_beta"):
        AdaptiveKLController(0.0, 0.01)
    with pytest.raises(ValueError, match="kl"):
        AdaptiveKLController().update(float("nan"))
    with pytest.raises(ValueError, match="n_steps"):
        AdaptiveKLController().update(0.01, n_steps=0)
