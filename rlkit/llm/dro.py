r"""Robustness over prompt groups for the tiny LLM: skewed training mixes and DRO-weighted updates.

Chapter: 19_robust_prompts.

**Groups of prompts.** :data:`ADDITION_GROUPS` splits two-digit addition into prompts that need a
carry (about 45% of all prompts, the ones the pretraining corpus mostly got wrong) and prompts that
do not. :func:`group_mixture` builds a :class:`~rlkit.llm.Task` that draws a group with given
probabilities, then a prompt of that group, and records the group in ``Problem.info["group"]``;
the held-out split is the usual hash of the prompt, so pretraining never saw the test prompts.
:func:`noisy_groups` mislabels a fixed share of the prompts (a stable hash of each prompt decides), for
group DRO without an oracle grouping.

**DRO weights on per-prompt losses.** :class:`DROWeights` is the chapter's hook for the Dr. GRPO of
:func:`rlkit.llm.train` (``train(..., hooks=[DROWeights("group")])``; same sampling, advantages
:math:`r_i - \bar r_g`, PPO-clip loss, ``seq-mean-token-sum-norm``) with one change: response
:math:`i` of prompt :math:`x` gets a weight :math:`w_x \ge 0` with :math:`\frac1N\sum_i w_{x(i)} = 1`,
applied by scaling its advantage (:func:`dro_prompt_weights`). :class:`GroupAccuracy` is its held-out
evaluation, and :func:`train_dro` the rlkit 0.2 name of that call, kept for one release. For a
positive weight the clipped objective is linear in the advantage,
:math:`\min(\rho\,wA, \mathrm{clip}(\rho)\,wA) = w\min(\rho A, \mathrm{clip}(\rho)A)`, so this is
exactly the weighted loss :math:`\frac1N\sum_i w_{x(i)}\ell_i`. The weights (``method``):

* ``"erm"``: :math:`w \equiv 1` (empirical risk minimisation on the training mix);
* ``"group"``: group DRO (Sagawa et al., 2020): keep adversary weights :math:`q` over groups, update
  them each step with :func:`rlkit.dro.group_dro_step` on the batch's per-group success rates, and
  set :math:`w_{x} = q_{g(x)}\,N/N_{g(x)}` (:math:`N_g` = responses of group :math:`g` in the batch),
  so the loss is :math:`\sum_g q_g \cdot(\text{mean loss of group } g)`;
* ``"kl"``: the KL-ball worst case over the batch's prompts (:func:`rlkit.dro.kl_dro` on the
  per-prompt success rates :math:`\hat p_x`, radius :math:`\delta` = ``eps``);
* ``"cvar"``: CVaR over the batch's prompts (:func:`rlkit.dro.cvar`, tail share ``alpha``).

Beware a trap of prompt-level weights with binary rewards: a prompt whose :math:`m` responses all
fail has :math:`\hat p_x = 0`, the largest weight, and zero advantage, so the weight is spent on
nothing. Group weights do not have this problem, because a group's weight is shared by its prompts
that do have signal.
"""
from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence

import torch
import torch.nn as nn

from .. import _validate as V
from ..dro import cvar, group_dro_step, kl_dro
from .evaluation import evaluate
from .rl import RLConfig, refuse_unread
from .tasks import Problem, Task, addition_problem
from .tokenizer import CharTokenizer
from .trainer import Hook, RLResult, train

__all__ = ["ADDITION_GROUPS", "DRO_METHODS", "group_problem", "group_mixture", "noisy_groups", "group_problems",
           "group_accuracy", "mix_accuracy", "dro_prompt_weights", "DROWeights", "GroupAccuracy", "DROTrainResult",
           "train_dro"]

#: The weightings :func:`train_dro` knows.
DRO_METHODS = ("erm", "group", "kl", "cvar")


def group_problem(rng: random.Random, carry: bool) -> Problem:
    """A two-digit addition that needs a carry (``carry=True``) or not, by rejection from
    :func:`rlkit.llm.tasks.addition_problem`; ``info["group"]`` is ``"carry"`` or ``"no carry"``.
    Chapter: 19_robust_prompts."""
    while True:
        p = addition_problem(rng)
        if p.info["carry"] == carry:
            p.info["group"] = "carry" if carry else "no carry"
            return p


