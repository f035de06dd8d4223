"""Properties every configuration of the one LLM training loop must have, one test per property.

Each chapter that trains the tiny LLM contributes its parts to ``CONFIGS``: a sampler, an advantage
estimator, a policy loss and a list of hooks for :func:`rlkit.llm.train`. A property is then one test
over all of them, not one test per trainer:

* it runs on a Hugging Face model (rlkit.llm.hf), and the policy's weights move (this replaces one
  Hugging Face test per trainer);
* the reference model runs only where a ``KLPenalty`` is in the hooks (and ``kl`` is logged only there);
* a step in which no token trains leaves the weights alone and logs no NaN where it measured something;
* the same seed gives the same run.

And the loop's configuration itself: RLConfig refuses each rlkit 0.2 field that moved to a component,
naming where it went, and ``train`` takes no ``ref_model=`` or ``critic=`` (they are the components').
"""
from __future__ import annotations

import copy
import dataclasses
import math
import os
import re

import pytest
import torch

from rlkit.llm import ADDITION, RLConfig, load_pretrained, train
from rlkit.llm.rl import MOVED_FIELDS
from rlkit.llm.trainer import Hook, KLPenalty

torch.set_num_threads(1)
SMALL = dict(steps=2, prompts_per_step=4, group_size=4, eval_every=2, eval_problems=8, seed=0)


def ch07_grpo(tok):
    return ADDITION, RLConfig(algo="grpo", **SMALL), {}


def ch07_ppo_kl(tok):
    from rlkit.llm.advantages import TokenGAE
    return ADDITION, RLConfig(algo="ppo", **SMALL), dict(advantages=TokenGAE(lam=0.9),
                                                         hooks=[KLPenalty(0.05, "k1", where="reward")])


def ch07_grpo_kl_loss(tok):
    return ADDITION, RLConfig(algo="grpo", **SMALL), dict(hooks=[KLPenalty(0.05)])


def ch14_dense(tok):
    from rlkit.llm.trainer import DenseRewards
    return ADDITION, RLConfig(algo="ppo", **SMALL), dict(hooks=[DenseRewards("exact")])


def ch16_lagged_vtrace(tok):
    from rlkit.llm.advantages import OffPolicy
    from rlkit.llm.lagged import ClippedLoss
    from rlkit.llm.samplers import Lagged
    from rlkit.llm.trainer import HeldOut
    return ADDITION, RLConfig(algo="ppo", **SMALL), dict(sampler=Lagged(1), advantages=OffPolicy("vtrace", lam=1.0),
                                                         loss=ClippedLoss(), evaluation=HeldOut(sampled=False))


def ch18_cost(tok):
    from rlkit.llm.safety import FORBIDDEN_ADDITION, CostConstraint
    from rlkit.safety import LagrangeMultiplier
    return FORBIDDEN_ADDITION, RLConfig(algo="ppo", **SMALL), dict(
        hooks=[CostConstraint("cost", LagrangeMultiplier(budget=0.0, lr=1.0))], evaluation=False)


def ch18_cost_shielded(tok):
    from rlkit.llm.safety import FORBIDDEN_ADDITION, CostConstraint, ShieldRate, substring_shield
    from rlkit.llm.samplers import Fresh
    from rlkit.safety import PIDLagrangian
    return FORBIDDEN_ADDITION, RLConfig(algo="ppo", **SMALL), dict(
        sampler=Fresh(recompute=True),
        hooks=[CostConstraint("cost", PIDLagrangian(0.05, kp=1.0, ki=0.5)), ShieldRate()],
        logits_processor=substring_shield(tok, ["13"]), evaluation=False)


def ch19_dro(tok):
    from rlkit.llm.dro import ADDITION_GROUPS, DROWeights, group_mixture
    task = group_mixture(ADDITION_GROUPS, {"carry": 0.5, "no carry": 0.5})
    return task, RLConfig(algo="dr_grpo", **SMALL), dict(hooks=[DROWeights("group", step_size=1.0)],
                                                         evaluation=False)


def ch22_bonuses(tok):
    from rlkit.llm.explore import FACTS, DiversityBonus, EntropyBonus, RNDBonus
    return FACTS, RLConfig(algo="grpo", **SMALL), dict(
        hooks=[DiversityBonus(0.5), RNDBonus(0.3), EntropyBonus(0.01)], evaluation=False)


CONFIGS = {f.__name__: f for f in (ch07_grpo, ch07_ppo_kl, ch07_grpo_kl_loss, ch14_dense, ch16_lagged_vtrace,
                                   ch18_cost, ch18_cost_shielded, ch19_dro, ch22_bonuses)}


def _extend_configs():
    """Chapters whose parts live in modules that may be absent in a partial install are added if importable."""
    try:
        from rlkit.llm.stale import StaleControl, StaleLoss
        from rlkit.staleness import StaleTrainingConfig

        def ch12_stale(tok):
            from rlkit.llm.samplers import Lagged
            from rlkit.llm.trainer import HeldOut
            stale = StaleTrainingConfig(method="adaptive", lag=1, eps_stale=0.5)
            return ADDITION, RLConfig(algo="grpo", **SMALL), dict(
                sampler=Lagged(stale.lag), loss=StaleLoss(stale), hooks=[StaleControl(stale)],
                evaluation=HeldOut(sampled=False, seed_offset=2, rewards=False))
        CONFIGS["ch12_stale"] = ch12_stale
    except ImportError:
        pass
    try:
        from rlkit.llm.recipe import recipe_parts

        def ch24_recipe(tok):
            task, cfg, kw = recipe_parts(tok, RLConfig(algo="ppo", **SMALL))
            return task, cfg, kw
        CONFIGS["ch24_recipe"] = ch24_recipe
    except ImportError:
        pass


