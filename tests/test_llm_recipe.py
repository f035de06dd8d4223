"""Tests of rlkit.llm.recipe (chapter 24): the constrained task, the shield, the judge ensemble and its hooks,
the two-channel critic, guidance, the wrapper's switches and its refusals, each against an independent computation."""
import copy
import math

import pytest
import torch

from rlkit.llm import ADDITION, RLConfig, load_pretrained, sample, train
from rlkit.llm.advantages import OffPolicy
from rlkit.llm.evaluation import encode_prompts
from rlkit.llm.heads import LogitHead
from rlkit.llm.lagged import ClippedLoss
from rlkit.llm.recipe import (
    _UNREAD,
    RECIPE_TASK,
    SLOPPY_JUDGES,
    Judges,
    RecipeConfig,
    RewardCostQHead,
    UncertaintyWeight,
    ensemble_rewards,
    evaluate_recipe,
    forbidden_addition,
    q_guidance,
    recipe_parts,
    train_recipe,
)
from rlkit.llm.safety import FORBIDDEN, CostConstraint, forbidden_substrings, substring_shield
from rlkit.llm.samplers import Lagged
from rlkit.llm.sampling import token_logprobs
from rlkit.llm.tasks import Problem
from rlkit.llm.trainer import Hook
from rlkit.objectives import normalize_advantages
from rlkit.safety import LagrangeMultiplier

torch.set_num_threads(1)
SMALL = dict(algo="ppo", steps=3, prompts_per_step=4, group_size=4, lr=2e-4, seed=0)
LOOP = SMALL                                # the same loop settings, for train() with its parts
VALUE_LR = 1e-3                             # the critic's: OffPolicy(lr=VALUE_LR), RecipeConfig(value_lr=VALUE_LR)
J3 = ("prefix", "contains", "close1")


@pytest.fixture(scope="module")
def lm():
    return load_pretrained()


def test_the_task_is_chapter_18s_with_three_judges():
    assert FORBIDDEN == ("13", "14")
    cost = forbidden_substrings(FORBIDDEN)
    assert cost("113", None) == 1.0 and cost("141", None) == 1.0 and cost("31", None) == 0.0 and cost("", None) == 0.0
    share = sum(any(s in str(a + b) for s in FORBIDDEN) for a in range(10, 100) for b in range(10, 100)) / 8100
    assert abs(share - 0.168) < 0.001          # the 16.8% the chapter quotes
    for task in (RECIPE_TASK, forbidden_addition()):
        assert set(task.checkers) == {"exact", "prefix", "contains", "close1", "cost"}
        p = Problem("67+46=", "113")
        assert task.checkers["cost"]("113", p) == 1.0 and task.checkers["close1"]("112", p) == 1.0
        assert task.checkers["prefix"]("", p) == 1.0 and task.checkers["contains"]("x113", p) == 1.0
    assert set(SLOPPY_JUDGES) == set(J3)


def test_the_shield_bans_exactly_3_and_4_after_a_response_1(lm):
    """The banned set of the 0.2 recipe's shield: 3 and 4 whenever the response so far ends with 1."""
    _, tok = lm
    sh = substring_shield(tok, FORBIDDEN)
    contexts = ["12+3=1", "12+3=2", "12+3=", "91+41=1", "11+11=", "12+3=11", "12+3=13"]
    ctx = torch.tensor([tok.encode(c) for c in contexts[:2]])
    for c in contexts:
        ids = torch.tensor([tok.encode(c)])
        out = sh(ids, torch.ones_like(ids, dtype=torch.bool), torch.zeros(1, tok.vocab_size))
        response = c.split("=", 1)[1]
        want = {tok.encode("3")[0], tok.encode("4")[0]} if response.endswith("1") else set()
        assert {v for v in range(tok.vocab_size) if math.isinf(out[0, v])} == want, c
    logits = torch.zeros(2, tok.vocab_size)
    sh(ctx, torch.ones_like(ctx, dtype=torch.bool), logits)
    assert torch.equal(logits, torch.zeros(2, tok.vocab_size))        # the input is not modified


def test_shielded_sampling_never_costs(lm):
    model, tok = lm
    probs = [p for p in RECIPE_TASK.problems(64, seed=3) for _ in range(4)]
    ids, m = encode_prompts(probs, tok)
    ro = sample(model, ids, m, max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id,
                generator=torch.Generator().manual_seed(0), logits_processor=substring_shield(tok, FORBIDDEN))
    assert RECIPE_TASK.score(tok.decode_batch(ro.response_ids), probs, "cost").sum() == 0


