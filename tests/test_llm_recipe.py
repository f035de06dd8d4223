"""Tests of rlkit.llm.recipe (chapter 24): the constrained task, the shield, the judge ensemble, the two-channel
critic, guidance, the trainer's switches and its input checks, each against an independent computation."""
import math

import pytest
import torch

from rlkit.llm import RLConfig, load_pretrained, sample
from rlkit.llm.evaluation import encode_prompts
from rlkit.llm.recipe import (
    FORBIDDEN,
    RecipeConfig,
    RewardCostQHead,
    ensemble_rewards,
    evaluate_recipe,
    forbidden_addition,
    forbidden_cost,
    q_guidance,
    shield_processor,
    train_recipe,
)
from rlkit.llm.tasks import Problem

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def lm():
    return load_pretrained()


def test_forbidden_cost_and_its_share_of_all_sums():
    assert FORBIDDEN == ("13", "14")
    assert forbidden_cost("113") == 1.0 and forbidden_cost("141") == 1.0 and forbidden_cost("31") == 0.0
    assert forbidden_cost("") == 0.0
    share = sum(any(s in str(a + b) for s in FORBIDDEN) for a in range(10, 100) for b in range(10, 100)) / 8100
    assert abs(share - 0.168) < 0.001          # the 16.8% the chapter quotes
    task = forbidden_addition()
    assert {"exact", "prefix", "contains", "close1", "cost"} <= set(task.checkers)
    p = Problem("67+46=", "113")
    assert task.checkers["cost"]("113", p) == 1.0 and task.checkers["close1"]("112", p) == 1.0


def test_shield_bans_exactly_3_and_4_after_1(lm):
    _, tok = lm
    sh = shield_processor(tok)
    ctx = torch.tensor([tok.encode("12+3=1"), tok.encode("12+3=2")])
    logits = torch.zeros(2, tok.vocab_size)
    out = sh(ctx, torch.ones_like(ctx, dtype=torch.bool), logits)
    banned = {tok.encode("3")[0], tok.encode("4")[0]}
    for v in range(tok.vocab_size):
        assert math.isinf(out[0, v]) == (v in banned)
    assert torch.equal(out[1], logits[1])
    assert torch.equal(logits, torch.zeros(2, tok.vocab_size))        # the input is not modified


def test_shielded_sampling_never_costs(lm):
    model, tok = lm
    task = forbidden_addition()
    probs = [p for p in task.problems(64, seed=3) for _ in range(4)]
    ids, m = encode_prompts(probs, tok)
    ro = sample(model, ids, m, max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id,
                generator=torch.Generator().manual_seed(0), logits_processor=shield_processor(tok))
    assert sum(forbidden_cost(r) for r in tok.decode_batch(ro.response_ids)) == 0


def test_ensemble_rewards_against_a_loop():
    task = forbidden_addition()
    probs = [Problem("40+42=", "82")] * 4
    resp = ["82", "8", "182", "72"]
    mean, sd = ensemble_rewards(task, resp, probs, ("prefix", "contains", "close1"))
    for i, r in enumerate(resp):
        v = [task.checkers[j](r, probs[i]) for j in ("prefix", "contains", "close1")]
        mu = sum(v) / 3
        assert math.isclose(float(mean[i]), mu, abs_tol=1e-6)
        assert math.isclose(float(sd[i]), math.sqrt(sum((x - mu) ** 2 for x in v) / 3), abs_tol=1e-6)
    assert mean.tolist()[0] == 1.0 and float(sd[0]) == 0.0 and float(mean[3]) == 0.0
    e_mean, e_sd = ensemble_rewards(task, [], [], ("exact",))
    assert e_mean.shape == (0,) and e_sd.shape == (0,)
    with pytest.raises(ValueError, match="judge"):
        ensemble_rewards(task, resp, probs, ("nope",))


