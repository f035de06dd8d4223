"""The trainer configs (rlkit.algos.configs, rlkit.llm.RLConfig): checked on construction, frozen,
one-line overrides that are checked again, and what a run records."""
import dataclasses
import math

import gymnasium as gym
import numpy as np
import pytest

from rlkit import _validate as V
from rlkit.algos import (
    A2CConfig,
    PPOConfig,
    ReinforceConfig,
    StalePPOConfig,
    TrainerConfig,
    TRPOConfig,
    train_a2c,
    train_ppo,
    train_reinforce,
    train_trpo,
)
from rlkit.llm import ADDITION, RLConfig, load_pretrained
from rlkit.llm.trainer import assemble

ALGO_CONFIGS = (ReinforceConfig, A2CConfig, PPOConfig, StalePPOConfig, TRPOConfig)
ALL_CONFIGS = ALGO_CONFIGS + (RLConfig,)


class Bandit(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([1.0, 0.0], dtype=np.float32), {}

    def step(self, action):
        return np.array([1.0, 0.0], dtype=np.float32), float(action == 1), True, False, {}


def _float_fields(cls):
    """Fields whose check is the finite-number check, with their (lo, hi, lo_open, hi_open)."""
    out = {}
    for f in dataclasses.fields(cls):
        check, args, kwargs, optional = f.metadata["check"]
        if check is V.real_in:
            lo, hi = args
            out[f.name] = (lo, hi, kwargs["lo_open"], kwargs["hi_open"])
    return out


@pytest.mark.parametrize("cls", ALL_CONFIGS)
def test_every_field_is_checked_and_defaults_are_valid(cls):
    cfg = cls()                                              # the defaults pass their own checks
    assert all("check" in f.metadata for f in dataclasses.fields(cls)), cls
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3                                         # frozen: no unchecked change


@pytest.mark.parametrize("cls", ALL_CONFIGS)
def test_nan_inf_and_out_of_range_numbers_are_refused_naming_the_field(cls):
    floats = _float_fields(cls)
    assert floats, cls
    for name, (lo, hi, lo_open, hi_open) in floats.items():
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name} must be a finite number"):
                cls(**{name: bad})
        if math.isfinite(lo):                               # just below the range (or at an open end)
            with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name}"):
                cls(**{name: lo if lo_open else lo - 1e-3})
        if math.isfinite(hi):
            with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name}"):
                cls(**{name: hi if hi_open else hi + 1e-3})
        with pytest.raises(TypeError, match=rf"{cls.__name__}\.{name}"):
            cls(**{name: "0.1"})
        with pytest.raises(TypeError, match=rf"{cls.__name__}\.{name}"):
            cls(**{name: True})