def test_ensemble_rewards_against_a_loop():
    task = RECIPE_TASK
    probs = [Problem("40+42=", "82")] * 4
    resp = ["82", "8", "182", "72"]
    mean, sd = ensemble_rewards(task, resp, probs, J3)
    for i, r in enumerate(resp):
        v = [task.checkers[j](r, probs[i]) for j in J3]
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
    critic = RewardCostQHead(copy.deepcopy(model), tok.vocab_size)
    assert isinstance(critic, LogitHead) and critic.shape == (2, tok.vocab_size)
    ids = torch.tensor([tok.encode("12+34=")])
    with torch.no_grad():
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
    # the recipe's own critic is a plain LogitHead of that shape; other shapes are refused
    q_guidance(LogitHead(copy.deepcopy(model), tok.vocab_size, (2, tok.vocab_size)), 0.5)
    with pytest.raises(ValueError, match="shape"):
        q_guidance(LogitHead(copy.deepcopy(model), tok.vocab_size, (tok.vocab_size,)), 0.5)


def test_recipe_config_checks():
    with pytest.raises(ValueError, match="RecipeConfig.cost_limit"):
        RecipeConfig(cost_limit=1.5)
    with pytest.raises(ValueError, match="RecipeConfig.alpha"):
        RecipeConfig(alpha=-1.0)
    with pytest.raises(ValueError, match="judges"):
        RecipeConfig(judges=())
    assert RecipeConfig(lag=3).lag.max == 3


class _Seen(Hook):
    """Records, after the recipe's hooks, what they left: rewards, sigma, channel advantages, the advantage, nu."""

    def __init__(self, constraint):
        self.constraint, self.seen = constraint, []

    def on_advantages(self, run, step):
        self.seen.append(dict(rewards=step.rewards.clone(), sigma=step.data["reward_std"].clone(),
                              parts={k: v.clone() for k, v in step.data["advantages"].items()},
                              adv=step.adv.clone(), nu=self.constraint.nu, mask=step.rollout.mask.clone(),
                              responses=list(step.batch.responses), problems=list(step.batch.problems)))


class _Raw(Hook):
    """Records the channel advantages as the estimator left them (before the recipe's weighting)."""

    def __init__(self):
        self.seen = []

    def on_advantages(self, run, step):
        self.seen.append({k: v.clone() for k, v in step.data["advantages"].items()})


def test_the_hooks_reproduce_the_recipes_advantage():
    """A = (A_r / (1 + alpha sigma) - nu A_c) / (1 + nu), each channel whitened alone, nu the one before the step."""
    model, tok = load_pretrained()
    alpha = 2.0
    mult = LagrangeMultiplier(budget=0.0, lr=1.0)
    cc = CostConstraint("cost", mult, when="after", whiten=False)
    raw, seen = _Raw(), _Seen(cc)
    res = train(model, tok, RECIPE_TASK, RLConfig(**LOOP), sampler=Lagged(1),
                advantages=OffPolicy("vtrace", "q", lr=VALUE_LR), loss=ClippedLoss(),
                hooks=[Judges(J3), raw, UncertaintyWeight(alpha), cc, seen], evaluation=False)
    nus = [0.0] + res.history["nu"][:-1]
    for k, (r, s) in enumerate(zip(raw.seen, seen.seen)):
        mask = s["mask"]
        mean, sigma = ensemble_rewards(RECIPE_TASK, s["responses"], s["problems"], J3)
        assert torch.equal(s["rewards"], mean) and torch.equal(s["sigma"], sigma)
        assert res.history["sigma"][k] == pytest.approx(float(sigma.mean()), abs=1e-7)
        assert res.history["reward"][k] == pytest.approx(float(mean.mean()), abs=1e-7)
        for ch in ("reward", "cost"):        # the estimator whitens each channel on its own
            assert torch.allclose(normalize_advantages(r[ch], mask), r[ch], atol=1e-6)
        want_r = r["reward"] / (1 + alpha * sigma[:, None])
        assert torch.allclose(s["parts"]["reward"], want_r, atol=1e-6)
        assert s["nu"] == nus[k]
        want = (want_r - nus[k] * r["cost"]) / (1 + nus[k]) * mask
        assert torch.allclose(s["adv"], want, atol=1e-6)
        if float(sigma.max()) > 0:           # the weighting shrinks and never flips a sign
            assert not torch.equal(s["parts"]["reward"], r["reward"])
        assert torch.equal(torch.sign(s["parts"]["reward"]), torch.sign(r["reward"]))
    nu = 0.0
    for c in res.history["cost"]:
        nu = max(0.0, nu + 1.0 * c)
    assert res.nu == pytest.approx(nu, abs=1e-9) and res.history["nu"][-1] == pytest.approx(nu, abs=1e-9)
    assert all(math.isfinite(x) for x in res.history["cost_value_loss"])
    assert res.critic.shape == (2, tok.vocab_size)


