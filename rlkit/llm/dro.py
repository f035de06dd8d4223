r"""Robustness over prompt groups for the tiny LLM: skewed training mixes and DRO-weighted updates.

Chapter: 19_robust_prompts.

**Groups of prompts.** :data:`ADDITION_GROUPS` splits two-digit addition into prompts that need a
carry (about 45% of all prompts, the ones the pretraining corpus mostly got wrong) and prompts that
do not. :func:`group_mixture` builds a :class:`~rlkit.llm.Task` that draws a group with given
probabilities, then a prompt of that group, and records the group in ``Problem.info["group"]``;
the held-out split is the usual hash of the prompt, so pretraining never saw the test prompts.

**DRO weights on per-prompt losses.** :func:`train_dro` is the Dr. GRPO trainer of
:func:`rlkit.llm.train` (same sampling, advantages :math:`r_i - \bar r_g`, PPO-clip loss,
``seq-mean-token-sum-norm``) with one change: response :math:`i` of prompt :math:`x` gets a weight
:math:`w_x \ge 0` with :math:`\frac1N\sum_i w_{x(i)} = 1`, applied by scaling its advantage. For a
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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from .. import _validate as V
from ..dro import cvar, group_dro_step, kl_dro
from ..utils import clip_grad
from .evaluation import evaluate
from .rl import RLConfig, _train_args, collect, policy_loss, sequence_advantages
from .sampling import token_logprobs
from .tasks import Problem, Task, addition_problem
from .tokenizer import CharTokenizer

__all__ = ["ADDITION_GROUPS", "DRO_METHODS", "group_problem", "group_mixture", "group_problems",
           "group_accuracy", "mix_accuracy", "dro_prompt_weights", "DROTrainResult", "train_dro"]

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
        groups: ``{name: generator(rng) -> Problem}`` (e.g. :data:`ADDITION_GROUPS`).
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
        p.info["group"] = g
        return p

    desc = ", ".join(f"{g} {mix[g]:.0%}" for g in names)
    return Task(name, generate, max_new_tokens=max_new_tokens, description=f"group mixture: {desc}")


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


@dataclass
class DROTrainResult:
    """What :func:`train_dro` returns: the model, per-step logs, group weights over time, evaluations."""

    model: nn.Module
    history: dict          # per step: reward, carry_share (share of batch prompts per group: see group_share)
    group_weights: list    # adversary weights {group: q} after each step ("group" method; else [])
    evals: dict            # {"step": [...], group: [greedy accuracy ...]}
    config: RLConfig
    method: str


def train_dro(model: nn.Module, tok: CharTokenizer, task: Task, cfg: RLConfig, *, method: str = "erm",
              step_size: float = 1.0, eps: float = 0.5, alpha: float = 0.25,
              eval_groups: dict | None = None, eval_every: int | None = None) -> DROTrainResult:
    r"""Dr. GRPO on ``task`` with DRO weights on the per-prompt losses (the module docstring).

    Args:
        model: the LM (trained in place). tok: its tokenizer.
        task: a task whose problems carry ``info["group"]`` (:func:`group_mixture`).
        cfg: an :class:`~rlkit.llm.RLConfig` with ``algo="dr_grpo"`` (the only one supported here,
            so that per-group std normalisation does not reweight prompts behind DRO's back) and
            ``kl_coef == 0``.
        method: one of :data:`DRO_METHODS`.
        step_size: :math:`\eta` of the group-DRO adversary (on success rates in [0, 1]).
        eps, alpha: the KL radius :math:`\delta` and the CVaR tail share :math:`\alpha` of the
            prompt-level methods.
        eval_groups: ``{group: [Problem]}`` held-out sets for :func:`group_accuracy`, measured
            before training, every ``eval_every`` steps (default: only at the end) and after the last.

    Returns:
        :class:`DROTrainResult`. Chapter: 19_robust_prompts.
    """
    cfg = _train_args(tok, task, cfg)
    V.choice(method, "method", DRO_METHODS)
    if cfg.algo != "dr_grpo":
        raise ValueError(f"train_dro supports cfg.algo='dr_grpo' only, got {cfg.algo!r}")
    if cfg.kl_coef > 0:
        raise ValueError("train_dro has no KL term: use cfg.kl_coef=0")
    step_size = V.real_in(step_size, "step_size", 0.0, lo_open=True)
    params = list(model.parameters())
    dev = params[0].device
    rng, gen = random.Random(cfg.seed), torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(params, lr=cfg.lr)
    G = cfg.group_size
    names = sorted(eval_groups) if eval_groups else []
    q: dict = {}
    hist = {"reward": [], "train_seconds": [], "group_share": []}
    weights_log: list = []
    evals: dict = {"step": [], **{g: [] for g in names}}
    every = cfg.steps if eval_every is None else V.int_in(eval_every, "eval_every")

    def run_eval(step):
        if not eval_groups:
            return
        acc = group_accuracy(model, tok, eval_groups, task.max_new_tokens)
        evals["step"].append(step)
        for g in names:
            evals[g].append(acc[g])

    run_eval(0)
    t_train = 0.0
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        model.eval()
        batch = collect(model, tok, task, cfg, rng, gen, dev)
        ro, mask = batch.rollout, batch.rollout.mask
        N = mask.shape[0]
        groups = [batch.problems[i * G].info["group"] for i in range(N // G)]
        for g in groups:
            q.setdefault(g, None)
        if method == "group":
            known = sorted(set(q) | set(names))
            for g in known:
                if q.get(g) is None:
                    q[g] = 1.0
            total = sum(q[g] for g in known)
            qt = torch.tensor([q[g] / total for g in known], dtype=torch.float64)
            r = batch.rewards.double().view(-1, G).mean(1)
            vals = torch.tensor([float(r[[i for i, h in enumerate(groups) if h == g]].mean())
                                 if g in groups else float("nan") for g in known], dtype=torch.float64)
            qt = group_dro_step(qt, vals, step_size)
            q = {g: float(x) for g, x in zip(known, qt)}
            weights_log.append(dict(q))
        with torch.no_grad():
            old = ro.model_logprobs if cfg.temperature == 1.0 else token_logprobs(
                model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, mask, temperature=cfg.temperature)
            adv = sequence_advantages(batch.rewards.to(dev), cfg.algo, G)
            w = dro_prompt_weights(batch.rewards, G, groups, method, q=q, eps=eps, alpha=alpha).to(dev)
            adv_tok = (adv * w)[:, None].expand_as(mask) * mask
        model.train()
        n_groups = N // G
        for _ in range(cfg.epochs):
            order = torch.randperm(n_groups, generator=gen)
            for chunk in order.chunk(min(cfg.minibatches, max(1, n_groups))):
                rows = (chunk[:, None] * G + torch.arange(G)).flatten().to(dev)
                m = mask[rows]
                logp = token_logprobs(model, ro.prompt_ids[rows], ro.prompt_mask[rows], ro.response_ids[rows], m,
                                      temperature=cfg.temperature)
                loss, _ = policy_loss(cfg, logp, old[rows], adv_tok[rows], m)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                clip_grad(params, cfg.grad_clip)
                opt.step()
        model.eval()
        t_train += time.perf_counter() - t0
        hist["reward"].append(batch.rewards.mean().item())
        hist["train_seconds"].append(t_train)
        hist["group_share"].append({g: groups.count(g) / len(groups) for g in set(groups)})
        if (step + 1) % every == 0 and step + 1 != cfg.steps:
            run_eval(step + 1)
    run_eval(cfg.steps)
    for k in hist:
        hist[k] = hist[k] if k == "group_share" else list(np.asarray(hist[k], dtype=float))
    return DROTrainResult(model, hist, weights_log, evals, cfg, method)