def _has(cls, name):
    return name in {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("cls", [c for c in ALL_CONFIGS if _has(c, "grad_clip")])
def test_the_issue_examples(cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.grad_clip .*got -1"):
        cls(grad_clip=-1)
    if _has(cls, "clip_eps_high"):
        with pytest.raises(ValueError, match=rf"{cls.__name__}\.clip_eps_high .*got -0.1"):
            cls(clip_eps_high=-0.1)


def test_int_bool_and_choice_fields():
    with pytest.raises(ValueError, match=r"PPOConfig\.epochs must be >= 1, got 0"):
        PPOConfig(epochs=0)
    with pytest.raises(TypeError, match=r"PPOConfig\.epochs must be an int"):
        PPOConfig(epochs=2.0)
    with pytest.raises(TypeError, match=r"A2CConfig\.normalize_advantages must be True or False"):
        A2CConfig(normalize_advantages=1)
    with pytest.raises(ValueError, match=r"PPOConfig\.kl_rule must be one of"):
        PPOConfig(kl_rule="pid")
    with pytest.raises(ValueError, match=r"TrainerConfig\.seed must be >= 0"):
        TrainerConfig(seed=-1)
    with pytest.raises(TypeError, match="max_grad_norm"):               # renamed: grad_clip
        PPOConfig(max_grad_norm=0.5)
    assert ReinforceConfig(grad_clip=None).grad_clip is None           # None: no clipping
    assert PPOConfig(lr=1).lr == 1.0 and isinstance(PPOConfig(lr=1).lr, float)


def test_cross_field_rules():
    with pytest.raises(ValueError, match=r"PPOConfig\.num_minibatches = 257 exceeds the batch size .* 256"):
        PPOConfig(num_minibatches=257)
    assert PPOConfig(num_minibatches=256).num_minibatches == 256
    with pytest.raises(ValueError, match=r"StalePPOConfig\.num_minibatches"):
        StalePPOConfig(num_envs=2, num_steps=4, num_minibatches=9)
    with pytest.raises(ValueError, match=r"TRPOConfig\.value_minibatches"):
        TRPOConfig(num_envs=1, num_steps=2, value_minibatches=3)
    with pytest.raises(ValueError, match=r"PPOConfig\.dual_clip .*mode='penalty'"):
        PPOConfig(mode="penalty", dual_clip=3.0)
    with pytest.raises(ValueError, match=r"RLConfig\.group_size must be >= 2"):
        RLConfig(algo="grpo", group_size=1)
    assert RLConfig(algo="reinforce", group_size=1).group_size == 1
    with pytest.raises(ValueError, match=r"RLConfig\.minibatches \(2 by default\)"):
        RLConfig(prompts_per_step=1)


def test_replace_is_a_checked_one_liner():
    cfg = PPOConfig(lr=1e-3)
    new = cfg.replace(epochs=4)
    assert (new.lr, new.epochs, cfg.epochs) == (1e-3, 4, 20)
    assert dataclasses.replace(cfg, epochs=4) == new
    with pytest.raises(ValueError, match=r"PPOConfig\.grad_clip"):
        cfg.replace(grad_clip=-1.0)
    with pytest.raises(ValueError, match=r"PPOConfig\.num_minibatches"):
        cfg.replace(num_envs=1, num_steps=1, num_minibatches=2)
    r = RLConfig(algo="dapo").resolved()
    assert (r.clip_eps, r.clip_eps_high, r.aggregation, r.dynamic_sampling, r.minibatches) == \
        (0.2, 0.28, "token-mean", True, 2)
    assert RLConfig(algo="grpo", clip_eps=0.3).resolved().clip_eps_high == 0.3       # symmetric when given
    assert RLConfig(algo="gspo").resolved().clip_eps_high == 4e-4
    model, tok = load_pretrained()                    # an estimator's critic learns at RLConfig.lr unless given lr
    critic_lr = assemble(model, tok, ADDITION, RLConfig(algo="ppo", lr=3e-4))[2].opt.param_groups[0]["lr"]
    assert critic_lr == 3e-4


def test_subclass_defaults_are_the_trainers_tuned_settings():
    assert (PPOConfig().num_steps, PPOConfig().gamma, PPOConfig().epochs, PPOConfig().lr) == (32, 0.98, 20, 2e-3)
    assert (StalePPOConfig().total_steps, StalePPOConfig().epochs, StalePPOConfig().lr) == (25_000, 10, 2.5e-3)
    assert (A2CConfig().num_steps, A2CConfig().gamma, A2CConfig().normalize_advantages) == (5, 0.99, False)
    assert TRPOConfig().num_steps == 128 and ReinforceConfig().grad_clip is None


@pytest.mark.parametrize("train,cls", [(train_reinforce, ReinforceConfig), (train_a2c, A2CConfig),
                                       (train_ppo, PPOConfig), (train_trpo, TRPOConfig)])
def test_trainers_take_a_config_record_it_and_refuse_others(train, cls):
    cfg = cls(total_steps=64, num_envs=2, seed=1)
    if cls in (A2CConfig, PPOConfig, TRPOConfig):
        cfg = cfg.replace(num_steps=8)
        if cls is TRPOConfig:
            cfg = cfg.replace(value_minibatches=2)
    _, h = train(Bandit, cfg, progress=False)
    assert {k: v for k, v in h.config.items() if k not in ("env_id", "anneal_lr", "anneal_clip")} == \
        {k: v for k, v in cfg.to_dict().items() if k not in ("anneal_lr", "anneal_clip")}
    assert h.config["env_id"] == str(Bandit)
    _, h2 = train(Bandit, cfg, progress=False)
    assert h.stats["loss"] == h2.stats["loss"]                         # same config, same numbers
    other = A2CConfig() if cls is not A2CConfig else PPOConfig()
    with pytest.raises(TypeError, match=f"cfg must be a {cls.__name__}"):
        train(Bandit, other, progress=False)
    with pytest.raises(TypeError):
        train(Bandit, total_steps=64, progress=False)                   # keyword settings are gone


def test_stale_ppo_takes_two_configs():
    from rlkit.algos.stale_ppo import train_stale_ppo
    from rlkit.staleness import StaleTrainingConfig
    _, h = train_stale_ppo(Bandit, StalePPOConfig(total_steps=32, num_envs=2, num_steps=8, epochs=1),
                           StaleTrainingConfig(lag=1), progress=False)
    assert h.config["epochs"] == 1 and h.config["staleness"]["lag"].startswith("LagDistribution")
    with pytest.raises(TypeError, match="stale must be"):
        train_stale_ppo(Bandit, StalePPOConfig(total_steps=32), PPOConfig(), progress=False)
    with pytest.raises(TypeError, match="cfg must be a StalePPOConfig"):
        train_stale_ppo(Bandit, PPOConfig(), progress=False)


def test_edge_sizes_run_without_torch_errors():
    """One env, one step per rollout: every trainer runs, its losses stay finite."""
    import warnings

    from rlkit.algos.stale_ppo import train_stale_ppo
    cases = ((train_reinforce, ReinforceConfig(total_steps=2, num_envs=1, baseline="value")),
             (train_a2c, A2CConfig(total_steps=2, num_envs=1, num_steps=1, normalize_advantages=True)),
             (train_ppo, PPOConfig(total_steps=2, num_envs=1, num_steps=1, mode="penalty")),
             (train_ppo, PPOConfig(total_steps=2, num_envs=1, num_steps=1, clip_value=0.1, target_kl=0.01)),
             (train_trpo, TRPOConfig(total_steps=2, num_envs=1, num_steps=1, value_minibatches=1)),
             (train_stale_ppo, StalePPOConfig(total_steps=2, num_envs=1, num_steps=1)))
    for train, cfg in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")                    # var() of one sample: explained variance NaN
            _, h = train(Bandit, cfg, progress=False)
        assert len(h.steps) == 2, train
        assert all(math.isfinite(x) for x in h.stats.get("loss", [0.0])), (train, h.stats.get("loss"))
    with pytest.raises(TypeError, match="env"):
        train_ppo(3, PPOConfig(total_steps=2), progress=False)
