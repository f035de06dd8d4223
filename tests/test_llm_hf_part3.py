"""Part III's trainers run unchanged on a Hugging Face model through rlkit.llm.hf.

Each trainer that takes a model is run for a couple of updates on the tiny GPT's weights mapped
into an HF GPT-2 (``gpt_to_hf``), with the char tokenizer wrapped as an HF tokenizer; the
parameters must move and the logged losses be finite. Chapter 16's lagged learner is covered in
tests/test_llm_hf.py. Not covered: the heads of chapters 14 and 20 that read the tiny GPT's hidden
states (``GPT(return_hidden=True)``); they are critics, not trainers.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
if os.environ.get("CI"):
    import transformers  # noqa: F401  (CI installs the hf extra)
else:
    pytest.importorskip("transformers", reason='rlkit.llm.hf needs transformers: pip install -e ".[hf]"')

from rlkit.llm import RLConfig, load_pretrained  # noqa: E402
from rlkit.llm.hf import HFCausalLM, HFTokenizer, char_tokenizer_to_hf, gpt_to_hf  # noqa: E402


def hf_model():
    gpt, tok = load_pretrained()
    return HFCausalLM(gpt_to_hf(gpt)), HFTokenizer(char_tokenizer_to_hf(tok))


def moved(before, model):
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def test_cost_constraint_with_a_shield():
    from rlkit.llm import train
    from rlkit.llm.safety import FORBIDDEN_ADDITION, CostConstraint, ShieldRate, substring_shield
    from rlkit.safety import LagrangeMultiplier

    lm, tok = hf_model()
    before = snapshot(lm)
    cfg = RLConfig(algo="ppo", steps=2, prompts_per_step=4, group_size=2, minibatches=1, lr=3e-4)
    res = train(lm, tok, FORBIDDEN_ADDITION, cfg, hooks=[CostConstraint("cost", LagrangeMultiplier(budget=0.0, lr=1.0)),
                                                         ShieldRate()],
                logits_processor=substring_shield(tok, ["13"]), evaluation=False)
    assert moved(before, lm) and all(math.isfinite(x) for x in res.array("value_loss"))
    assert all(math.isfinite(x) for x in res.array("cost_value_loss")) and res.nu == res.array("nu")[-1]


def test_dro_weights():
    from rlkit.llm import train
    from rlkit.llm.dro import ADDITION_GROUPS, DROWeights, GroupAccuracy, group_mixture, group_problems

    lm, tok = hf_model()
    before = snapshot(lm)
    task = group_mixture(ADDITION_GROUPS, {"carry": 0.5, "no carry": 0.5})
    cfg = RLConfig(algo="dr_grpo", steps=2, prompts_per_step=4, group_size=2, eval_every=2)
    ev = {g: p[:4] for g, p in group_problems(ADDITION_GROUPS, 4).items()}
    res = train(lm, tok, task, cfg, hooks=[DROWeights("group")], evaluation=GroupAccuracy(ev))
    assert moved(before, lm) and len(res.group_weights) == 2 and res.evals["step"] == [0, 2]


def test_explore_bonuses_with_rnd_on_a_frozen_encoder():
    from rlkit.llm import train
    from rlkit.llm.explore import FACTS, DiversityBonus, EntropyBonus, RNDBonus, facts_format
    from rlkit.llm.trainer import KLPenalty

    lm, tok = hf_model()
    before = snapshot(lm)
    cfg = RLConfig(algo="grpo", steps=2, prompts_per_step=2, group_size=4)
    res = train(lm, tok, FACTS, cfg, logits_processor=facts_format(tok), evaluation=False,
                hooks=[KLPenalty(0.1, "k1", where="reward", processed=True), DiversityBonus(0.5), RNDBonus(0.3),
                       EntropyBonus(0.01)])
    assert moved(before, lm)
    assert all(math.isfinite(x) for k in ("reward", "rnd_raw", "kl", "kl_seq") for x in res.history[k])
    # RND's width comes from the HF encoder's hidden states (HFCausalLM's config has no n_embd)
    assert res.rnd.target[0].in_features == lm.hf.config.n_embd and res.rnd.rew_rms.count == 16
    assert res.rnd.encoder is not lm and all(not p.requires_grad for p in res.rnd.encoder.parameters())


def test_multiturn_trainer():
    from rlkit.llm.multiturn import RETRY_ADDITION, MultiTurnConfig, train_multiturn

    lm, tok = hf_model()
    before = snapshot(lm)
    cfg = MultiTurnConfig(gamma=0.5, steps=2, prompts_per_step=2, group_size=4, eval_every=2)
    res = train_multiturn(lm, tok, RETRY_ADDITION, cfg, eval_set=RETRY_ADDITION.problems(4, seed=0, split="test"))
    assert moved(before, lm) and all(math.isfinite(x) for k in ("loss", "grad_norm") for x in res.history[k])


def test_hierarchy_executor_trainer():
    from rlkit.llm.hierarchy import THREE_TERM_ADDITION, HierarchyConfig, smallest_first_planner, train_executor

    lm, tok = hf_model()
    before = snapshot(lm)
    cfg = HierarchyConfig(steps=2, prompts_per_step=2, group_size=4, eval_every=2, seed=3)
    res = train_executor(lm, tok, THREE_TERM_ADDITION, smallest_first_planner, cfg,
                         eval_problems=THREE_TERM_ADDITION.problems(4, seed=5, split="test"))
    assert moved(before, lm) and all(math.isfinite(x) for k in ("reward", "loss", "grad_norm") for x in res.history[k])


def test_recipe_trainer():
    from rlkit.llm.recipe import RecipeConfig, forbidden_addition, train_recipe

    lm, tok = hf_model()
    before = snapshot(lm)
    cfg = RLConfig(algo="ppo", lam=1.0, steps=2, prompts_per_step=4, group_size=4, lr=2e-4, value_lr=1e-3)
    res = train_recipe(lm, tok, forbidden_addition(), cfg, RecipeConfig(lag=2, judges=("prefix", "contains", "close1")))
    assert moved(before, lm) and res.critic.shape == (2, tok.vocab_size)
    assert all(math.isfinite(x) for k in ("cost", "nu", "value_loss", "cost_value_loss") for x in res.history[k])
