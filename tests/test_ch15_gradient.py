"""The chapter-15 trainer's expected update is the gradient of the objective the chapter states (issue 22).

Chapter 15 defines J_gamma = E[G_1] = sum_n gamma^(n-1) Pr(first right answer at turn n) and trains with
:func:`rlkit.llm.multiturn.turn_update`. The policy-gradient theorem for a discounted objective weights the
score of turn u (1-based) by gamma^(u-1); without that weight the update is not the gradient of J_gamma for
gamma < 1 (review part3a, finding 15.1: on a two-turn toy at gamma = 0 the old update's expectation was
(0.350, 0.105) against grad J_0 = (0.245, 0)).

The problem here is small enough to enumerate every batch. A two-parameter policy answers "1" (right) or
"2" (wrong) and then <eos>; turn 1 is right with probability sigmoid(theta), every later turn with
sigmoid(theta + phi). The tests:

* enumerate every joint outcome of a group of conversations, push each through ``turn_update`` (its
  sampler replaced by the enumerated batch, its optimiser by a recorder of the gradient), and compare the
  probability-weighted mean of the trainer's gradient with grad J_gamma computed from the closed form
  of J_gamma by a separate float64 autograd pass: equal to 1e-5 (relative), for gamma in {0, 0.5, 0.9, 1},
  two and three turns, the leave-one-out and no baseline, with and without the format bonus;
* the same enumeration with ``turn_weighting="none"`` (the update before issue 22) reproduces the
  review's numbers and differs from grad J_gamma for gamma < 1 (so the first test can fail);
* a Monte Carlo run of the unmodified ``turn_update`` (real sampling): the mean gradient over batches lies
  within 4.5 standard errors of grad J_gamma, and the old update's expectation lies far outside.
"""
import itertools
import math
import random

import pytest
import torch
from torch import nn

import rlkit.llm.multiturn as mt
from rlkit.llm import CharTokenizer
from rlkit.llm.multiturn import MultiTurnConfig, MultiTurnRollout, RetryTask, episode_layout, turn_update
from rlkit.llm.tasks import Problem, Task

TOK = CharTokenizer()
PROBLEM = Problem(prompt="1+0=", answer="1")
RIGHT, WRONG, EOS = TOK.stoi["1"], TOK.stoi["2"], TOK.eos_id
START = {TOK.stoi["="], TOK.stoi["x"]}          # the model answers after "=" (turn 1) and after "x" (later turns)
FEEDBACK = TOK.stoi["x"]
THETA, PHI = 0.3, -0.5                          # the review's toy: sigmoid(0.3) = 0.574, sigmoid(-0.2) = 0.450


def toy_task(turns: int) -> RetryTask:
    base = Task("one", lambda rng: PROBLEM, max_new_tokens=2)
    return RetryTask(base, max_turns=turns, feedback="x", chars=TOK.chars)


class TwoParameterPolicy(nn.Module):
    """Logits over the vocabulary. At an answer start: log-odds of "1" against "2" is theta at turn 1 and
    theta + phi at later turns (turn = 1 + the number of "x" read so far); every other token -1e4 (probability
    0 in float32). After a digit: <eos> with probability 1. Elsewhere (never scored): uniform."""

    def __init__(self, theta=THETA, phi=PHI):
        super().__init__()
        self.theta = nn.Parameter(torch.tensor(float(theta)))
        self.phi = nn.Parameter(torch.tensor(float(phi)))

    def forward(self, ids):
        later = (torch.cumsum((ids == FEEDBACK).long(), dim=1) > 0).float()
        start = torch.zeros(ids.shape, dtype=torch.bool)
        for s in START:
            start |= ids == s
        digit = (ids == RIGHT) | (ids == WRONG)
        V = TOK.vocab_size
        right = torch.zeros(V)
        right[RIGHT] = 1.0
        blocked = torch.full((V,), -1e4)
        blocked[RIGHT] = blocked[WRONG] = 0.0
        at_start = blocked + right * (self.theta + self.phi * later)[..., None]     # log-odds of "1" vs "2"
        eos_only = torch.full((V,), -1e4)
        eos_only[EOS] = 0.0
        logits = torch.where(start[..., None], at_start, torch.zeros(V))
        return torch.where(digit[..., None], eos_only.expand_as(logits), logits)


def outcomes(turns: int):
    """Every conversation: its answers (n - 1 wrong, then right at turn n; or `turns` wrong ones)."""
    out = [["2"] * (n - 1) + ["1"] for n in range(1, turns + 1)]
    return out + [["2"] * turns]


def prob(answers, theta, phi, lib=math):
    """Probability of a conversation under the toy policy (float or float64 tensor)."""
    sig = (lambda z: 1 / (1 + lib.exp(-z)))
    p = 1.0
    for k, a in enumerate(answers):
        q = sig(theta + (phi if k else 0.0))
        p = p * (q if a == "1" else 1 - q)
    return p


def objective(theta, phi, gamma, turns, bonus):
    """J_gamma = E[G_1] from the closed form: sum over conversations of Pr * sum_u gamma^(u-1) r_u, with
    r_u = 1[right] + bonus (every answer here is a well-formed number). A plain loop, not rlkit's returns."""
    J = 0.0
    for answers in outcomes(turns):
        G = sum(gamma ** k * ((a == "1") + bonus) for k, a in enumerate(answers))
        J = J + prob(answers, theta, phi, lib=torch) * G
    return J


def exact_gradient(gamma, turns, bonus=0.0):
    th = torch.tensor(THETA, dtype=torch.float64, requires_grad=True)
    ph = torch.tensor(PHI, dtype=torch.float64, requires_grad=True)
    return torch.stack(torch.autograd.grad(objective(th, ph, gamma, turns, bonus), (th, ph))).numpy()