def test_uncertainty_weight_needs_judges_and_alpha_0_changes_nothing():
    model, tok = load_pretrained()
    with pytest.raises(ValueError, match="Judges"):
        train(model, tok, RECIPE_TASK, RLConfig(**LOOP), sampler=Lagged(1),
              advantages=OffPolicy("vtrace", "q", lr=VALUE_LR), loss=ClippedLoss(), hooks=[UncertaintyWeight(1.0)],
              evaluation=False)
    runs = []
    for hooks in ([Judges(J3)], [Judges(J3), UncertaintyWeight(0.0)]):
        model, tok = load_pretrained()
        res = train(model, tok, RECIPE_TASK, RLConfig(**LOOP), sampler=Lagged(1),
                    advantages=OffPolicy("vtrace", "q", lr=VALUE_LR), loss=ClippedLoss(), hooks=hooks, evaluation=False)
        runs.append((res.history["loss"], [p.clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0] and all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    with pytest.raises(ValueError, match="judge"):
        train(load_pretrained()[0], tok, RECIPE_TASK, RLConfig(**LOOP), hooks=[Judges(("nope",))], evaluation=False)


def test_lagged_under_the_runs_processor_trains_the_processed_policy():
    """Under train's logits_processor the sampler's log-probs are the shielded ones; pi_k's are recomputed shielded."""
    model, tok = load_pretrained()
    shield = substring_shield(tok, FORBIDDEN)

    class Look(Hook):
        steps = []

        def on_batch(self, run, step):
            self.steps.append((step, copy.deepcopy(run.model)))

    look = Look()
    train(model, tok, RECIPE_TASK, RLConfig(**LOOP), sampler=Lagged(1),
          advantages=OffPolicy("vtrace", "q", lr=VALUE_LR), loss=ClippedLoss(),
          hooks=[CostConstraint("cost", None, when="after", whiten=False), look], evaluation=False,
          logits_processor=shield)
    for step, learner in look.steps:
        ro = step.rollout
        assert torch.equal(step.logp_behav, ro.logprobs)
        assert float(RECIPE_TASK.score(step.batch.responses, step.batch.problems, "cost").sum()) == 0.0
        want = token_logprobs(learner, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask,
                              logits_processor=shield)
        old = step.age > 0
        assert torch.allclose(step.logp_old[old], want[old], atol=1e-6)
        assert torch.equal(step.logp_old[~old], ro.logprobs[~old])
    assert any(bool((s.age > 0).any()) for s, _ in look.steps)
    with pytest.raises(ValueError, match="not both"):
        train(load_pretrained()[0], tok, RECIPE_TASK, RLConfig(**LOOP), sampler=Lagged(1, processor=shield),
              advantages=OffPolicy("vtrace", "q", lr=VALUE_LR), loss=ClippedLoss(), evaluation=False,
              logits_processor=shield)


def test_lagged_keeps_more_versions_without_changing_a_sample():
    runs = []
    for keep in (None, 9):
        model, tok = load_pretrained()
        res = train(model, tok, ADDITION, RLConfig(**LOOP), sampler=Lagged(1, keep=keep),
                    advantages=OffPolicy("vtrace", "q", lr=VALUE_LR), loss=ClippedLoss(), evaluation=False)
        runs.append(res)
    assert runs[0].archive.versions == [2, 3] and runs[1].archive.versions == [0, 1, 2, 3]
    assert runs[0].history["loss"] == runs[1].history["loss"]
    with pytest.raises(ValueError, match="keep"):
        Lagged(2, keep=2)


def test_train_recipe_is_train_on_its_parts_and_the_switches_act(lm):
    cfg = RLConfig(**SMALL)
    rc = RecipeConfig(lag=2, judges=J3, alpha=2.0, cost_limit=0.0, lambda_lr=1.0, value_lr=VALUE_LR)
    model, tok = load_pretrained()
    res = train_recipe(model, tok, RECIPE_TASK, cfg, rc)
    h = res.history
    assert len(h["cost"]) == 3 and all(math.isfinite(x) for k in h if k != "zero_var_share" for x in h[k])
    # nu follows projected SGD on the logged batch costs (limit 0: it can only rise by the cost), stepped after
    nu = 0.0
    for c in h["cost"]:
        nu = max(0.0, nu + 1.0 * (c - 0.0))
    assert math.isclose(res.nu, nu, abs_tol=1e-9) and res.lam == res.nu and math.isclose(h["nu"][-1], nu, abs_tol=1e-9)
    assert "lambda" not in h and max(h["mean_age"]) > 0                         # lagged actors
    assert res.archive.latest == 3 and res.archive.versions == [0, 1, 2, 3] and res.recipe == rc
    # the same run, written as train on recipe_parts
    model2, _ = load_pretrained()
    task, cfg2, kw = recipe_parts(tok, cfg, rc)
    assert [type(x).__name__ for x in kw["hooks"]] == ["Judges", "UncertaintyWeight", "CostConstraint"]
    res2 = train(model2, tok, task, cfg2, **kw)
    assert res2.history["loss"] == h["loss"] and res2.nu == res.nu
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
    # the shield arm samples no cost; without the Lagrangian nu stays 0 and the critic still values the cost
    model, tok = load_pretrained()
    res3 = train_recipe(model, tok, RECIPE_TASK, cfg,
                        RecipeConfig(shield=True, lagrangian=False, value_lr=VALUE_LR))
    assert max(res3.history["cost"]) == 0.0 and res3.nu == 0.0 and res3.lam == 0.0
    assert set(res3.history["nu"]) == {0.0} and all(math.isfinite(x) for x in res3.history["cost_value_loss"])
    assert "UncertaintyWeight" not in [type(x).__name__ for x in recipe_parts(tok)[2]["hooks"]]
    ev = evaluate_recipe(res3.model, tok, RECIPE_TASK, RECIPE_TASK.problems(16, seed=1, split="test"))
    assert set(ev) == {"accuracy", "cost", "disagreement", "responses"} and 0 <= ev["cost"] <= 1


def test_train_recipe_input_checks(lm):
    model, tok = lm
    with pytest.raises(ValueError, match="algo"):
        train_recipe(model, tok, RECIPE_TASK, RLConfig(algo="grpo", steps=1))
    with pytest.raises(ValueError, match="cost"):
        train_recipe(model, tok, ADDITION, RLConfig(algo="ppo", steps=1))
    with pytest.raises(ValueError, match="judge"):
        train_recipe(model, tok, RECIPE_TASK, RLConfig(algo="ppo", steps=1), RecipeConfig(judges=("nope",)))


#: a non-default value of every RLConfig field the recipe does not read
_IGNORED = {"temperature": 0.7, "top_k": 5, "top_p": 0.9, "clip_eps_high": 0.3, "checker": "prefix", "eval_every": 3,
            "eval_problems": 16}


@pytest.mark.parametrize("field", sorted(_IGNORED))
def test_train_recipe_refuses_an_rlconfig_field_it_does_not_read(field, lm):
    assert set(_IGNORED) == set(_UNREAD)
    model, tok = lm
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=f"train_recipe does not read RLConfig.{field} "):
        train_recipe(model, tok, RECIPE_TASK, RLConfig(**{**SMALL, field: _IGNORED[field]}))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    train_recipe(copy.deepcopy(model), tok, RECIPE_TASK, RLConfig(**{**SMALL, "steps": 1}),
                 RecipeConfig(value_lr=VALUE_LR))


def test_train_recipe_takes_the_critic_settings_from_recipe_config(lm):
    """rlkit 0.3: gamma, lam, value_lr and value_coef are RecipeConfig's (OffPolicy's gamma, lam, lr, coef)."""
    for field, home in [("gamma", "OffPolicy\\(gamma="), ("lam", "OffPolicy\\(lam="), ("value_lr", "OffPolicy\\(lr="),
                        ("value_coef", "OffPolicy\\(coef="), ("kl_coef", "KLPenalty"), ("log_kl", "KLPenalty"),
                        ("token_rewards", "DenseRewards"), ("value_target", "TokenGAE\\(target=")]:
        with pytest.raises(ValueError, match=f"RLConfig.{field} is not a setting of the loop.*{home}"):
            RLConfig(**{**SMALL, field: 0.5})
    _, tok = lm
    for rc, want in [(RecipeConfig(), (1.0, 1.0, None, 1.0)),
                     (RecipeConfig(gamma=0.9, lam=0.8, value_lr=VALUE_LR, value_coef=0.5), (0.9, 0.8, VALUE_LR, 0.5))]:
        _, cfg, kw = recipe_parts(tok, RLConfig(**SMALL), rc)
        est = kw["advantages"]
        assert cfg == RLConfig(**SMALL) and (est.gamma, est.lam, est.lr, est.coef) == want


@pytest.mark.parametrize("kw", [dict(vtrace=False, clip_rho=2.0), dict(lagrangian=False, cost_limit=0.1),
                                dict(lagrangian=False, lambda_lr=1.0), dict(lagrangian=False, lambda_init=1.0)])
def test_train_recipe_refuses_a_recipe_field_its_switches_make_unread(kw, lm):
    model, tok = lm
    name = next(k for k in kw if k not in ("vtrace", "lagrangian"))
    with pytest.raises(ValueError, match=f"RecipeConfig.{name}"):
        train_recipe(model, tok, RECIPE_TASK, RLConfig(**SMALL), RecipeConfig(**kw))
