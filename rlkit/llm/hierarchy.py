r"""Hierarchy on the tiny LLM: a compositional task, options, a skill library, planners, verifiers, retries.

Chapter: 23_plan_act_verify.

**The task.** :data:`THREE_TERM_ADDITION` asks for ``"a+b+c="`` with :math:`a, b, c \in 10..99`. The
shipped model was pretrained on two-term lines only, so the flat model has never seen this prompt
(its answer is almost always empty). Problems are drawn so that *some* pair sums to at most 99:
then a plan exists whose every sub-goal is a two-term sum of two-digit numbers, the one skill the
model has.

**Options and a skill library.** An :class:`Option` is the classic triple
:math:`(\mathcal I, \pi, \beta)` of the options framework: an initiation set :math:`\mathcal I` (here:
every argument is an integer in ``lo..hi``), an intra-option policy :math:`\pi` (the language model
reading the option's prompt, e.g. ``"37+45="``) and a termination condition :math:`\beta` (the model
emits ``<eos>``, or the option's token budget runs out). A :class:`SkillLibrary` maps names to
options. A plan is a list of :class:`SubGoal` objects, each naming an option and its arguments;
an argument is an integer or a reference ``"s0"``, ``"s1"``, ... to the result of an earlier
sub-goal. A *planner* turns a problem into a plan (:func:`left_to_right_planner`,
:func:`smallest_first_planner`); :func:`run_plan` executes plans for a batch of problems, calling
the model once per sub-goal and attempt.

**Verifiers and retries.** A verifier ``v(option, args, value) -> bool`` accepts or rejects a
sub-goal's result. :func:`run_plan` retries a rejected sub-goal up to ``attempts`` times and keeps
the first accepted value (or the last one). The verifiers here never reject a correct value; they
differ in which wrong values they accept: :func:`exact_verifier` none, :func:`mod9_verifier`
(casting out nines) those off by a multiple of 9, :func:`units_verifier` those with the right
units digit, which includes every forgotten carry. With per-attempt probabilities :math:`p` (a
correct value) and :math:`f` (a wrong value the verifier accepts), independent attempts succeed
with probability :func:`retry_success`

.. math::  P_k = \frac{p}{p+f}\,\big(1 - (1-p-f)^k\big), \qquad f = 0:\ P_k = 1 - (1-p)^k .

:func:`verifier_rates` computes :math:`p` and :math:`f` of each prompt exactly, by scoring every
integer answer near the target under the model.

**Training the executor.** :func:`train_executor` runs plans with sampled sub-goal results,
``group_size`` plans per problem, and a policy gradient on every sub-goal's tokens, with either
**sub-goal rewards** (each sub-goal is scored on its own target, given its actual arguments) or
the **final reward** only (every sub-goal of a plan gets the plan's end-to-end reward), and a
leave-one-out baseline per sub-goal index (:func:`~rlkit.llm.turn_advantages`). One update is
:func:`executor_update`; the run around it (optimiser, generators, log, clock, evaluations) is
:func:`rlkit.llm.train`'s :class:`rlkit.llm.trainer.Run`.
"""
from __future__ import annotations

import copy
import math
import random
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .. import _validate as V
from .evaluation import device_of
from .multiturn import turn_advantages
from .sampling import sample, token_logprobs
from .tasks import Problem, Task, exact_match
from .tokenizer import CharTokenizer
from .trainer import Run

__all__ = ["three_term_problem", "THREE_TERM_ADDITION", "parse_terms", "parse_int", "Option", "ADD",
           "SkillLibrary", "SKILLS", "SubGoal", "left_to_right_planner", "smallest_first_planner",
           "exact_verifier", "mod9_verifier", "units_verifier", "VERIFIERS", "PlanResult", "run_plan",
           "response_probabilities", "plan_success_probability", "verifier_rates", "retry_success",
           "HierarchyConfig", "HierarchyResult", "executor_update", "train_executor"]


# ------------------------------------------------------------------------------------------ task