#: Generators of the two addition groups, ``{name: fn(rng) -> Problem}``.
ADDITION_GROUPS: dict[str, Callable[[random.Random], Problem]] = {
    "carry": lambda rng: group_problem(rng, True),
    "no carry": lambda rng: group_problem(rng, False),
}


def group_mixture(groups: dict, mix: dict, name: str = "addition-mix", max_new_tokens: int = 5) -> Task:
    r"""A task that draws group :math:`g` with probability ``mix[g]``, then a prompt of :math:`g`.

    Args:
        groups: ``{name: generator(rng) -> Problem}`` (e.g. :data:`ADDITION_GROUPS`); a generator may
            also return ``(prompt, answer)``, as for :class:`~rlkit.llm.Task`, and anything else is refused.
        mix: ``{name: probability}`` over the same names, summing to 1 (zeros allowed: a group the
            training mix never shows).
        name, max_new_tokens: as in :class:`~rlkit.llm.Task`.

    Returns:
        a :class:`~rlkit.llm.Task` with the exact-match checker; its problems carry
        ``info["group"]``. Chapter: 19_robust_prompts.
    """
    V.instance_of(groups, "groups", dict)
    V.instance_of(mix, "mix", dict)
    if set(mix) != set(groups) or not groups:
        raise ValueError(f"mix must give a probability for each group {sorted(groups)}, got keys {sorted(mix)}")
    names = sorted(groups)
    probs = V.probabilities([mix[g] for g in names], "mix")
    for g in names:
        V.is_callable(groups[g], f"groups[{g!r}]")

    def generate(rng):
        g = rng.choices(names, weights=probs)[0]
        p = groups[g](rng)
        if isinstance(p, tuple) and len(p) == 2:
            p = Problem(*p)
        V.instance_of(p, f"the value groups[{g!r}] returned", Problem, "Problem or (prompt, answer)")
        p.info["group"] = g
        return p

    desc = ", ".join(f"{g} {mix[g]:.0%}" for g in names)
    return Task(name, generate, max_new_tokens=max_new_tokens, description=f"group mixture: {desc}")


def _unit(prompt: str, salt: str) -> float:
    """A number in [0, 1) fixed by the prompt and the salt (crc32: the same in every process)."""
    return zlib.crc32(f"{salt}\x00{prompt}".encode()) / 2 ** 32


def noisy_groups(task: Task, rate: float, groups: Sequence[str], seed: int = 0, name: str | None = None) -> Task:
    r"""``task`` with a fixed share ``rate`` of its prompts given a wrong ``info["group"]``.

    Group DRO needs a partition of the prompts, and in practice the partition is a guess (labels from
    annotators, a classifier, a clustering) rather than the grouping that defines the failure. This
    wraps a task whose problems carry ``info["group"]`` (:func:`group_mixture`): a prompt is
    mislabelled when a stable hash of ``(seed, prompt)`` falls below ``rate``, and then gets one of
    the *other* names in ``groups`` (chosen by a second hash). The mislabelled prompts are thus a fixed
    subset, the same every time the prompt is drawn, and the sequence of prompts is exactly that of
    ``task`` with the same random numbers (the hash draws nothing from ``rng``), so a run on the noisy
    labels is paired prompt for prompt with the run on the true ones. ``info["true_group"]`` keeps the
    true label.

    Args:
        task: a :class:`~rlkit.llm.Task` whose problems carry ``info["group"]``.
        rate: the share of prompts mislabelled, in [0, 1].
        groups: the group names (at least two; every true label must be one of them).
        seed: selects which prompts are mislabelled (an int).
        name: the new task's name (default: ``task.name`` + ``"-noisy"``).

    Returns:
        a :class:`~rlkit.llm.Task` with the same checkers and response budget. Chapter: 19_robust_prompts.
    """
    V.instance_of(task, "task", Task)
    rate = V.real_in(rate, "rate", 0.0, 1.0)
    names = list(V.tuple_of(groups, "groups", str, "str"))
    if len(set(names)) < 2 or len(set(names)) != len(names):
        raise ValueError(f"groups must name at least two distinct groups, got {names}")
    seed = V.int_in(seed, "seed", -2 ** 63)

    def generate(rng):
        p = task.generate(rng)
        if "group" not in p.info:
            raise ValueError(f"noisy_groups needs problems that carry info['group']; task {task.name!r} gave none")
        g = p.info["group"]
        if g not in names:
            raise ValueError(f"the problem's group {g!r} is not one of groups={names}")
        p.info["true_group"] = g
        if _unit(p.prompt, f"flip{seed}") < rate:
            others = [h for h in names if h != g]
            p.info["group"] = others[int(_unit(p.prompt, f"to{seed}") * len(others))]
        return p

    others = {k: v for k, v in task.checkers.items() if k != "exact"}
    return Task(name or f"{task.name}-noisy", generate, check=task.check, max_new_tokens=task.max_new_tokens,
                heldout_fraction=task.heldout_fraction, checkers=others, token_checkers=task.token_checkers,
                description=f"{task.description}; {rate:.0%} of prompts mislabelled")