def test_critic_channels_and_guidance_cancel_the_state_value(lm):
    model, tok = lm
    import copy
    critic = RewardCostQHead(copy.deepcopy(model), tok.vocab_size)
    ids = torch.tensor([tok.encode("12+34=")])
    q = critic(ids)
    assert q.shape == (1, ids.shape[1], 2, tok.vocab_size) and float(q.abs().max()) == 0.0   # zero-initialised
    with torch.no_grad():
        critic.head.bias.normal_(generator=torch.Generator().manual_seed(0))
    logits = torch.randn(1, tok.vocab_size, generator=torch.Generator().manual_seed(1))
    out = q_guidance(critic, 0.7, lam=2.0)(ids, torch.ones_like(ids, dtype=torch.bool), logits)
    qq = critic(ids)[:, -1]
    want = torch.log_softmax(logits, -1) + 0.7 * (qq[:, 0] - 2.0 * qq[:, 1])
    assert torch.allclose(out, want, atol=1e-5)
    # adding a constant to every candidate's value (a V(h_t) term) changes no probability
    assert torch.allclose(torch.log_softmax(out, -1), torch.log_softmax(out + 3.0, -1), atol=1e-6)
    base = q_guidance(critic, 0.0)(ids, torch.ones_like(ids, dtype=torch.bool), logits)
    assert torch.allclose(torch.log_softmax(base, -1), torch.log_softmax(logits, -1), atol=1e-6)


def test_recipe_config_checks():
    with pytest.raises(ValueError, match="RecipeConfig.cost_limit"):
        RecipeConfig(cost_limit=1.5)
    with pytest.raises(ValueError, match="RecipeConfig.alpha"):
        RecipeConfig(alpha=-1.0)
    with pytest.raises(ValueError, match="judges"):
        RecipeConfig(judges=())
    assert RecipeConfig(lag=3).lag.max == 3


def test_train_recipe_runs_and_the_switches_act(lm):
    task = forbidden_addition()
    cfg = RLConfig(algo="ppo", lam=1.0, steps=3, prompts_per_step=4, group_size=4, lr=2e-4, value_lr=1e-3, seed=0)
    model, tok = load_pretrained()
    res = train_recipe(model, tok, task, cfg, RecipeConfig(lag=2, judges=("prefix", "contains", "close1"),
                                                           alpha=2.0, cost_limit=0.0, lambda_lr=1.0))
    h = res.history
    assert len(h["cost"]) == 3 and all(math.isfinite(x) for k in h for x in h[k])
    # lambda follows projected SGD on the logged batch costs (limit 0: it can only rise by the cost)
    lam = 0.0
    for c in h["cost"]:
        lam = max(0.0, lam + 1.0 * (c - 0.0))
    assert math.isclose(res.lam, lam, abs_tol=1e-9) and math.isclose(h["lambda"][-1], lam, abs_tol=1e-9)
    assert max(h["mean_age"]) > 0                         # lagged actors
    assert res.archive.latest == 3
    # the shield arm samples no cost; without the Lagrangian lambda stays 0
    model, tok = load_pretrained()
    res2 = train_recipe(model, tok, task, cfg, RecipeConfig(shield=True, lagrangian=False))
    assert max(res2.history["cost"]) == 0.0 and res2.lam == 0.0
    ev = evaluate_recipe(res2.model, tok, task, task.problems(16, seed=1, split="test"))
    assert set(ev) == {"accuracy", "cost", "disagreement", "responses"} and 0 <= ev["cost"] <= 1


def test_train_recipe_input_checks(lm):
    model, tok = lm
    task = forbidden_addition()
    with pytest.raises(ValueError, match="algo"):
        train_recipe(model, tok, task, RLConfig(algo="grpo", steps=1))
    from rlkit.llm import ADDITION
    with pytest.raises(ValueError, match="cost"):
        train_recipe(model, tok, ADDITION, RLConfig(algo="ppo", steps=1))
    with pytest.raises(ValueError, match="judge"):
        train_recipe(model, tok, task, RLConfig(algo="ppo", steps=1), RecipeConfig(judges=("nope",)))