def batch(convs, task):
    """A MultiTurnRollout holding the given conversations (lists of answers), as rollout_turns lays it out."""
    segs, K = [], task.max_turns
    rewards, mask = torch.zeros(len(convs), K), torch.zeros(len(convs), K)
    for i, answers in enumerate(convs):
        s = [(TOK.encode(PROBLEM.prompt), -1)]
        for k, a in enumerate(answers):
            if k:
                s.append((TOK.encode("x"), -1))
            s.append((TOK.encode(a, eos=True), k))
            rewards[i, k], mask[i, k] = float(a == "1"), 1.0
        segs.append(s)
    lay = episode_layout(segs, TOK.pad_id)
    return MultiTurnRollout(**lay, logprobs=torch.zeros(lay["ids"].shape), turn_rewards=rewards, turn_mask=mask,
                            num_turns=mask.sum(-1).long(), solved=rewards.sum(-1) > 0, responses=list(convs),
                            problems=[PROBLEM] * len(convs), prompt_len=torch.full((len(convs),), 4))


class GradientRecorder:
    """Stands in for rlkit.llm.trainer.Run in turn_update: the optimiser records -grad(loss) and steps nothing."""

    def __init__(self, cfg, seed=0):
        self.cfg, self.model, self.tok = cfg, TwoParameterPolicy(), TOK
        self.rng, self.gen = random.Random(seed), torch.Generator().manual_seed(seed)
        self.grads = []

    def optimise(self, loss):
        g = torch.autograd.grad(loss, [self.model.theta, self.model.phi])
        self.grads.append([-x.item() for x in g])
        return 0.0


def expected_update(cfg, task, monkeypatch):
    """E[-grad L] of turn_update, exactly: every joint outcome of one group, weighted by its probability, in
    units of grad J (times the aggregation's constant U * max_new_tokens)."""
    run = GradientRecorder(cfg)
    total, mass = torch.zeros(2, dtype=torch.float64), 0.0
    for convs in itertools.product(outcomes(task.max_turns), repeat=cfg.group_size):
        monkeypatch.setattr(mt, "rollout_turns", lambda *a, _c=convs, **k: batch(list(_c), task))
        turn_update(run, task)
        p = math.prod(prob(c, THETA, PHI) for c in convs)
        total += p * torch.tensor(run.grads[-1], dtype=torch.float64)
        mass += p
    assert abs(mass - 1.0) < 1e-12
    return total.numpy() * task.max_turns * task.base.max_new_tokens


CASES = [(g, U, bl, c) for g in (0.0, 0.5, 0.9, 1.0) for U in (2, 3) for bl in ("loo", "none") for c in (0.0,)]
CASES += [(0.5, 3, "loo", 0.25), (0.0, 2, "none", 0.25)]


@pytest.mark.parametrize("gamma,turns,baseline,bonus", CASES)
def test_expected_update_is_the_exact_gradient_of_J_gamma(gamma, turns, baseline, bonus, monkeypatch):
    task = toy_task(turns)
    cfg = MultiTurnConfig(gamma=gamma, prompts_per_step=1, group_size=3, baseline=baseline, format_bonus=bonus,
                          grad_clip=None)
    got, want = expected_update(cfg, task, monkeypatch), exact_gradient(gamma, turns, bonus)
    assert abs(want).max() > 0.05
    assert abs(got - want).max() < 1e-5 * abs(want).max() + 1e-7, (got, want)


def test_the_unweighted_update_is_not_the_gradient(monkeypatch):
    """The update before issue 22 (turn_weighting="none"): the review's numbers at gamma = 0, two turns, and a
    gap from grad J_gamma at every gamma < 1 (so the test above can fail); at gamma = 1 the two agree."""
    task = toy_task(2)
    old = {g: expected_update(MultiTurnConfig(gamma=g, prompts_per_step=1, group_size=3, turn_weighting="none"),
                              task, monkeypatch) for g in (0.0, 0.5, 1.0)}
    assert abs(old[0.0] - [0.3498, 0.1053]).max() < 5e-4
    assert abs(exact_gradient(0.0, 2) - [0.2445, 0.0]).max() < 5e-4
    assert abs(old[0.5] - [0.2948, 0.1053]).max() < 5e-4 and abs(exact_gradient(0.5, 2) - [0.2421, 0.0527]).max() < 5e-4
    for g in (0.0, 0.5):
        assert abs(old[g] - exact_gradient(g, 2)).max() > 0.05
    assert abs(old[1.0] - exact_gradient(1.0, 2)).max() < 1e-5


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_sampled_updates_average_to_the_gradient(gamma):
    """The unmodified turn_update, sampling included: the mean of 300 batch gradients (4 x 8 conversations each)
    is within 4.5 standard errors of grad J_gamma, and the unweighted expectation is beyond 10 standard errors."""
    task = toy_task(2)
    cfg = MultiTurnConfig(gamma=gamma, prompts_per_step=4, group_size=8, grad_clip=None, seed=11)
    run = GradientRecorder(cfg, seed=11)
    for _ in range(300):
        turn_update(run, task)
    g = torch.tensor(run.grads, dtype=torch.float64) * task.max_turns * task.base.max_new_tokens
    mean, se = g.mean(0).numpy(), (g.std(0) / math.sqrt(len(g))).numpy()
    want = exact_gradient(gamma, 2)
    assert (abs(mean - want) < 4.5 * se + 1e-9).all(), (mean, want, se)
    p1, p2 = 1 / (1 + math.exp(-THETA)), 1 / (1 + math.exp(-THETA - PHI))
    extra = (1 - gamma) * (1 - p1) * p2 * (1 - p2)        # what the missing weight adds to each coordinate
    assert (extra > 10 * se).all()
