"""Chapter 24's judges with a shared blind spot, the minimum and mean of judges, and the multiplier's cost of the
current policy (rlkit.llm.recipe), each against a hand-worked case or an independent loop."""
import itertools
import math

import pytest
import torch

from rlkit.llm import RLConfig, load_pretrained, train
from rlkit.llm.advantages import OffPolicy
from rlkit.llm.lagged import ClippedLoss
from rlkit.llm.recipe import (
    RECIPE_TASK,
    SHARED_BUG_JUDGES,
    SLOPPY_JUDGES,
    CurrentCostConstraint,
    Judges,
    aggregate_judges,
    current_policy_cost,
    ensemble_rewards,
    shared_truncation,
)
from rlkit.llm.samplers import Lagged
from rlkit.llm.tasks import Problem, contains_answer, exact_match, numeric_close
from rlkit.llm.trainer import Hook
from rlkit.safety import LagrangeMultiplier
from rlkit.staleness import LagDistribution

torch.set_num_threads(1)
P = Problem("37*45=", "1665")
DIGITS = [""] + ["".join(t) for d in range(1, 5) for t in itertools.product("0123456789", repeat=d)]


def test_shared_truncation_trusts_every_non_empty_truncation_and_nothing_else():
    c = shared_truncation(contains_answer)
    n1 = shared_truncation(numeric_close(1.0))
    for y in ("1", "16", "166"):
        assert c(y, P) == 1.0 and n1(y, P) == 1.0
        assert contains_answer(y, P) == 0.0                      # the original judge rejects them
    assert c("", P) == 0.0 and n1("", P) == 0.0                  # the empty answer: checked as before
    assert n1("15", P) == 1.0 and c("15", P) == 0.0              # off by one of "16": close1's own bug on a cut answer
    for y in ("1665", "x1665", "1666", "1664", "2", "17"):
        assert c(y, P) == contains_answer(y, P)
        if len(y) >= 4:
            assert n1(y, P) == numeric_close(1.0)(y, P)
    with pytest.raises(TypeError, match="checker"):
        shared_truncation("prefix")


def test_the_minimum_closes_only_holes_that_some_judge_does_not_share():
    # every digit string of up to 4 characters: the three disjoint judges' minimum is exact match; with the shared
    # bug it also accepts the non-empty truncations, i.e. exactly the intersection of the three judges' holes
    lo = aggregate_judges(SLOPPY_JUDGES, "min")
    shared = aggregate_judges(SHARED_BUG_JUDGES, "min")
    assert [y for y in DIGITS if lo(y, P) == 1.0] == [y for y in DIGITS if exact_match(y, P) == 1.0] == ["1665"]
    want = [y for y in DIGITS if all(j(y, P) == 1.0 for j in SHARED_BUG_JUDGES.values())]
    assert [y for y in DIGITS if shared(y, P) == 1.0] == want == ["1", "16", "166", "1665"]
    # formatting forms that float() forgives still pass the disjoint judges' minimum (the review's list)
    assert lo("1665.", P) == 1.0 and lo("1665.0", P) == 1.0 and lo("1665 ", P) == 1.0
    # the mean gives the empty answer a third, the minimum nothing
    mean = aggregate_judges(list(SLOPPY_JUDGES.values()), "mean")
    assert mean("", P) == pytest.approx(1 / 3) and lo("", P) == 0.0
    with pytest.raises(ValueError, match="how"):
        aggregate_judges(SLOPPY_JUDGES, "max")
    with pytest.raises(ValueError, match="judges"):
        aggregate_judges({}, "min")


def test_ensemble_rewards_min_against_a_loop():
    probs = [Problem("67+46=", "113"), Problem("12+3=", "15"), Problem("50+50=", "100")]
    resp = ["113", "", "99"]
    j3 = tuple(SLOPPY_JUDGES)
    r_min, sig = ensemble_rewards(RECIPE_TASK, resp, probs, j3, "min")
    r_mean, sig2 = ensemble_rewards(RECIPE_TASK, resp, probs, j3)
    for i, (y, p) in enumerate(zip(resp, probs)):
        v = [SLOPPY_JUDGES[j](y, p) for j in j3]
        m = sum(v) / 3
        assert r_min[i] == min(v) and r_mean[i] == pytest.approx(m)
        assert sig[i] == pytest.approx(math.sqrt(sum((x - m) ** 2 for x in v) / 3)) and sig2[i] == sig[i]
    with pytest.raises(ValueError, match="aggregate"):
        ensemble_rewards(RECIPE_TASK, resp, probs, j3, "median")
    with pytest.raises(ValueError, match="aggregate"):
        Judges(j3, aggregate="max")