def group_problems(groups: dict, n: int, seed: int = 0, split: str = "test") -> dict:
    """``{group: n problems of that group from split}`` (fixed evaluation sets). Chapter: 19_robust_prompts."""
    V.instance_of(groups, "groups", dict)
    V.int_in(n, "n")
    out = {}
    for k, g in enumerate(sorted(groups)):
        task = Task(f"group-{g}", groups[g], max_new_tokens=5)
        out[g] = task.problems(n, seed=seed + 1000 * k, split=split)
        for p in out[g]:
            p.info["group"] = g
    return out


def group_accuracy(model, tok: CharTokenizer, problems: dict, max_new_tokens: int = 5) -> dict:
    r"""Greedy exact-match accuracy per group, ``{group: float}``, on ``{group: [Problem]}``.

    Chapter: 19_robust_prompts.
    """
    V.instance_of(problems, "problems", dict)
    task = Task("eval", addition_problem, max_new_tokens=max_new_tokens)
    return {g: evaluate(model, tok, task, probs, greedy=True)["accuracy"] for g, probs in problems.items()}


def mix_accuracy(acc: dict, mix: dict) -> float:
    r"""Accuracy on a mix of groups, :math:`\sum_g \mathrm{mix}_g\,\mathrm{acc}_g` (exact given the
    per-group accuracies). Chapter: 19_robust_prompts."""
    V.instance_of(acc, "acc", dict)
    V.instance_of(mix, "mix", dict)
    if set(mix) - set(acc):
        raise ValueError(f"mix names groups {sorted(set(mix) - set(acc))} that acc does not have")
    probs = V.probabilities([mix[g] for g in sorted(mix)], "mix")
    return float(sum(w * acc[g] for w, g in zip(probs, sorted(mix))))


def dro_prompt_weights(rewards: torch.Tensor, group_size: int, groups: Sequence[str], method: str, *,
                       q: dict | None = None, eps: float = 0.5, alpha: float = 0.25) -> torch.Tensor:
    r"""Per-response weights :math:`w` ``[N]`` (mean 1) for a batch of ``N = prompts * group_size`` responses.

    ``rewards`` ``[N]``: the responses of one prompt are consecutive rows; ``groups`` names the group
    of each prompt (``N / group_size`` names). ``method`` as in the module docstring: ``"erm"``
    (ones), ``"group"`` (:math:`w = q_g N/N_g` from the adversary weights ``q`` = ``{group: weight}``;
    a group's weight is shared by the groups present, renormalised), ``"kl"`` (the KL-ball worst case
    over the prompts' success rates, radius :math:`\delta` = ``eps``), ``"cvar"`` (tail share
    :math:`\alpha` = ``alpha``).
    Chapter: 19_robust_prompts.
    """
    V.float_tensor(rewards, "rewards")
    V.int_in(group_size, "group_size")
    V.choice(method, "method", DRO_METHODS)
    N = rewards.shape[0]
    V.divisible(N, "len(rewards)", group_size, "group_size")
    n_prompts = N // group_size
    groups = list(groups)
    if len(groups) != n_prompts:
        raise ValueError(f"groups must name one group per prompt ({n_prompts}), got {len(groups)}")
    if method == "erm":
        return torch.ones_like(rewards)
    if method == "group":
        if q is None:
            raise ValueError("method='group' needs q, the adversary's weights {group: weight}")
        present = sorted(set(groups))
        mass = sum(q[g] for g in present)
        counts = {g: groups.count(g) for g in present}
        w_prompt = torch.tensor([q[g] / mass * n_prompts / counts[g] for g in groups], dtype=rewards.dtype)
    else:
        rate = rewards.detach().view(n_prompts, group_size).mean(1).double()
        res = kl_dro(rate, eps) if method == "kl" else cvar(rate, alpha)
        w_prompt = (res.weights * n_prompts).to(rewards.dtype)
    return w_prompt.to(rewards.device).repeat_interleave(group_size)