_extend_configs()


# per-token rewards read one character per token (rlkit.llm.dense_rewards): a subword tokenizer is refused
NEEDS_CHAR_TOKENIZER = {"ch14_dense"}


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _moved(before, model):
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.fixture(scope="module")
def base():
    return load_pretrained()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_runs_on_a_hugging_face_model(name):
    if os.environ.get("CI"):
        import transformers  # noqa: F401  (CI installs the hf extra)
    else:
        pytest.importorskip("transformers", reason='rlkit.llm.hf needs transformers: pip install -e ".[hf]"')
    from rlkit.llm.hf import HFCausalLM, HFTokenizer, char_tokenizer_to_hf, gpt_to_hf
    gpt, ctok = load_pretrained()
    lm, tok = HFCausalLM(gpt_to_hf(gpt)), HFTokenizer(char_tokenizer_to_hf(ctok))
    task, cfg, kw = CONFIGS[name](tok)
    before = _params(lm)
    if name in NEEDS_CHAR_TOKENIZER:
        with pytest.raises(ValueError, match="character tokenizer"):
            train(lm, tok, task, cfg, **kw)
        return
    res = train(lm, tok, task, cfg, **kw)
    # the weights move, unless every group of every update had equal rewards (no gradient at all)
    assert _moved(before, lm) or all(x == 1.0 for x in res.history["zero_var_share"]), name
    for key in ("reward", "loss", "grad_norm"):
        assert len(res.history[key]) == cfg.steps and all(math.isfinite(x) for x in res.history[key]), (name, key)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_reference_runs_only_with_a_kl_penalty(name, base, monkeypatch):
    calls = []
    orig = KLPenalty.on_batch
    monkeypatch.setattr(KLPenalty, "on_batch", lambda self, run, step: (calls.append(1), orig(self, run, step))[1])
    model, tok = copy.deepcopy(base[0]), base[1]
    task, cfg, kw = CONFIGS[name](tok)
    has_kl = any(isinstance(h, KLPenalty) for h in kw.get("hooks", ()))
    res = train(model, tok, task, cfg, **kw)
    assert (len(calls) > 0) == has_kl, name
    assert ("kl" in res.history) == has_kl, name
    if has_kl:
        assert all(math.isfinite(x) for x in res.history["kl"])


class _TrainNothing(Hook):
    """Drops every token from the update after the advantages (an extreme staleness filter)."""

    def on_advantages(self, run, step):
        step.mask = torch.zeros_like(step.mask)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_an_update_with_no_trained_token_moves_nothing_and_logs_no_nan(name, base):
    model, tok = copy.deepcopy(base[0]), base[1]
    task, cfg, kw = CONFIGS[name](tok)
    kw = {**kw, "hooks": [*kw.get("hooks", ()), _TrainNothing()]}
    before = _params(model)
    res = train(model, tok, task, cfg, **kw)
    assert not _moved(before, model), name
    for key in ("loss", "grad_norm", "clip_fraction", "entropy"):      # measured on minibatches: none ran
        assert all(math.isnan(x) for x in res.history[key]), (name, key)
    for key in ("reward", "accuracy", "response_length"):
        assert all(math.isfinite(x) for x in res.history[key]), (name, key)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_same_seed_gives_the_same_run(name, base):
    runs = []
    for _ in range(2):
        model, tok = copy.deepcopy(base[0]), base[1]
        task, cfg, kw = CONFIGS[name](tok)
        runs.append((train(model, tok, task, cfg, **kw), model))
    (a, ma), (b, mb) = runs
    assert a.history.keys() == b.history.keys()
    for k in a.history:
        if k != "train_seconds":
            assert a.history[k] == pytest.approx(b.history[k], nan_ok=True, rel=0, abs=0), (name, k)
    assert all(torch.equal(x, y) for x, y in zip(ma.parameters(), mb.parameters())), name


@pytest.mark.parametrize("field", sorted(MOVED_FIELDS))
def test_a_setting_that_moved_to_a_component_is_refused_naming_where_it_went(field):
    """rlkit 0.3's RLConfig holds the loop's settings only: each 0.2 field of a component (the KL penalty,
    PPO's critic, the dense rewards) is refused, by the constructor and by replace, with its new home."""
    assert field not in {f.name for f in dataclasses.fields(RLConfig)}
    value = {"kl_estimator": "k1", "kl_in": "reward", "log_kl": True, "token_rewards": True,
             "value_target": "mc", "value_nstep": 2}.get(field, 0.5)
    home = re.escape(MOVED_FIELDS[field])
    with pytest.raises(ValueError, match=rf"RLConfig\.{field} .*{home}"):
        RLConfig(**{field: value})
    with pytest.raises(ValueError, match=rf"RLConfig\.{field} .*{home}"):
        RLConfig().replace(**{field: value})
    assert MOVED_FIELDS[field].startswith(("hooks=[KLPenalty(", "hooks=[DenseRewards(", "advantages=TokenGAE("))


@pytest.mark.parametrize("kw", ["ref_model", "critic"])
def test_train_refuses_the_reference_and_critic_that_now_belong_to_their_components(base, kw):
    """The reference model is KLPenalty(ref_model=...)'s, PPO's critic TokenGAE(critic)'s: train takes neither."""
    model, tok = copy.deepcopy(base[0]), base[1]
    with pytest.raises(TypeError, match=kw):
        train(model, tok, ADDITION, RLConfig(algo="ppo", **SMALL), **{kw: copy.deepcopy(model)})