def test_current_policy_cost_hand_case_and_edges():
    costs = torch.tensor([1.0, 0.0])
    behav = torch.zeros(2, 3)
    new = torch.tensor([[math.log(3.0), 0.0, 5.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])        # the 5.0 is masked out
    assert current_policy_cost(costs, new, behav, mask) == pytest.approx(0.75)   # weights 3 : 1
    assert current_policy_cost(costs, behav, behav, mask) == pytest.approx(0.5)  # fresh: the plain mean
    big = torch.tensor([[1000.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert current_policy_cost(costs, big, behav, mask) == pytest.approx(1.0)    # no overflow
    with pytest.raises(ValueError, match="costs is empty"):          # no response: an error, never NaN
        current_policy_cost(torch.zeros(0), torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0, 3))
    # NaN in the padding of the log-probs is ignored (a masked-out position holds anything)
    lp = torch.tensor([[-1.0, float("nan")], [-2.0, -0.5]])
    got = current_policy_cost(torch.tensor([1.0, 0.0]), lp, torch.full((2, 2), -1.0),
                              torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
    w = torch.softmax(torch.tensor([0.0, -1.0 + 0.5]), 0)
    assert math.isclose(got, float(w[0]), rel_tol=1e-6)
    with pytest.raises(ValueError, match="logp_new"):
        current_policy_cost(costs, torch.zeros(3, 3), behav, mask)
    with pytest.raises(ValueError, match="costs"):
        current_policy_cost(costs[:, None], new, behav, mask)


class _Recorder(Hook):
    """Recomputes the current policy's cost with a plain loop over the rows, after the constraint's on_batch."""

    def __init__(self, constraint):
        self.constraint, self.seen = constraint, []

    def on_batch(self, run, step):
        b = step.batch
        c = [RECIPE_TASK.checkers["cost"](y, p) for y, p in zip(b.responses, b.problems)]
        w = [math.exp(float(((step.logp_old[i] - step.logp_behav[i]) * step.mask[i]).sum())) for i in range(len(c))]
        self.seen.append((self.constraint.cost, sum(wi * ci for wi, ci in zip(w, c)) / sum(w), sum(c) / len(c),
                          float((step.age > 0).float().mean())))


def test_current_cost_constraint_steps_before_on_the_importance_weighted_cost():
    model, tok = load_pretrained()
    mult = LagrangeMultiplier(budget=0.08, lr=2.0)
    con = CurrentCostConstraint("cost", mult, when="before", whiten=True)
    rec = _Recorder(con)
    cfg = RLConfig(algo="ppo", steps=4, prompts_per_step=4, group_size=4, lr=2e-4, seed=0)
    res = train(model, tok, RECIPE_TASK, cfg, sampler=Lagged(LagDistribution.uniform(2), keep=3),
                advantages=OffPolicy("vtrace", "q", lr=1e-3, normalize=False), loss=ClippedLoss(),
                hooks=[Judges(tuple(SLOPPY_JUDGES), aggregate="min"), con, rec], evaluation=False)
    h = res.history
    assert any(age > 0 for *_, age in rec.seen)                     # some rows were stale
    nu = 0.0
    for k, (cost, loop, plain, _) in enumerate(rec.seen):
        assert cost == pytest.approx(loop, rel=1e-5, abs=1e-7)      # the multiplier's cost is pi_k's (IS)
        assert h["cost"][k] == pytest.approx(cost) and h["batch_cost"][k] == pytest.approx(plain)
        nu = max(0.0, nu + 2.0 * (cost - 0.08))                    # projected dual ascent, stepped before
        assert h["nu"][k] == pytest.approx(nu)
    assert res.nu == pytest.approx(nu)