class DROWeights(Hook):
    r"""DRO weights on the per-prompt losses: the advantage of prompt :math:`x`'s responses times :math:`w_x`.

    After the group advantages, response :math:`i` of prompt :math:`x` gets the weight
    :math:`w_{x(i)} \ge 0` of :func:`dro_prompt_weights` (mean 1 over the batch) on its advantage. For
    a positive weight PPO-clip is linear in the advantage,
    :math:`\min(\rho\,wA, \mathrm{clip}(\rho)\,wA) = w\min(\rho A, \mathrm{clip}(\rho)A)`, so the update
    minimises the weighted loss :math:`\frac1N\sum_i w_{x(i)}\ell_i`. ``method``:

    * ``"erm"``: :math:`w \equiv 1`;
    * ``"group"``: group DRO. Adversary weights :math:`q` over the groups (uniform over the groups known
      so far, ``groups`` and those seen) take one exponentiated-gradient step per batch on the groups'
      success rates :math:`\hat v_g` (:func:`rlkit.dro.group_dro_step`, step size :math:`\eta` =
      ``step_size``; a group absent from the batch keeps its share),
      :math:`q_g \leftarrow q_g e^{-\eta\hat v_g} / \sum_h q_h e^{-\eta\hat v_h}`, and
      :math:`w_x = q_{g(x)}\,N/N_{g(x)}` (renormalised over the groups present), so the loss is
      :math:`\sum_g q_g \cdot (\text{mean loss of group } g)`;
    * ``"kl"``: the worst case over the batch's prompts in a KL ball of radius :math:`\delta` = ``eps``
      around uniform (:func:`rlkit.dro.kl_dro` on the prompts' success rates :math:`\hat p_x`);
    * ``"cvar"``: the worst ``alpha`` share of the batch's prompts (:func:`rlkit.dro.cvar`).

    The group of a problem is ``problem.info["group"]`` (:func:`group_mixture`). Use it with
    ``RLConfig(algo="dr_grpo")``: GRPO's division by each group's standard deviation would reweight the
    prompts behind DRO's back. Beware a trap of prompt-level weights with binary rewards: a prompt
    whose responses all fail has :math:`\hat p_x = 0`, the largest weight, and zero advantage, so the
    weight is spent on nothing; group weights do not have this problem.

    Logged: ``group_share/<group>``, the share of the batch's prompts from each known group.
    ``result.group_weights``: the adversary's :math:`q` (``{group: weight}``) after each update
    (``"group"``; else empty).

    Args:
        method: one of :data:`DRO_METHODS`.
        step_size: :math:`\eta > 0` of the group adversary (on success rates in [0, 1]).
        eps, alpha: the KL radius :math:`\delta` and the CVaR tail share :math:`\alpha`.
        groups: group names the adversary knows from the start (a group the training mix never shows
            still holds weight), e.g. the held-out groups.

    Chapter: 19_robust_prompts.
    """

    def __init__(self, method: str = "erm", step_size: float = 1.0, eps: float = 0.5, alpha: float = 0.25,
                 groups: Sequence[str] = ()):
        self.method = V.choice(method, "method", DRO_METHODS)
        self.step_size = V.real_in(step_size, "step_size", 0.0, lo_open=True)
        self.eps = V.real_in(eps, "eps", 0.0)
        self.alpha = V.real_in(alpha, "alpha", 0.0, 1.0, lo_open=True)
        self.groups = list(V.tuple_of(groups, "groups", str, "str"))
        self.seen: set = set()
        self.q: dict = {}
        self.group_weights: list = []

    def setup(self, run) -> None:
        self.seen, self.q, self.group_weights = set(), {}, []

    @torch.no_grad()
    def on_advantages(self, run, step) -> None:
        G, b = run.cfg.group_size, step.batch
        try:
            groups = [b.problems[i * G].info["group"] for i in range(len(b.problems) // G)]   # one per prompt
        except KeyError:
            raise ValueError("DROWeights needs problems that carry info['group'] (see group_mixture)") from None
        self.seen.update(groups)
        if self.method == "group":
            self.adversary_step(groups, b.rewards.double().view(-1, G).mean(1))
        w = dro_prompt_weights(b.rewards, G, groups, self.method, q=self.q, eps=self.eps, alpha=self.alpha)
        step.adv = step.adv * w.to(step.adv.device)[:, None]
        for g in sorted(self.seen | set(self.groups)):
            run.log(**{f"group_share/{g}": groups.count(g) / len(groups)})

    def adversary_step(self, groups: list, rates: torch.Tensor) -> None:
        """Group DRO's step on the prompts' success ``rates``: ``q`` (1 for a new group, normalised), tilted."""
        known = sorted(self.seen | set(self.groups))
        q = {g: self.q.get(g, 1.0) for g in known}
        total = sum(q.values())
        q = torch.tensor([q[g] / total for g in known], dtype=torch.float64)
        v = torch.tensor([float(rates[[i for i, h in enumerate(groups) if h == g]].mean()) if g in groups
                          else float("nan") for g in known], dtype=torch.float64)        # NaN: keeps its share
        self.q = {g: float(x) for g, x in zip(known, group_dro_step(q, v, self.step_size))}
        self.group_weights.append(dict(self.q))

    def result(self, run) -> dict:
        return {"group_weights": list(self.group_weights)}


class GroupAccuracy:
    r"""The held-out evaluation of a DRO run: greedy exact match per group, ``{group: accuracy}``.

    ``train(..., evaluation=GroupAccuracy(problems))`` records one list per group in ``result.evals``
    (:func:`group_accuracy` on ``{group: [Problem]}``, with the task's response budget unless
    ``max_new_tokens`` is given). Chapter: 19_robust_prompts.
    """

    def __init__(self, problems: dict, max_new_tokens: int | None = None):
        self.problems = V.instance_of(problems, "problems", dict)
        self.max_new_tokens = None if max_new_tokens is None else V.int_in(max_new_tokens, "max_new_tokens")

    def __call__(self, run) -> dict:
        n = run.task.max_new_tokens if self.max_new_tokens is None else self.max_new_tokens
        return group_accuracy(run.model, run.tok, self.problems, n)


#: What :func:`train_dro` returns (rlkit 0.2's name): an :class:`rlkit.llm.RLResult`.
DROTrainResult = RLResult

#: The RLConfig fields the rlkit 0.2 trainer did not read (and why).
_DRO_UNREAD = {
    "eval_every": "it evaluates every eval_every (its own argument) updates, by default only at the end",
    "eval_problems": "it evaluates on eval_groups",
}


def train_dro(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig, *, method: str = "erm",
              step_size: float = 1.0, eps: float = 0.5, alpha: float = 0.25,
              eval_groups: dict | None = None, eval_every: int | None = None) -> RLResult:
    r"""Dr. GRPO with DRO weights: ``train(..., hooks=[DROWeights(method)], evaluation=GroupAccuracy(eval_groups))``.

    The rlkit 0.2 name of chapter 19's call, kept for one release. ``cfg.algo`` must be
    ``"dr_grpo"`` (no KL term, no critic), and the fields this trainer does not read must keep their
    defaults (``eval_every``, ``eval_problems``).
    ``eval_groups`` (``{group: [Problem]}``) is evaluated before training, every ``eval_every``
    updates (default: only at the end) and after the last, and its groups are known to the
    adversary from the start. Returns an :class:`rlkit.llm.RLResult` with extras ``group_weights``
    and ``method``; ``history["group_share"]`` holds each update's ``{group: share}`` of the groups
    present (rlkit 0.2's form of the ``group_share/<group>`` keys).

    Chapter: 19_robust_prompts.
    """
    V.instance_of(cfg, "cfg", RLConfig)
    V.choice(method, "method", DRO_METHODS)
    if cfg.algo != "dr_grpo":
        raise ValueError(f"train_dro supports cfg.algo='dr_grpo' only, got {cfg.algo!r}")
    refuse_unread(cfg, "train_dro", _DRO_UNREAD)
    every = cfg.steps if eval_every is None else V.int_in(eval_every, "eval_every")
    hook = DROWeights(method, step_size, eps, alpha, groups=sorted(eval_groups) if eval_groups else ())
    res = train(model, tok, task, cfg.replace(eval_every=every), hooks=[hook],
                evaluation=GroupAccuracy(eval_groups) if eval_groups else False)
    shares = {k[len("group_share/"):]: v for k, v in res.history.items() if k.startswith("group_share/")}
    res.history["group_share"] = [{g: xs[i] for g, xs in shares.items() if xs[i] > 0}
                                  for i in range(len(res.history["reward"]))]
    res.extras["method"] = method
    return res
