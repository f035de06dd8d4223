"""Part III's trainers with their own rollouts run unchanged on a Hugging Face model through rlkit.llm.hf.

Every configuration of the one loop (the hooks of chapters 12, 16, 18, 19, 22 and 24 among them) is run on
a Hugging Face model by tests/test_loop_properties.py, one test over all of them; what stays here are the
trainers with rollouts of their own (chapters 15 and 23) and RND's encoder on an HF model (chapter 22).

Each runs for a couple of updates on the tiny GPT's weights mapped into an HF GPT-2 (``gpt_to_hf``),
with the char tokenizer wrapped as an HF tokenizer; the parameters must move and the logged losses be
finite. Not covered: the heads of chapters 14 and 20 that read the tiny GPT's hidden
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