def three_term_problem(rng: random.Random) -> Problem:
    r"""A three-term addition ``"a+b+c="``, :math:`a, b, c \in 10..99`, with some pair summing to <= 99.

    ``info`` holds the terms, whether :math:`a + b \le 99` (the left-to-right plan stays inside
    the two-digit skill), and the number of units carries :math:`\lfloor (a_0 + b_0 + c_0)/10 \rfloor`
    (:math:`x_0` the units digit), which every order of the pairwise sums needs. Chapter: 23_plan_act_verify.
    """
    V.instance_of(rng, "rng", random.Random)
    while True:
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 99)
        if min(a + b, a + c, b + c) <= 99:
            break
    return Problem(f"{a}+{b}+{c}=", str(a + b + c),
                   {"terms": (a, b, c), "left_fits": a + b <= 99, "carries": (a % 10 + b % 10 + c % 10) // 10})


#: Three-term addition, the compositional task of chapter 23 (the flat model never saw it).
THREE_TERM_ADDITION = Task("three_term_addition", three_term_problem, exact_match, max_new_tokens=4,
                           description="a+b+c with two-digit terms; some pair sums to at most 99")

_INT = re.compile(r"(0|[1-9][0-9]*)")


def parse_terms(prompt: str) -> tuple[int, ...]:
    """The integer terms of a prompt ``"a+b+...="``: ``"12+34+56="`` -> ``(12, 34, 56)``.

    Raises ``ValueError`` naming the prompt if it is not of that form. Chapter: 23_plan_act_verify.
    """
    V.instance_of(prompt, "prompt", str)
    body = prompt[:-1] if prompt.endswith("=") else None
    parts = body.split("+") if body else []
    if len(parts) < 2 or not all(_INT.fullmatch(x) for x in parts):
        raise ValueError(f"prompt must look like 'a+b+...=' with non-negative integers, got {prompt!r}")
    return tuple(int(x) for x in parts)


def parse_int(response: str) -> int | None:
    """The value of a response that is a canonical non-negative integer (``"082"`` is not), else None.

    Chapter: 23_plan_act_verify.
    """
    V.instance_of(response, "response", str)
    return int(response) if _INT.fullmatch(response) else None


# --------------------------------------------------------------------------------- options, skills

def _check_template(template: str, arity: int) -> None:
    """Refuse a prompt template that does not use exactly the arguments ``{0}`` .. ``{arity - 1}``."""
    try:
        parts = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"Option.template {template!r} is not a valid format string: {e}") from None
    heads = [f.split(".")[0].split("[")[0] for f in parts]
    if all(h == "" for h in heads):
        used = set(range(len(heads)))                  # "{}" fields are numbered in order
    elif all(h.isdigit() for h in heads):
        used = {int(h) for h in heads}
    else:
        raise ValueError(f"Option.template {template!r} must refer to its arguments by position, {{0}}, {{1}}, "
                         f"... (or all as {{}}), got the fields {parts}")
    if used != set(range(arity)):
        raise ValueError(f"Option.template {template!r} uses the arguments {sorted(used)} but arity={arity}: it must "
                         f"use each of {list(range(arity))} (an option's prompt shows every argument)")
    try:
        template.format(*range(arity))
    except (ValueError, IndexError, KeyError, AttributeError, TypeError) as e:
        raise ValueError(f"Option.template {template!r} cannot format {arity} integer arguments: "
                         f"{type(e).__name__}: {e}") from None


@dataclass(frozen=True)
class Option:
    r"""An option :math:`(\mathcal I, \pi, \beta)` whose policy is the language model reading a prompt.

    Args:
        name: the option's name in a :class:`SkillLibrary`.
        template: the prompt, a format string over the arguments (``"{0}+{1}="``); it must use each of
            ``{0}`` .. ``{arity - 1}`` (or ``arity`` fields ``{}``), checked when the option is built.
        arity: the number of arguments.
        lo, hi: the initiation set :math:`\mathcal I`: every argument an integer in ``lo..hi`` (the
            operands the skill was trained on).
        target: the sub-goal's true result, ``target(args) -> int`` (the sub-goal reward and
            :func:`exact_verifier` use it).
        max_new_tokens: the option's token budget; it terminates (:math:`\beta = 1`) at ``<eos>``
            or when the budget is spent.

    Chapter: 23_plan_act_verify.
    """

    name: str
    template: str
    arity: int
    lo: int
    hi: int
    target: Callable[[tuple], int]
    max_new_tokens: int = 4

    def __post_init__(self):
        V.nonempty_str(self.name, "name")
        V.nonempty_str(self.template, "template")
        V.int_in(self.arity, "arity")
        V.int_in(self.lo, "lo", 0)
        V.int_in(self.hi, "hi", self.lo)
        V.is_callable(self.target, "target")
        V.int_in(self.max_new_tokens, "max_new_tokens")
        _check_template(self.template, self.arity)

    def can_start(self, args: Sequence) -> bool:
        r"""Whether ``args`` lie in the initiation set :math:`\mathcal I` (``arity`` ints in ``lo..hi``)."""
        return (len(args) == self.arity
                and all(isinstance(x, int) and not isinstance(x, bool) and self.lo <= x <= self.hi for x in args))

    def prompt(self, args: Sequence[int]) -> str:
        """The prompt the executor reads for these arguments."""
        return self.template.format(*args)


def _sum(args):
    return sum(args)


#: The two-term addition skill, the shipped model's only skill (operands 10..99, up to 3 digits and <eos>).
ADD = Option("add", "{0}+{1}=", 2, 10, 99, _sum, max_new_tokens=4)


class SkillLibrary:
    """Named :class:`Option` objects a planner may call: ``lib["add"]``, ``"add" in lib``, ``list(lib)``.

    Args:
        options: the options; their names must be distinct.

    Chapter: 23_plan_act_verify.
    """

    def __init__(self, options: Sequence[Option]):
        V.instance_of(options, "options", (list, tuple), "list of Option")
        for i, o in enumerate(options):
            V.instance_of(o, f"options[{i}]", Option)
        names = [o.name for o in options]
        if len(set(names)) != len(names):
            raise ValueError(f"options must have distinct names, got {names}")
        self._options = {o.name: o for o in options}

    def __getitem__(self, name: str) -> Option:
        if name not in self._options:
            raise KeyError(f"no option named {name!r} in the library; it has {sorted(self._options)}")
        return self._options[name]

    def __contains__(self, name) -> bool:
        return name in self._options

    def __iter__(self):
        return iter(self._options)

    def __len__(self) -> int:
        return len(self._options)

    def __repr__(self) -> str:
        return f"SkillLibrary({sorted(self._options)})"


#: The library of chapter 23, with one skill, :data:`ADD`.
SKILLS = SkillLibrary([ADD])


@dataclass(frozen=True)
class SubGoal:
    """One step of a plan: the option to call and its arguments (ints, or ``"s<j>"`` = result of sub-goal j).

    Chapter: 23_plan_act_verify.
    """

    option: str
    args: tuple

    def bind(self, results: Sequence[int | None]) -> tuple:
        """The arguments with references replaced by earlier results (None where a result is missing)."""
        out = []
        for a in self.args:
            if isinstance(a, str):
                if not (a.startswith("s") and a[1:].isdigit()):
                    raise ValueError(f"sub-goal argument {a!r} must be an int or a reference 's<j>' to the result "
                                     f"of sub-goal j")
                j = int(a[1:])
                if j >= len(results):
                    raise ValueError(f"sub-goal argument {a!r} refers to a result not computed yet "
                                     f"({len(results)} sub-goals done)")
                out.append(results[j])
            else:
                out.append(a)
        return tuple(out)


def left_to_right_planner(problem: Problem) -> list[SubGoal]:
    r"""Fold the terms in the order written: :math:`((t_1 + t_2) + t_3) + \dots` with the ``add`` option.

    Chapter: 23_plan_act_verify.
    """
    terms = parse_terms(V.instance_of(problem, "problem", Problem).prompt)
    plan = [SubGoal("add", (terms[0], terms[1]))]
    for j, t in enumerate(terms[2:]):
        plan.append(SubGoal("add", (f"s{j}", t)))
    return plan


def smallest_first_planner(problem: Problem) -> list[SubGoal]:
    r"""Add the two smallest terms first, then fold in the others in increasing order.

    Sorting needs comparisons only, no addition. For three terms it keeps the first partial sum
    inside the skill's initiation set (:math:`\le 99`) whenever any order does, because the two
    smallest terms have the smallest pairwise sum. Chapter: 23_plan_act_verify.
    """
    terms = sorted(parse_terms(V.instance_of(problem, "problem", Problem).prompt))
    return left_to_right_planner(Problem("+".join(map(str, terms)) + "=", problem.answer, problem.info))


# -------------------------------------------------------------------------------------- verifiers

def exact_verifier(option: Option, args: tuple, value: int | None) -> bool:
    """Accept exactly the correct result (an oracle, like chapter 15's checker). Chapter: 23_plan_act_verify."""
    return value is not None and value == option.target(args)


def mod9_verifier(option: Option, args: tuple, value: int | None) -> bool:
    r"""Casting out nines: accept when :math:`v \equiv \mathrm{target} \pmod 9`.

    For a sum the check needs only digit sums (:math:`x \equiv` the sum of its digits mod 9). It
    accepts every correct value and every value off by a multiple of 9; a forgotten carry (off by
    10) is caught. Chapter: 23_plan_act_verify.
    """
    return value is not None and (value - option.target(args)) % 9 == 0


def units_verifier(option: Option, args: tuple, value: int | None) -> bool:
    r"""Accept when the units digit is right, :math:`v \equiv \mathrm{target} \pmod{10}`.

    A verifier that is itself wrong: the forgotten-carry answer has the right units digit, so it
    passes exactly the errors the tiny model makes most. Chapter: 23_plan_act_verify.
    """
    return value is not None and (value - option.target(args)) % 10 == 0


#: The verifiers by name.
VERIFIERS = {"exact": exact_verifier, "mod9": mod9_verifier, "units": units_verifier}


# ------------------------------------------------------------------------------------- execution

@dataclass
class PlanResult:
    r"""What :func:`run_plan` did for a batch of ``B`` problems with plans of ``J`` sub-goals.

    * ``correct`` ``[B]`` float 0/1: the final value is the problem's answer.
    * ``step_correct`` ``[B, J]`` float 0/1: sub-goal :math:`j`'s value is its own target *given the
      arguments it actually received* (0 where it could not start).
    * ``started`` ``[B, J]`` bool: sub-goal :math:`j`'s bound arguments were in its option's
      initiation set (a missing or out-of-range earlier result stops the plan there).
    * ``attempts`` ``[B, J]`` long: calls of the executor (0 where not started).
    * ``accepted`` ``[B, J]`` bool: the verifier accepted the kept value (True without a verifier).
    * ``values``: ``B`` lists of ``J`` results (int, or None); ``answers``: the final values as strings
      (``""`` where there is none); ``plans``: the plans.
    * ``steps``: when recorded (``record=True``, one attempt), per sub-goal the dict
      ``{"rows", "prompt_ids", "prompt_mask", "response_ids", "mask"}`` of the executor's call
      (``rows`` ``[n_j]`` long: which problems started it).

    Chapter: 23_plan_act_verify.
    """

    correct: torch.Tensor
    step_correct: torch.Tensor
    started: torch.Tensor
    attempts: torch.Tensor
    accepted: torch.Tensor
    values: list
    answers: list
    plans: list
    steps: list = field(default_factory=list)

    def __len__(self) -> int:
        return self.correct.shape[0]

    @property
    def accuracy(self) -> float:
        """The end-to-end accuracy, mean of ``correct`` (NaN for an empty batch)."""
        return self.correct.mean().item() if len(self) else float("nan")


@torch.no_grad()
def run_plan(model, tok: CharTokenizer, problems: Sequence[Problem], planner: Callable[[Problem], list],
             library: SkillLibrary = SKILLS, *, verifier: Callable | None = None, attempts: int = 1,
             greedy: bool = False, temperature: float = 1.0, generator: torch.Generator | None = None,
             record: bool = False) -> PlanResult:
    r"""Plan, act, verify: execute each problem's plan sub-goal by sub-goal with the model as executor.

    For sub-goal :math:`j` the arguments are bound to earlier results; a problem whose bound
    arguments fall outside the option's initiation set stops there (the option cannot start). The
    executor answers the option's prompt (sampled at ``temperature``, or greedily); the response is
    parsed as an integer (:func:`parse_int`). With a ``verifier``, a rejected value is retried, up to
    ``attempts`` calls in all, each a fresh sample; the first accepted value is kept, else the last.
    Sub-goals of all problems are batched: one :func:`rlkit.llm.sample` call per sub-goal and attempt.

    Args:
        model: the executor (the protocol of :mod:`rlkit.llm.model`); tok: its tokenizer.
        problems: a list of problems (may be empty). planner: ``problem -> list[SubGoal]``; every
            plan of the batch must have the same length.
        library: the :class:`SkillLibrary` the plans name options from.
        verifier: ``v(option, args, value) -> bool`` (see :data:`VERIFIERS`) or None (accept all).
        attempts: calls per sub-goal, an int >= 1; more than 1 needs a verifier.
        greedy, temperature, generator: as in :func:`rlkit.llm.sample`. Greedy retries repeat the
            same answer, so they cannot help (the chapter measures it).
        record: keep the executor's tokens per sub-goal (``PlanResult.steps``), for training;
            needs ``attempts == 1``.

    Returns:
        a :class:`PlanResult`. Chapter: 23_plan_act_verify.
    """
    _check_run_plan_args(tok, problems, planner, library, verifier, attempts, greedy, temperature, record)
    dev = device_of(model)
    plans, J = _make_plans(problems, planner, library)
    B = len(problems)
    flags = {k: torch.zeros(B, J, dtype=torch.bool) for k in ("started", "accepted")}
    out = PlanResult(correct=torch.zeros(B), step_correct=torch.zeros(B, J), **flags,
                     attempts=torch.zeros(B, J, dtype=torch.long), values=[[] for _ in range(B)], answers=[],
                     plans=plans, steps=[])
    call = {"greedy": greedy, "temperature": temperature, "generator": generator}
    for j in range(J):
        opts = [library[plans[i][j].option] for i in range(B)]
        args = [plans[i][j].bind(out.values[i]) for i in range(B)]
        rows = [i for i in range(B) if opts[i].can_start(args[i])]
        kept = _attempt_subgoal(model, tok, out, j, opts, args, rows, verifier, attempts, call, record)
        if record and not rows:
            out.steps.append({"rows": torch.zeros(0, dtype=torch.long, device=dev)})
        _keep_results(out, j, opts, args, kept)
    out.answers = ["" if not vals or vals[-1] is None else str(vals[-1]) for vals in out.values]
    correct = torch.tensor([float(a == p.answer) for a, p in zip(out.answers, problems)])
    for k, x in (("correct", correct), ("step_correct", out.step_correct), ("started", out.started),
                 ("attempts", out.attempts), ("accepted", out.accepted)):
        setattr(out, k, x.to(dev))
    return out


def _check_run_plan_args(tok, problems, planner, library, verifier, attempts, greedy, temperature, record) -> None:
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(problems, "problems", (list, tuple), "list of Problem")
    for i, p in enumerate(problems):
        V.instance_of(p, f"problems[{i}]", Problem)
    V.is_callable(planner, "planner")
    V.instance_of(library, "library", SkillLibrary)
    if verifier is not None:
        V.is_callable(verifier, "verifier")
    V.int_in(attempts, "attempts")
    if attempts > 1 and verifier is None:
        raise ValueError(f"attempts={attempts} needs a verifier: without one the first answer is always kept")
    V.instance_of(greedy, "greedy", bool)
    V.real_in(temperature, "temperature", 0.0, lo_open=True)
    V.instance_of(record, "record", bool)
    if record and attempts != 1:
        raise ValueError(f"record=True keeps one call per sub-goal; got attempts={attempts}")


def _make_plans(problems, planner, library) -> tuple[list, int]:
    """Each problem's plan, checked (sub-goals of the library, one length ``J`` for the batch): ``(plans, J)``."""
    plans = [planner(p) for p in problems]
    for i, pl in enumerate(plans):
        V.instance_of(pl, f"the plan of problems[{i}]", list, "list of SubGoal")
        for sg in pl:
            V.instance_of(sg, f"a sub-goal of the plan of problems[{i}]", SubGoal)
            if sg.option not in library:
                raise ValueError(f"planner: the plan of problems[{i}] calls the option {sg.option!r}, which is not "
                                 f"in the library; it has {sorted(library)}")
    J = len(plans[0]) if plans else 0
    if any(len(pl) != J for pl in plans):
        raise ValueError(f"every plan of a batch must have the same number of sub-goals; got lengths "
                         f"{sorted({len(pl) for pl in plans})}")
    return plans, J


def _attempt_subgoal(model, tok, out: PlanResult, j: int, opts, args, rows, verifier, attempts: int, call: dict,
                     record: bool) -> dict:
    """Sub-goal ``j`` of the problems ``rows``: up to ``attempts`` batched executor calls, retrying what the
    verifier rejects. Counts the calls and acceptances in ``out``; returns ``{row: kept value}``."""
    kept = {i: None for i in rows}
    pending = list(rows)
    for _ in range(attempts):
        if not pending:
            break
        budget = max(opts[i].max_new_tokens for i in pending)
        ids, att = tok.encode_batch([opts[i].prompt(args[i]) for i in pending], device=device_of(model))
        ro = sample(model, ids, att, max_new_tokens=budget, eos_id=tok.eos_id, pad_id=tok.pad_id, **call)
        texts = tok.decode_batch(ro.response_ids.cpu())
        if record:
            out.steps.append({"rows": torch.tensor(pending, dtype=torch.long, device=ids.device), "prompt_ids": ids,
                              "prompt_mask": att, "response_ids": ro.response_ids, "mask": ro.mask})
        still = []
        for r, i in enumerate(pending):
            kept[i] = v = parse_int(texts[r])
            out.attempts[i, j] += 1
            ok = True if verifier is None else bool(verifier(opts[i], args[i], v))
            out.accepted[i, j] = ok
            if not ok:
                still.append(i)
        pending = still
    return kept


def _keep_results(out: PlanResult, j: int, opts, args, kept: dict) -> None:
    """Append sub-goal ``j``'s kept values to ``out.values`` (None where it did not start) and score them."""
    for i, vals in enumerate(out.values):
        v = kept.get(i)
        vals.append(v)
        if i in kept:
            out.started[i, j] = True
            out.step_correct[i, j] = float(v is not None and v == opts[i].target(args[i]))


# ------------------------------------------------------------------------------ exact probabilities

@torch.no_grad()
def response_probabilities(model, tok: CharTokenizer, prompts: Sequence[str], responses: Sequence[str], *,
                           temperature: float = 1.0, batch_size: int = 4096) -> torch.Tensor:
    r"""Exact :math:`\pi(y\,\langle\mathrm{eos}\rangle \mid x)` of each (prompt, response) pair, by teacher forcing.

    Args:
        model: the protocol of :mod:`rlkit.llm.model`; tok: its tokenizer.
        prompts, responses: lists of equal length (responses without ``<eos>``; it is appended).
        temperature: the sampling temperature :math:`\tau` of :math:`\pi` (no top-k/top-p), > 0.
        batch_size: pairs per forward pass, >= 1.

    Returns:
        ``[N]`` float64 probabilities (``[0]`` for empty lists). Chapter: 23_plan_act_verify.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    V.str_list(prompts, "prompts")
    V.str_list(responses, "responses")
    V.same_length(prompts, "prompts", responses, "responses")
    V.int_in(batch_size, "batch_size")
    dev = device_of(model)
    out = []
    for s in range(0, len(prompts), batch_size):
        ids, att = tok.encode_batch(list(prompts[s:s + batch_size]), device=dev)
        enc = [tok.encode(r) + [tok.eos_id] for r in responses[s:s + batch_size]]
        T = max(map(len, enc))
        resp = torch.full((len(enc), T), tok.pad_id, dtype=torch.long)
        mask = torch.zeros(len(enc), T)
        for i, e in enumerate(enc):
            resp[i, :len(e)] = torch.tensor(e)
            mask[i, :len(e)] = 1.0
        lp = token_logprobs(model, ids, att, resp.to(dev), mask.to(dev), temperature=temperature)
        out.append(lp.double().sum(-1).exp().cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def plan_success_probability(model, tok: CharTokenizer, problems: Sequence[Problem],
                             planner: Callable[[Problem], list], library: SkillLibrary = SKILLS, *,
                             temperature: float = 1.0) -> torch.Tensor:
    r"""Exact per-problem, per-sub-goal probabilities :math:`p_j(x)` that a sampled executor hits sub-goal :math:`j`.

    Sub-goal :math:`j` is scored with the *correct* earlier results bound into its arguments, so

    .. math::  p_j(x) = \pi\big(y_j^\star \mid \mathrm{prompt}_j(x, y_1^\star, \dots, y_{j-1}^\star)\big),
               \qquad \Pr(\text{every sub-goal right} \mid x) = \prod_j p_j(x),

    the product because the executor samples each call independently given its prompt. The
    end-to-end success is this product plus the (tiny) chance that wrong sub-goals cancel out.
    A sub-goal whose arguments leave its option's initiation set gets :math:`p_j = 0`.

    Args:
        model, tok: the executor. problems: a list of problems. planner, library: as in :func:`run_plan`.
        temperature: the sampling temperature :math:`\tau` (no top-k/top-p), > 0.

    Returns:
        ``[B, J]`` float64. Chapter: 23_plan_act_verify.
    """
    V.instance_of(problems, "problems", (list, tuple), "list of Problem")
    V.is_callable(planner, "planner")
    V.instance_of(library, "library", SkillLibrary)
    tau = V.real_in(temperature, "temperature", 0.0, lo_open=True)
    plans = [planner(V.instance_of(p, f"problems[{i}]", Problem)) for i, p in enumerate(problems)]
    J = len(plans[0]) if plans else 0
    if any(len(pl) != J for pl in plans):
        raise ValueError("every plan of a batch must have the same number of sub-goals")
    out = torch.zeros(len(problems), J, dtype=torch.float64)
    results = [[] for _ in problems]
    for j in range(J):
        rows, prompts, answers = [], [], []
        for i, pl in enumerate(plans):
            opt = library[pl[j].option]
            a = pl[j].bind(results[i])
            if opt.can_start(a):
                rows.append(i)
                prompts.append(opt.prompt(a))
                answers.append(str(opt.target(a)))
            results[i].append(opt.target(a) if None not in a else None)
        if rows:
            out[rows, j] = response_probabilities(model, tok, prompts, answers, temperature=tau)
    return out


def verifier_rates(model, tok: CharTokenizer, option: Option, args: Sequence[tuple], verifier: Callable, *,
                   window: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Exact per-prompt probabilities :math:`p` (correct value) and :math:`f` (wrong value the verifier accepts).

    With :math:`y^\star` the target and :math:`\mathcal A` the values the verifier accepts,

    .. math::

        p = \pi(y^\star \mid x), \qquad
        f = \sum_{v \in \mathcal A,\ v \ne y^\star,\ |v - y^\star| \le w} \pi(v \mid x),

    each term the exact probability of the canonical integer answer :math:`v` (its digits, then
    ``<eos>``, by teacher forcing). Values further than the window :math:`w` from the target are left
    out, so :math:`f` is a lower bound; the tiny model's wrong sums are off by 10 (a forgotten carry)
    or a few units, far inside the default window. Cost: one sequence per candidate value.

    Args:
        model, tok: the executor. option: the :class:`Option`. args: one argument tuple per prompt.
        verifier: ``v(option, args, value) -> bool``. window: :math:`w`, an int >= 0.

    Returns:
        ``(p, f)``, each ``[len(args)]`` float64. Chapter: 23_plan_act_verify.
    """
    V.instance_of(option, "option", Option)
    V.instance_of(args, "args", (list, tuple), "list of argument tuples")
    V.is_callable(verifier, "verifier")
    V.int_in(window, "window", 0)
    prompts, resp, owner, is_target = [], [], [], []
    for i, a in enumerate(args):
        a = tuple(a)
        t = option.target(a)
        for v in range(max(0, t - window), t + window + 1):
            if v == t or verifier(option, a, v):
                prompts.append(option.prompt(a))
                resp.append(str(v))
                owner.append(i)
                is_target.append(v == t)
    probs = response_probabilities(model, tok, prompts, resp)
    owner_t = torch.tensor(owner, dtype=torch.long)
    tgt = torch.tensor(is_target, dtype=torch.bool)
    p = torch.zeros(len(args), dtype=torch.float64).index_add_(0, owner_t[tgt], probs[tgt])
    f = torch.zeros(len(args), dtype=torch.float64).index_add_(0, owner_t[~tgt], probs[~tgt])
    return p, f


def retry_success(p, k, f=None) -> torch.Tensor:
    r"""Probability that ``k`` verified attempts end with a correct value, per problem (independent attempts).

    Each attempt is correct with probability :math:`p`, wrong-but-accepted with :math:`f`, and
    rejected otherwise; the verifier never rejects a correct value. The loop stops at the first
    accepted value, so

    .. math::  P_k = \sum_{j=1}^{k} (1-p-f)^{j-1}\,p = \frac{p}{p+f}\,\big(1-(1-p-f)^k\big),

    which is :math:`1-(1-p)^k` for an exact verifier (:math:`f=0`) and tends to :math:`p/(p+f)`,
    not 1, as :math:`k \to \infty` (0 where :math:`p + f = 0`). Over problems with different
    :math:`p_i`, the mean of :math:`P_k(p_i)` is below :math:`P_k(\bar p)` (:math:`P_k` is concave
    in :math:`p`), so a pooled accuracy overstates what retries buy.

    Args:
        p: ``[...]`` per-attempt success probabilities in [0, 1] (tensor or number).
        k: attempts, an int >= 1.
        f: like ``p`` (same shape), or None (an exact verifier); ``p + f <= 1``.

    Returns:
        ``[...]`` float tensor of :math:`P_k`. Chapter: 23_plan_act_verify.
    """
    p = torch.as_tensor(p, dtype=torch.float64) if not isinstance(p, torch.Tensor) else p
    V.tensor_in(p, "p", 0.0, 1.0)
    V.int_in(k, "k")
    if f is None:
        return 1 - (1 - p) ** k
    f = torch.as_tensor(f, dtype=p.dtype) if not isinstance(f, torch.Tensor) else f
    V.tensor_in(f, "f", 0.0, 1.0)
    if f.shape != p.shape:
        raise ValueError(f"f must have the shape of p {tuple(p.shape)}, got {tuple(f.shape)}")
    s = p + f
    if bool((s > 1 + 1e-9).any()):
        raise ValueError(f"p + f must be <= 1 (they are probabilities of disjoint events), got max {s.max().item()}")
    stop = 1 - (1 - s.clamp(max=1)) ** k
    return torch.where(s > 0, p / s.clamp_min(1e-300) * stop, torch.zeros_like(p))


# ------------------------------------------------------------------------------------- training

@dataclass(frozen=True)
class HierarchyConfig(V.ValidatedConfig):
    """Settings of :func:`train_executor`, checked when built (``cfg.replace(...)`` gives a checked copy).

    ``reward``: ``"subgoal"`` (each sub-goal scored on its own target) or ``"final"`` (every sub-goal
    gets the plan's end-to-end reward). ``steps``, ``prompts_per_step``, ``group_size`` (>= 2),
    ``eval_every``: ints >= 1; ``lr``, ``temperature``, ``grad_clip``: > 0 (``grad_clip=None``: no
    clipping); ``seed`` >= 0. Chapter: 23_plan_act_verify.
    """

    reward: str = V.choice_field("subgoal", ("subgoal", "final"))
    steps: int = V.int_field(40)
    prompts_per_step: int = V.int_field(8)
    group_size: int = V.int_field(8, 2)
    lr: float = V.number_field(1e-4, 0.0, lo_open=True)
    temperature: float = V.number_field(1.0, 0.0, lo_open=True)
    grad_clip: float | None = V.number_field(1.0, 0.0, lo_open=True, optional=True)
    eval_every: int = V.int_field(10)
    seed: int = V.int_field(0, 0)


@dataclass
class HierarchyResult:
    """What :func:`train_executor` logged.

    ``history[key]``: one entry per update: ``reward`` (mean reward used, over sub-goals taken),
    ``final`` (end-to-end accuracy of the sampled plans), ``step1``, ``step2``, ... (sub-goal
    accuracies of the sampled plans), ``loss`` and ``grad_norm`` (before clipping) of the update,
    ``train_seconds`` (cumulative). ``evals``: ``step``, ``train_seconds``,
    ``greedy_accuracy`` (end-to-end, greedy) and ``success_probability`` (the exact probability that a
    sampled plan gets every sub-goal right, :func:`plan_success_probability`, averaged over the
    evaluation problems), before the first update,
    every ``eval_every`` updates and after the last. Chapter: 23_plan_act_verify.
    """

    history: dict
    evals: dict
    config: HierarchyConfig


def executor_update(run, planner: Callable[[Problem], list], library: SkillLibrary = SKILLS):
    r"""One update of :func:`train_executor` on the shared run ``run`` (a :class:`rlkit.llm.trainer.Run`).

    Samples ``prompts_per_step`` training problems of ``run.task`` (with ``run.rng``), runs
    ``group_size`` sampled plans of each (:func:`run_plan`, no verifier, noise from ``run.gen``),
    and sets the return of sub-goal :math:`j` of plan :math:`i`

    .. math::  G_{i,j} = \mathbb 1[\text{sub-goal } j \text{ of } i \text{ hit its target}] \ \ (\texttt{"subgoal"}),
               \qquad G_{i,j} = \mathbb 1[\text{plan } i \text{ answered the problem}] \ \ (\texttt{"final"}),

    then :math:`\hat A_{i,j} = G_{i,j} -` the mean :math:`G` of the *other* plans of the same
    problem that started sub-goal :math:`j` (:func:`~rlkit.llm.turn_advantages`, ``"loo"``).
    The loss is the policy gradient over every executor token,

    .. math::

        \mathcal L = -\frac{1}{N\,T}\sum_{i,j} \hat A_{i,j} \sum_t \log \pi_\theta(y_{i,j,t} \mid x_{i,j}, y_{i,j,<t}),

    with :math:`N` the number of sub-goal calls and :math:`T` the option's token budget, and one Adam
    step is taken on it (``run.optimise``: gradient clipped to ``grad_clip``; no step when no
    sub-goal started). Both rewards have the same maximiser (every sub-goal right makes the plan
    right), but the final reward blames a right sub-goal for a wrong one elsewhere in its plan.

    Returns:
        ``(plans, G [B, J], started [B, J] float, loss, grad_norm)``: the :class:`PlanResult`, the
        returns, which sub-goals started, the loss and the gradient norm before clipping (NaN
        without a step). Chapter: 23_plan_act_verify.
    """
    cfg, model = run.cfg, run.model
    base = run.task.problems(cfg.prompts_per_step, seed=run.rng, split="train")
    probs = [copy.copy(p) for p in base for _ in range(cfg.group_size)]
    model.eval()
    res = run_plan(model, run.tok, probs, planner, library, temperature=cfg.temperature, generator=run.gen,
                   record=True)
    J = res.step_correct.shape[1]
    mask = res.started.float()
    G = res.step_correct if cfg.reward == "subgoal" else res.correct[:, None].expand(-1, J) * mask
    adv = turn_advantages(G, mask, cfg.group_size, "loo")
    model.train()
    n_calls = mask.sum().clamp_min(1.0)
    loss = 0.0
    for j, st in enumerate(res.steps):
        if st["rows"].numel() == 0:
            continue
        lp = token_logprobs(model, st["prompt_ids"], st["prompt_mask"], st["response_ids"], st["mask"],
                            temperature=cfg.temperature)
        T = max(library[res.plans[0][j].option].max_new_tokens, 1)
        loss = loss - (adv[st["rows"], j][:, None] * lp * st["mask"]).sum() / (n_calls * T)
    stepped = isinstance(loss, torch.Tensor)
    norm = run.optimise(loss) if stepped else math.nan
    model.eval()
    return res, G, mask, loss.item() if stepped else math.nan, norm


def _plan_metrics(model, tok, problems, planner, library, temperature) -> dict:
    return {"greedy_accuracy": run_plan(model, tok, problems, planner, library, greedy=True).accuracy,
            "success_probability": plan_success_probability(model, tok, problems, planner, library,
                                                            temperature=temperature).prod(-1).mean().item()}


def _subgoal_metrics(res: PlanResult, G: torch.Tensor, mask: torch.Tensor) -> dict:
    out = {"reward": ((G * mask).sum() / mask.sum().clamp_min(1.0)).item(), "final": res.accuracy}
    for j in range(mask.shape[1]):
        taken = mask[:, j] > 0
        out[f"step{j + 1}"] = res.step_correct[taken, j].mean().item() if bool(taken.any()) else math.nan
    return out


def train_executor(model, tok: CharTokenizer, task: Task, planner: Callable[[Problem], list],
                   config: HierarchyConfig | None = None, *, library: SkillLibrary = SKILLS,
                   eval_problems: Sequence[Problem] | None = None) -> HierarchyResult:
    r"""Train the executor (in place) inside the hierarchy, with sub-goal rewards or the final reward only.

    ``steps`` times :func:`executor_update`, in :func:`rlkit.llm.train`'s run shell
    (:class:`rlkit.llm.trainer.Run`): Adam at ``lr``, the problems' ``random.Random`` and the plans'
    generator seeded ``seed``, the history, the clock, and the evaluation on ``eval_problems``
    (greedy end-to-end accuracy and the exact probability that a sampled plan gets every sub-goal
    right) before the first update, every ``eval_every`` updates and after the last.

    Args:
        model: the executor, updated in place. tok: its tokenizer. task: the compositional
            :class:`~rlkit.llm.Task` (training split). planner: as in :func:`run_plan`.
        config: a :class:`HierarchyConfig`. library: the :class:`SkillLibrary`.
        eval_problems: problems for the evaluations (default: 256 from the test split, seed
            ``10_000 + seed``).

    Returns:
        a :class:`HierarchyResult`. Chapter: 23_plan_act_verify.
    """
    cfg = HierarchyConfig() if config is None else V.instance_of(config, "config", HierarchyConfig)
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(task, "task", Task)
    V.is_callable(planner, "planner")
    if eval_problems is None:
        eval_problems = task.problems(256, seed=10_000 + cfg.seed, split="test")
    eval_problems = list(eval_problems)
    run = Run(model, tok, task, cfg, evaluation=lambda run: _plan_metrics(run.model, tok, eval_problems, planner,
                                                                          library, cfg.temperature))
    run.evaluate(0)
    for k in range(cfg.steps):
        run.start_update(k)                     # the clock
        res, G, mask, loss, norm = executor_update(run, planner, library)
        run.stop_clock()
        run.log(**_subgoal_metrics(res, G, mask), loss=loss, grad_norm=norm, train_seconds=run.train_time)
        run.end_update()
        run.end_step(k, False, None)
    model.eval()
    return HierarchyResult(history=run.history, evals=run.evals, config=cfg)
