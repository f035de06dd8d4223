r"""Turns as steps: a multi-turn retry task, a multi-turn rollout, per-turn returns and a trainer.

Chapter: 15_turns_as_steps.

**The task.** :class:`RetryTask` wraps a single-turn :class:`~rlkit.llm.Task` (by default
:data:`~rlkit.llm.tasks.ADDITION`). The model answers; if the answer is wrong the checker replies with a
feedback string (default ``"x"``) appended to the conversation, and the model answers again, up to
``max_turns`` :math:`U` turns. The episode ends at the first correct answer or after :math:`U`
turns. A conversation is one token sequence::

    37+45=72<eos>x72<eos>x82<eos>          (turn 1 wrong, turn 2 wrong, turn 3 right)

The model's tokens are the answers and their ``<eos>`` (the model ends its own turn); the prompt
and the feedback are the environment's. Turn :math:`u` (0-based in the code) earns :math:`r_u = 1` if it is correct.

**The turn-level MDP.** State :math:`s_u` = the conversation before turn :math:`u`, action
:math:`a_u` = the whole turn (a string of tokens), reward :math:`r_u`, and a discount
:math:`\gamma` per *turn*: the return of turn :math:`u` is

.. math::  G_u = \sum_{j=u}^{N-1} \gamma^{\,j-u} r_j = r_u + \gamma\,G_{u+1}, \qquad G_N = 0,

with :math:`N \le U` the number of turns taken (:func:`~rlkit.llm.turn_returns`). The same numbers come
from rlkit's token-level :func:`~rlkit.returns.discounted_returns` when the per-step discount is
:math:`\gamma` at a turn's last token and 1 inside a turn (:func:`~rlkit.llm.token_discounts`).

**The trainer.** :func:`~rlkit.llm.train_multiturn` is a turn-level policy gradient with a group baseline:
``group_size`` conversations per prompt, and for each turn index :math:`u` the advantage
:math:`\hat A_{i,u} = G_{i,u} - b_{i,u}` (:func:`~rlkit.llm.turn_advantages`), times the state weight
:math:`\gamma^{u}` (0-based :math:`u`), is applied to every token of turn :math:`u` of conversation
:math:`i` (:func:`rlkit.objectives.policy_gradient_loss`). With the weight the expected update is the
gradient of :math:`J_\gamma = \mathbb E[G_0]` (the policy-gradient theorem for a discounted objective
weights the score of step :math:`u` by :math:`\gamma^{u}`); without it (``turn_weighting="none"``) it is
the common "discounted return-to-go, undiscounted states" update, which for :math:`\gamma < 1` is the
gradient of no objective (Nota & Thomas 2020). One update is :func:`turn_update`, its loss
:func:`turn_loss`; the run around it (optimiser, generators, log, clock, evaluations) is
:func:`rlkit.llm.train`'s :class:`rlkit.llm.trainer.Run`.

**The warm start.** The shipped model reads only ``a+b=`` at positions 0..5 (its position
embeddings beyond the first line were never trained), so :func:`~rlkit.llm.retry_warm_start` fine-tunes it
briefly on conversations written the way the pretraining corpus writes answers: every attempt is
drawn independently from the corpus distribution (the carry forgotten in 80% of carry problems),
so the warm start teaches the *format* and keeps the bug at every turn; it does not teach the
model to use the feedback.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import _validate as V
from ..objectives import AGGREGATIONS, aggregate
from ..returns import discounted_returns
from .evaluation import device_of
from .sampling import call_model, sample
from .tasks import ADDITION, Problem, Task, forgot_carry_answer
from .tokenizer import DEFAULT_CHARS, CharTokenizer
from .trainer import Run

__all__ = ["RetryTask", "RETRY_ADDITION", "MultiTurnRollout", "rollout_turns", "episode_layout",
           "turn_logprobs", "turn_returns", "token_discounts", "turn_advantages", "well_formed", "multiturn_metrics",
           "MultiTurnConfig", "MultiTurnResult", "turn_loss", "turn_update", "train_multiturn", "retry_warm_start",
           "retry_corpus"]


# ------------------------------------------------------------------------------------------ task

class RetryTask:
    r"""A single-turn task played for up to ``max_turns`` turns with a feedback string after each miss.

    Args:
        base: the single-turn :class:`~rlkit.llm.Task` (its generator, checker, response budget).
        max_turns: :math:`U`, an int >= 1 (``max_turns=1`` is the single-turn task).
        feedback: the checker's reply after a wrong answer, a non-empty string in the
            tokenizer's vocabulary ``chars`` (no newline); checked when the task is built.
        chars: the characters of the tokenizer the task will be played with (default
            ``rlkit.llm.tokenizer.DEFAULT_CHARS``, the shipped tokenizer's; give ``tok.chars``
            for another :class:`~rlkit.llm.CharTokenizer`).

    The longest conversation has ``len(prompt) + K * base.max_new_tokens + (K - 1) * len(feedback)``
    tokens (:meth:`max_length`), which must fit the model's block. Chapter: 15_turns_as_steps.
    """

    def __init__(self, base: Task = ADDITION, max_turns: int = 3, feedback: str = "x", name: str | None = None,
                 *, chars: str = DEFAULT_CHARS):
        self.base = V.instance_of(base, "base", Task)
        self.max_turns = V.int_in(max_turns, "max_turns")
        self.feedback = V.nonempty_str(feedback, "feedback")
        if "\n" in feedback:
            raise ValueError(f"feedback must not contain a newline (it is how <eos> is written), got {feedback!r}")
        V.nonempty_str(chars, "chars")
        unknown = sorted(set(feedback) - set(chars))
        if unknown:
            raise ValueError(f"feedback {feedback!r} has characters {unknown} that are not in the tokenizer's "
                             f"vocabulary chars={chars!r}; the model could not read them")
        self.name = V.nonempty_str(name or f"retry_{base.name}_{max_turns}", "name")

    def __repr__(self) -> str:
        return f"RetryTask({self.base.name!r}, max_turns={self.max_turns}, feedback={self.feedback!r})"

    def problems(self, n: int, seed: int | random.Random = 0, split: str = "train") -> list[Problem]:
        """``n`` problems of the base task (see :meth:`rlkit.llm.Task.problems`)."""
        return self.base.problems(n, seed, split)

    def check(self, response: str, problem: Problem) -> float:
        """The reward of one turn: the base task's true checker (a finite number, else ``ValueError``)."""
        r = float(self.base.check(response, problem))
        if not math.isfinite(r):
            raise ValueError(f"task {self.base.name!r}'s checker returned the reward {r} for the response "
                             f"{response!r} to {problem.prompt!r}; rewards must be finite")
        return r

    def max_length(self, prompt_len: int) -> int:
        """Tokens in the longest conversation for a prompt of ``prompt_len`` tokens."""
        return prompt_len + self.max_turns * self.base.max_new_tokens + (self.max_turns - 1) * len(self.feedback)


#: Two-digit addition with up to 3 tries and the feedback "x" after a wrong answer (chapter 15).
RETRY_ADDITION = RetryTask(ADDITION, max_turns=3, feedback="x", name="retry_addition")


# ------------------------------------------------------------------------------------- rollout

@dataclass
class MultiTurnRollout:
    r"""A batch of conversations, each one token row (``L`` = the longest conversation).

    * ``ids`` ``[B, L]`` long, LEFT-padded with ``pad_id``; ``attention_mask`` ``[B, L]`` bool.
    * ``action_mask`` ``[B, L]`` float 0/1: 1 at the model's tokens (answers and their ``<eos>``),
      0 at the prompt, the feedback and the padding.
    * ``turn_index`` ``[B, L]`` long: the turn :math:`u` (0-based) of each model token, -1 elsewhere.
    * ``turn_end`` ``[B, L]`` bool: True at the last model token of each turn (a turn boundary).
    * ``logprobs`` ``[B, L]``: behaviour :math:`\log q(y_t)` of each model token under the
      distribution sampled from (0 for greedy decoding and at non-model tokens).
    * ``turn_rewards`` ``[B, K]`` float: :math:`r_u`, 0 for turns not taken;
      ``turn_mask`` ``[B, K]`` float 0/1: turn :math:`u` was taken.
    * ``num_turns`` ``[B]`` long :math:`N`; ``solved`` ``[B]`` bool (some turn was right).
    * ``responses``: the answers as strings, one list per conversation;
      ``problems``: the problems; ``prompt_len`` ``[B]`` long.
    """

    ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    turn_index: torch.Tensor
    turn_end: torch.Tensor
    logprobs: torch.Tensor
    turn_rewards: torch.Tensor
    turn_mask: torch.Tensor
    num_turns: torch.Tensor
    solved: torch.Tensor
    responses: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    prompt_len: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def first_correct(self) -> torch.Tensor:
        """``[B]`` float: the first attempt was right (:math:`r_0`)."""
        return self.turn_rewards[:, 0] if self.turn_rewards.shape[1] else torch.zeros(len(self))


def episode_layout(segments: Sequence[tuple[Sequence[int], int]], pad_id: int = 0, device=None) -> dict:
    r"""Lay out conversations given as token segments into left-padded ``[B, L]`` tensors.

    Each conversation is a list of ``(tokens, turn)`` segments in order, with ``turn = -1`` for the
    environment's tokens (prompt, feedback) and ``turn = k`` for the model's tokens of turn
    :math:`u`. This is the one place where masks are built, used by :func:`rollout_turns` and
    :func:`retry_warm_start`.

    Args:
        segments: a list (one entry per conversation) of lists of ``(token list, turn int)``.
        pad_id: the padding id. device: where the tensors go.

    Returns:
        ``{"ids", "attention_mask", "action_mask", "turn_index", "turn_end"}`` as in
        :class:`MultiTurnRollout`. Chapter: 15_turns_as_steps.
    """
    V.instance_of(segments, "segments", (list, tuple), "list of conversations")
    rows = []
    for i, conv in enumerate(segments):
        V.instance_of(conv, f"segments[{i}]", (list, tuple), "list of (tokens, turn) pairs")
        toks, turns, ends = [], [], []
        for j, seg in enumerate(conv):
            if not (isinstance(seg, (tuple, list)) and len(seg) == 2):
                raise TypeError(f"segments[{i}][{j}] must be a (tokens, turn) pair, got {seg!r}")
            t, k = seg
            k = V.int_in(k, f"segments[{i}][{j}] turn", -1, 10 ** 6)
            t = [int(x) for x in t]
            toks += t
            turns += [k] * len(t)
            ends += [False] * len(t)
            if k >= 0 and t:
                ends[-1] = True
        if not toks:
            raise ValueError(f"segments[{i}] has no tokens: a conversation needs a prompt")
        rows.append((toks, turns, ends))
    B = len(rows)
    L = max((len(r[0]) for r in rows), default=0)
    ids = torch.full((B, L), pad_id, dtype=torch.long)
    turn = torch.full((B, L), -1, dtype=torch.long)
    end = torch.zeros((B, L), dtype=torch.bool)
    att = torch.zeros((B, L), dtype=torch.bool)
    for i, (t, k, e) in enumerate(rows):
        n = len(t)
        ids[i, L - n:] = torch.tensor(t, dtype=torch.long)
        turn[i, L - n:] = torch.tensor(k, dtype=torch.long)
        end[i, L - n:] = torch.tensor(e, dtype=torch.bool)
        att[i, L - n:] = True
    out = {"ids": ids, "attention_mask": att, "action_mask": (turn >= 0).float(), "turn_index": turn,
           "turn_end": end}
    return {k: v.to(device) for k, v in out.items()} if device is not None else out


@torch.no_grad()
def rollout_turns(model, tok: CharTokenizer, task: RetryTask, problems: Sequence[Problem], *,
                  temperature: float = 1.0, greedy: bool = False,
                  generator: torch.Generator | None = None) -> MultiTurnRollout:
    r"""Play each problem as a conversation of up to :math:`U` turns; record masks, rewards, log-probs.

    Turn :math:`u` samples an answer :math:`a_u \sim q(\cdot \mid s_u)` with :func:`rlkit.llm.sample`
    (the model reads the whole conversation :math:`s_u`), scores it with the task's checker,
    and, if it is wrong and :math:`u < U - 1`, appends the feedback tokens. A conversation stops
    at its first correct answer. Only the conversations still running are sampled at each turn.

    Args:
        model: follows the protocol of :mod:`rlkit.llm.model`; tok: its tokenizer.
        task: a :class:`RetryTask`; problems: a list of problems (may be empty).
        temperature, greedy, generator: as in :func:`rlkit.llm.sample`.

    Returns:
        a :class:`MultiTurnRollout` (``K = task.max_turns`` columns of turn tensors).
        Chapter: 15_turns_as_steps.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(task, "task", RetryTask)
    V.instance_of(problems, "problems", (list, tuple), "list of Problem")
    for i, p in enumerate(problems):
        V.instance_of(p, f"problems[{i}]", Problem)
    V.real_in(temperature, "temperature", 0.0, lo_open=True)
    V.instance_of(greedy, "greedy", bool)
    dev = device_of(model)
    K, B = task.max_turns, len(problems)
    prompts = [tok.encode(p.prompt) for p in problems]
    for i, pr in enumerate(prompts):
        if not pr:
            raise ValueError(f"problems[{i}] has an empty prompt")
    block = getattr(getattr(model, "config", None), "block_size", None)
    if block is not None and prompts:
        V.fits(task.max_length(max(map(len, prompts))), "the longest conversation of this task", block,
               "the model's block_size")
    fb = tok.encode(task.feedback)
    segs = [[(pr, -1)] for pr in prompts]
    lqs = [[] for _ in range(B)]
    ctx = [list(pr) for pr in prompts]
    rewards = torch.zeros(B, K)
    tmask = torch.zeros(B, K)
    responses = [[] for _ in range(B)]
    active = list(range(B))
    for k in range(K):
        if not active:
            break
        width = max(len(ctx[i]) for i in active)
        ids = torch.full((len(active), width), tok.pad_id, dtype=torch.long)
        att = torch.zeros((len(active), width), dtype=torch.bool)
        for r, i in enumerate(active):
            ids[r, width - len(ctx[i]):] = torch.tensor(ctx[i])
            att[r, width - len(ctx[i]):] = True
        ro = sample(model, ids.to(dev), att.to(dev), max_new_tokens=task.base.max_new_tokens, eos_id=tok.eos_id,
                    pad_id=tok.pad_id, temperature=temperature, greedy=greedy, generator=generator)
        resp, m, lq = ro.response_ids.cpu(), ro.mask.cpu().bool(), ro.logprobs.cpu()
        still = []
        for r, i in enumerate(active):
            t = resp[r][m[r]].tolist()
            text = tok.decode(t)
            rew = task.check(text, problems[i])
            responses[i].append(text)
            rewards[i, k], tmask[i, k] = rew, 1.0
            segs[i].append((t, k))
            lqs[i] += lq[r][m[r]].tolist()
            ctx[i] += t
            if rew <= 0 and k < K - 1:
                segs[i].append((fb, -1))
                ctx[i] += fb
                still.append(i)
        active = still
    lay = episode_layout(segs, tok.pad_id)
    logprobs = torch.zeros(lay["ids"].shape)
    for i in range(B):
        pos = lay["action_mask"][i].nonzero().squeeze(-1)
        logprobs[i, pos] = torch.tensor(lqs[i], dtype=torch.float32)
    num = tmask.sum(-1).long()
    return MultiTurnRollout(**{k: v.to(dev) for k, v in lay.items()}, logprobs=logprobs.to(dev),
                            turn_rewards=rewards.to(dev), turn_mask=tmask.to(dev), num_turns=num.to(dev),
                            solved=(rewards.sum(-1) > 0).to(dev), responses=responses, problems=list(problems),
                            prompt_len=torch.tensor([len(p) for p in prompts], dtype=torch.long, device=dev))


def turn_logprobs(model, rollout: MultiTurnRollout, *, temperature: float = 1.0, with_entropy: bool = False):
    r"""Differentiable :math:`\log q_\theta(y_t \mid y_{<t})` of the model's tokens, one forward pass.

    The model reads the whole conversation ``rollout.ids``; the logits at position :math:`t-1`
    score token :math:`t`. Non-model tokens (prompt, feedback, padding) get 0, in the values and
    the gradients (their logits are replaced by zeros first). With the sampling temperature this
    equals the behaviour log-probs ``rollout.logprobs`` recorded turn by turn (a test checks it).

    Args:
        model: follows the protocol of :mod:`rlkit.llm.model`.
        rollout: a :class:`MultiTurnRollout`.
        temperature: :math:`\tau > 0`. with_entropy: also return per-token entropies.

    Returns:
        ``logprobs [B, L]`` or ``(logprobs, entropy)``. Chapter: 15_turns_as_steps.
    """
    V.instance_of(rollout, "rollout", MultiTurnRollout)
    V.real_in(temperature, "temperature", 0.0, lo_open=True)
    ids, att, am = rollout.ids, rollout.attention_mask, rollout.action_mask.bool()
    B, L = ids.shape
    zero = torch.zeros(B, L, device=ids.device)
    if B == 0 or L < 2:
        return (zero, zero.clone()) if with_entropy else zero
    logits = call_model(model, ids, att)[:, :-1]
    real = am[:, 1:]
    logits = logits.masked_fill(~real[..., None], 0.0)
    logq = F.log_softmax(logits.float() / temperature, dim=-1)
    lp = torch.where(real, logq.gather(-1, ids[:, 1:, None]).squeeze(-1), 0.0)
    lp = torch.cat([zero[:, :1], lp], dim=1)
    if not with_entropy:
        return lp
    ent = -(logq.exp() * logq).sum(-1)
    ent = torch.cat([zero[:, :1], torch.where(real, ent, 0.0)], dim=1)
    return lp, ent


# ------------------------------------------------------------------------------- returns

def turn_returns(turn_rewards: torch.Tensor, turn_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    r"""Per-turn discounted returns :math:`G_u = r_u + \gamma\,G_{u+1}` within the turns taken.

    .. math::  G_u = \sum_{j=u}^{N-1} \gamma^{\,j-u}\, r_j, \qquad u < N,

    and 0 for turns not taken. Computed with :func:`rlkit.returns.discounted_returns` and the
    per-turn discounts :math:`\gamma_u = \gamma\, m_{u+1}` (0 after the last turn taken).

    Args:
        turn_rewards: ``[B, K]`` float, :math:`r_u`.
        turn_mask: ``[B, K]`` 0/1 (or bool), 1 for turns taken; the taken turns must be a prefix.
        gamma: the per-turn discount, a number in ``[0, 1]``.

    Returns:
        ``[B, K]`` returns (empty for ``B = 0`` or ``K = 0``; rewards of untaken turns, even NaN,
        are ignored). Chapter: 15_turns_as_steps.
    """
    V.float_tensor(turn_rewards, "turn_rewards", min_dim=2)
    if turn_rewards.dim() != 2:
        raise ValueError(f"turn_rewards must be [B, K], got shape {tuple(turn_rewards.shape)}")
    m = V.check_mask(turn_mask, turn_rewards, "turn_rewards", "turn_mask").to(turn_rewards.dtype)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
    if m.numel() and bool((m[:, 1:] > m[:, :-1]).any()):
        raise ValueError("turn_mask: the turns taken must be a prefix of each row (a 1 after a 0 found)")
    r = torch.where(m > 0, turn_rewards, torch.zeros((), dtype=turn_rewards.dtype))
    disc = gamma * torch.cat([m[:, 1:], torch.zeros_like(m[:, :1])], dim=1)
    return discounted_returns(r, disc, 0.0) * m


def token_discounts(rollout: MultiTurnRollout, gamma: float, per: str = "turn") -> tuple[torch.Tensor, torch.Tensor]:
    r"""Token-level rewards and discounts of a conversation, for :func:`rlkit.returns.discounted_returns`.

    The reward :math:`r_u` sits on the last token of turn :math:`u`. With ``per="turn"`` the
    per-step discount is :math:`\gamma` at a turn's last token, 1 at every other token, and 0 at
    the conversation's last token, so every token of turn :math:`u` gets the turn return
    :math:`G_u` of :func:`turn_returns`. With ``per="token"`` it is :math:`\gamma` at *every* model
    token (the token-level discount), which makes a return depend on how many tokens follow:
    a length penalty, not a turn penalty. Environment tokens (prompt, feedback, padding) have
    discount 1 and reward 0 either way: they pass the return through.

    Args:
        rollout: a :class:`MultiTurnRollout`. gamma: a number in ``[0, 1]``. per: "turn" or "token".

    Returns:
        ``(rewards [B, L], discounts [B, L])``. Chapter: 15_turns_as_steps.
    """
    V.instance_of(rollout, "rollout", MultiTurnRollout)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
    V.choice(per, "per", ("turn", "token"))
    am, end, k = rollout.action_mask > 0, rollout.turn_end, rollout.turn_index
    B, L = am.shape
    rew = torch.zeros(B, L, device=am.device)
    if B and L:
        kk = k.clamp_min(0)
        rk = rollout.turn_rewards.gather(1, kk) if rollout.turn_rewards.shape[1] else torch.zeros_like(rew)
        rew = torch.where(end, rk, rew)
    disc = torch.ones(B, L, device=am.device)
    disc = torch.where(end if per == "turn" else am, torch.full_like(disc, gamma), disc)
    last_turn = (rollout.num_turns - 1).view(B, 1)
    disc = torch.where(end & (k == last_turn), torch.zeros_like(disc), disc)
    return rew, disc


def turn_advantages(returns: torch.Tensor, turn_mask: torch.Tensor, group_size: int,
                    baseline: str = "loo") -> torch.Tensor:
    r"""Turn-level advantages with a group baseline per turn index.

    The ``group_size`` :math:`m` consecutive rows are conversations of one prompt. For turn
    :math:`u` of conversation :math:`i`, with :math:`S_u` the conversations of its group that took
    turn :math:`u`:

    * ``"loo"`` (leave-one-out, RLOO's baseline per turn):
      :math:`\hat A_{i,u} = G_{i,u} - \frac{1}{|S_u|-1}\sum_{j\in S_u, j\ne i} G_{j,u}` (the baseline
      is 0 when :math:`i` is alone in :math:`S_u`); it does not depend on :math:`i`'s own actions,
      so the gradient stays unbiased;
    * ``"mean"`` (Dr. GRPO's): :math:`G_{i,u} - \frac{1}{|S_u|}\sum_{j\in S_u} G_{j,u}`;
    * ``"none"``: :math:`G_{i,u}` (REINFORCE).

    Conversations that stopped before turn :math:`u` are not in :math:`S_u` (a missing turn is not a
    turn with return 0), and their advantage there is 0.

    Args:
        returns: ``[B, K]`` float, :math:`G_{i,u}` (from :func:`turn_returns`).
        turn_mask: ``[B, K]`` 0/1 or bool. group_size: :math:`m \ge 1`, dividing ``B``.
        baseline: "loo", "mean" or "none".

    Returns:
        ``[B, K]`` advantages, 0 at turns not taken. Chapter: 15_turns_as_steps.
    """
    V.float_tensor(returns, "returns", min_dim=2)
    if returns.dim() != 2:
        raise ValueError(f"returns must be [B, K], got shape {tuple(returns.shape)}")
    m = V.check_mask(turn_mask, returns, "returns", "turn_mask").to(returns.dtype)
    V.int_in(group_size, "group_size")
    V.choice(baseline, "baseline", ("loo", "mean", "none"))
    B, K = returns.shape
    if B % group_size:
        raise ValueError(f"group_size ({group_size}) must divide the number of rows of returns ({B})")
    G = torch.where(m > 0, returns, torch.zeros((), dtype=returns.dtype))
    if baseline == "none":
        return G * m
    g, mg = G.view(-1, group_size, K), m.view(-1, group_size, K)
    tot, cnt = g.sum(1, keepdim=True), mg.sum(1, keepdim=True)
    if baseline == "mean":
        b = tot / cnt.clamp_min(1.0)
    else:
        others = (cnt - mg).clamp_min(1.0)
        b = torch.where(cnt - mg > 0, (tot - g) / others, torch.zeros((), dtype=returns.dtype))
    return ((g - b) * mg).view(B, K)


def well_formed(rollout: MultiTurnRollout) -> torch.Tensor:
    r"""``[B, K]`` float 0/1: turn :math:`u`'s answer is 1 to 3 digits (a format check; 0 for turns not taken).

    Chapter: 15_turns_as_steps.
    """
    V.instance_of(rollout, "rollout", MultiTurnRollout)
    K = rollout.turn_mask.shape[1]
    out = torch.zeros(len(rollout), K)
    for i, answers in enumerate(rollout.responses):
        for k, a in enumerate(answers[:K]):
            out[i, k] = float(a.isdigit() and 1 <= len(a) <= 3)
    return out.to(rollout.turn_mask.device)


def multiturn_metrics(rollout: MultiTurnRollout) -> dict:
    r"""Summary numbers of a batch of conversations.

    ``first_attempt`` (share right at turn 1), ``solved`` (right within :math:`U` turns),
    ``mean_turns`` (:math:`\bar N`), ``retry_accuracy`` (share right at turn 2 among those that got
    there; NaN if none did), ``repeat_rate`` (share of second answers equal to the first, among
    those that got there; NaN if none did). Chapter: 15_turns_as_steps.
    """
    V.instance_of(rollout, "rollout", MultiTurnRollout)
    n = len(rollout)
    if n == 0:
        nan = float("nan")
        return {"first_attempt": nan, "solved": nan, "mean_turns": nan, "retry_accuracy": nan, "repeat_rate": nan}
    tr, tm = rollout.turn_rewards.float().cpu(), rollout.turn_mask.float().cpu()
    out = {"first_attempt": tr[:, 0].mean().item(), "solved": rollout.solved.float().mean().item(),
           "mean_turns": rollout.num_turns.float().mean().item()}
    if tr.shape[1] > 1 and tm[:, 1].sum() > 0:
        out["retry_accuracy"] = (tr[:, 1] * tm[:, 1]).sum().item() / tm[:, 1].sum().item()
        second = [r for r in rollout.responses if len(r) > 1]
        out["repeat_rate"] = sum(r[0] == r[1] for r in second) / len(second)
    else:
        out["retry_accuracy"] = out["repeat_rate"] = float("nan")
    return out


# ------------------------------------------------------------------------------- trainer

@dataclass(frozen=True)
class MultiTurnConfig(V.ValidatedConfig):
    r"""Settings of :func:`train_multiturn`, checked when built (frozen; ``cfg.replace(...)`` is a checked copy).

    ``gamma`` is the per-turn discount :math:`\gamma \in [0, 1]`; ``baseline`` one of
    :func:`turn_advantages`'s; ``aggregation`` one of :data:`rlkit.objectives.AGGREGATIONS`
    (the normaliser of ``seq-mean-token-sum-norm`` is the longest possible conversation's model
    tokens, :math:`U \cdot` ``max_new_tokens``). ``steps``, ``prompts_per_step``, ``group_size``,
    ``eval_every``, ``eval_problems`` are ints >= 1; ``lr``, ``temperature`` > 0.
    ``format_bonus`` :math:`c \ge 0` adds a dense per-turn reward :math:`c` to every well-formed
    answer (digits only, 1 to 3 of them), a "format check" reward of the kind the article suggests
    for RAG; it is not potential-based, so it changes what is optimal (chapter 15 shows how).
    ``turn_weighting`` is ``"discount"`` (default: turn :math:`u`'s advantage is multiplied by
    :math:`\gamma^{u}`, 0-based, so the expected update is :math:`\nabla J_\gamma`) or ``"none"`` (no
    weight: the update of rlkit before issue 22, which for :math:`\gamma < 1` is not the gradient of
    :math:`J_\gamma`; kept to reproduce recorded runs and to compare). At :math:`\gamma = 1` the two agree.
    """

    gamma: float = V.number_field(1.0, 0.0, 1.0)
    steps: int = V.int_field(40)
    prompts_per_step: int = V.int_field(16)
    group_size: int = V.int_field(8)
    lr: float = V.number_field(3e-4, 0.0, lo_open=True)
    temperature: float = V.number_field(1.0, 0.0, lo_open=True)
    baseline: str = V.choice_field("loo", ("loo", "mean", "none"))
    format_bonus: float = V.number_field(0.0, 0.0)
    aggregation: str = V.choice_field("seq-mean-token-sum-norm", AGGREGATIONS)
    grad_clip: float | None = V.number_field(1.0, 0.0, lo_open=True, optional=True)
    eval_every: int = V.int_field(10)
    eval_problems: int = V.int_field(256)
    seed: int = V.int_field(0, 0)
    turn_weighting: str = V.choice_field("discount", ("discount", "none"))


@dataclass
class MultiTurnResult:
    """What :func:`train_multiturn` returns: the trained ``model``, per-step ``history`` (lists of
    floats: ``first_attempt``, ``solved``, ``mean_turns``, ``retry_accuracy``, ``repeat_rate`` of
    the sampled training conversations, ``push`` = the mean turn-1 advantage of the conversations
    whose first answer was right, ``loss``, ``grad_norm`` (before clipping), ``train_seconds``) and
    held-out greedy ``evals`` (``step``, ``train_seconds`` and the :func:`multiturn_metrics` keys,
    before the first update, every ``eval_every`` and after the last)."""

    model: torch.nn.Module
    config: MultiTurnConfig
    history: dict = field(default_factory=dict)
    evals: dict = field(default_factory=dict)


def _greedy_metrics(model, tok, task, problems) -> dict:
    was = model.training
    model.eval()
    try:
        return multiturn_metrics(rollout_turns(model, tok, task, problems, greedy=True))
    finally:
        model.train(was)


def turn_loss(model, rollout: MultiTurnRollout, cfg: MultiTurnConfig, task: RetryTask):
    r"""The loss of one update of :func:`~rlkit.llm.train_multiturn` on a batch of conversations.

    Adds the format bonus :math:`c` to every well-formed turn, computes :math:`G_{i,u}`
    (:func:`~rlkit.llm.turn_returns`) and :math:`\hat A_{i,u}` (:func:`~rlkit.llm.turn_advantages`), weights
    turn :math:`u` (0-based) by :math:`w_u = \gamma^{u}` (``cfg.turn_weighting="discount"``; :math:`w_u = 1`
    with ``"none"``), puts :math:`w_u \hat A_{i,u}` on every token of turn :math:`u` and returns

    .. math::

        \mathcal L(\theta) = -\,\mathrm{agg}_{i,t}\big(w_{u(t)}\,\hat A_{i,u(t)}
        \,\log \pi_\theta(y_{i,t}\mid y_{i,<t})\big)

    over the model's tokens only (:func:`rlkit.objectives.policy_gradient_loss`'s surrogate; one
    on-policy step per batch, so no ratio is needed). ``seq-mean-token-sum-norm`` divides by the
    longest possible conversation's model tokens, :math:`U \cdot` ``max_new_tokens``, a constant, so with
    the ``"loo"`` or ``"none"`` baseline :math:`\mathbb E[-\nabla\mathcal L] = \nabla J_\gamma / (U \cdot`
    ``max_new_tokens``) exactly (``tests/test_ch15_gradient.py`` checks it on an enumerable problem).

    Args:
        model: the policy (the protocol of :mod:`rlkit.llm.model`); rollout: a :class:`MultiTurnRollout`
            of ``group_size``-row groups sampled from it; cfg: a :class:`MultiTurnConfig`; task: the
            :class:`RetryTask` it was played on.

    Returns:
        ``(loss, advantages [B, U])``: the differentiable loss and the weighted advantages
        :math:`w_u \hat A_{i,u}`. Chapter: 15_turns_as_steps.
    """
    V.instance_of(rollout, "rollout", MultiTurnRollout)
    V.instance_of(cfg, "cfg", MultiTurnConfig)
    V.instance_of(task, "task", RetryTask)
    ro = rollout
    rew = ro.turn_rewards
    if cfg.format_bonus > 0:
        rew = rew + cfg.format_bonus * well_formed(ro) * ro.turn_mask
    G = turn_returns(rew, ro.turn_mask, cfg.gamma)
    A = turn_advantages(G, ro.turn_mask, cfg.group_size, cfg.baseline)
    if cfg.turn_weighting == "discount" and cfg.gamma < 1.0:
        u = torch.arange(A.shape[1], device=A.device, dtype=A.dtype)
        A = A * torch.pow(torch.tensor(cfg.gamma, dtype=A.dtype, device=A.device), u)   # 0 ** 0 = 1
    adv_tok = torch.where(ro.turn_index >= 0, A.gather(1, ro.turn_index.clamp_min(0)), 0.0)
    logp = turn_logprobs(model, ro, temperature=cfg.temperature)
    kw = {"max_len": task.max_turns * task.base.max_new_tokens} if cfg.aggregation == "seq-mean-token-sum-norm" else {}
    return aggregate(-adv_tok.detach() * logp, ro.action_mask, cfg.aggregation, **kw), A


def turn_update(run, task: RetryTask):
    r"""One update of :func:`~rlkit.llm.train_multiturn` on the shared run ``run`` (a :class:`rlkit.llm.trainer.Run`).

    Draws ``prompts_per_step`` training prompts with ``run.rng``, plays ``group_size`` conversations
    of each (:func:`~rlkit.llm.rollout_turns` at ``temperature``, noise from ``run.gen``) and takes one
    Adam step (``run.optimise``: gradient clipped to ``grad_clip``) on :func:`turn_loss`.

    Returns:
        ``(rollout, advantages [B, U], loss, grad_norm)``: the conversations, the weighted advantages
        :math:`\gamma^{u}\hat A` (:math:`\hat A` with ``turn_weighting="none"``), the loss (a float) and
        the gradient norm before clipping. Chapter: 15_turns_as_steps.
    """
    cfg, model = run.cfg, run.model
    base = task.problems(cfg.prompts_per_step, run.rng, split="train")
    probs = [p for p in base for _ in range(cfg.group_size)]
    model.eval()
    ro = rollout_turns(model, run.tok, task, probs, temperature=cfg.temperature, generator=run.gen)
    model.train()
    loss, A = turn_loss(model, ro, cfg, task)
    norm = run.optimise(loss)
    return ro, A, loss.item(), norm


def train_multiturn(model, tok: CharTokenizer, task: RetryTask, config: MultiTurnConfig | None = None,
                    *, eval_set: Sequence[Problem] | None = None) -> MultiTurnResult:
    r"""Turn-level policy gradient with a per-turn discount and a group baseline, one update at a time.

    Each update is :func:`~rlkit.llm.multiturn.turn_update` (the conversations, the returns, one step);
    its expected direction is :math:`\nabla J_\gamma`, :math:`J_\gamma = \mathbb E[G_0]` (with the default
    ``turn_weighting="discount"``; see :func:`~rlkit.llm.multiturn.turn_loss`).

    The run shell is :func:`rlkit.llm.train`'s (:class:`rlkit.llm.trainer.Run`): Adam at ``lr``, the
    prompts' ``random.Random`` and the rollouts' generator seeded ``seed`` (on the GPU when the
    model is there), the history, the clock, and the greedy held-out evaluation
    (:func:`multiturn_metrics` of :func:`rollout_turns`) before the first update, every
    ``eval_every`` updates and after the last. The model is trained in place (pass a copy to keep it).

    Args:
        model: a :class:`~rlkit.llm.GPT` (or any model of the protocol); tok: its tokenizer.
        task: a :class:`RetryTask`. config: a :class:`MultiTurnConfig` (default settings if None).
        eval_set: held-out problems for the greedy evaluations (default: ``eval_problems`` from the
            test split, seed 1234; with ``eval_set`` given, ``eval_problems`` must keep its default).

    Returns:
        a :class:`MultiTurnResult`. Chapter: 15_turns_as_steps.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    V.instance_of(task, "task", RetryTask)
    cfg = V.instance_of(MultiTurnConfig() if config is None else config, "config", MultiTurnConfig)
    if eval_set is not None and cfg.eval_problems != MultiTurnConfig.eval_problems:
        raise ValueError(f"MultiTurnConfig.eval_problems={cfg.eval_problems} is ignored when eval_set is given "
                         f"({len(eval_set)} problems); leave it at its default or pass eval_set=None")
    evals_on = list(eval_set) if eval_set is not None else task.problems(cfg.eval_problems, seed=1234, split="test")
    run = Run(model, tok, task, cfg, evaluation=lambda run: _greedy_metrics(run.model, tok, task, evals_on))
    if run.device.type == "cuda":               # the rollouts draw their noise on the GPU
        run.gen = torch.Generator(device=run.device).manual_seed(cfg.seed)
    run.evaluate(0)
    for k in range(cfg.steps):
        run.start_update(k)                     # the clock
        ro, A, loss, norm = turn_update(run, task)
        run.stop_clock()
        first = ro.turn_rewards[:, 0] > 0
        run.log(**multiturn_metrics(ro), push=A[first, 0].mean().item() if bool(first.any()) else math.nan,
                loss=loss, grad_norm=norm, train_seconds=run.train_time)
        run.end_update()
        run.end_step(k, False, None)
    model.eval()
    return MultiTurnResult(model=model, config=cfg, history=run.history, evals=run.evals)


# ---------------------------------------------------------------------------- warm start

def retry_corpus(task: RetryTask, n: int, seed: int = 0, carry_forget: float = 0.8) -> list[list[str]]:
    r"""Conversations written the way the pretraining corpus writes answers, attempt by attempt.

    Each attempt at a carry problem is the forgotten-carry answer with probability
    ``carry_forget`` and the right answer otherwise, drawn independently of earlier attempts (so
    the feedback carries no information the writer used); a conversation stops at its first right
    answer or after :math:`U` attempts. Only for ADDITION-like problems (``info`` with ``a``,
    ``b``, ``carry``). Training-split prompts only.

    Returns:
        ``n`` lists of answers (strings), ``[problem, answers]`` pairs: ``[[Problem, [str, ...]], ...]``.
        Chapter: 15_turns_as_steps.
    """
    V.instance_of(task, "task", RetryTask)
    V.int_in(n, "n", 0)
    V.real_in(carry_forget, "carry_forget", 0.0, 1.0)
    rng = random.Random(seed)
    out = []
    for p in task.problems(n, rng, split="train"):
        if not {"a", "b", "carry"} <= set(p.info):
            raise ValueError("retry_corpus needs addition problems (info with 'a', 'b', 'carry')")
        answers = []
        for _ in range(task.max_turns):
            wrong = p.info["carry"] and rng.random() < carry_forget
            answers.append(forgot_carry_answer(p.info["a"], p.info["b"]) if wrong else p.answer)
            if not wrong:
                break
        out.append([p, answers])
    return out


def retry_warm_start(model, tok: CharTokenizer, task: RetryTask = RETRY_ADDITION, *, steps: int = 150,
                     batch_size: int = 128, lr: float = 1e-3, seed: int = 0, carry_forget: float = 0.8,
                     n_conversations: int = 20_000) -> list[float]:
    r"""Teach a pretrained model the conversation format by supervised fine-tuning (in place).

    Minimises :math:`-\frac{1}{\sum m}\sum_{b,t} m_{bt}\log p_\theta(y_{bt}\mid y_{b,<t})` over the
    model's tokens (:math:`m` = ``action_mask`` of :func:`episode_layout`) of conversations from
    :func:`retry_corpus`, with Adam at a constant ``lr``, seeded, in order.

    Args:
        model, tok: the model (trained in place) and its tokenizer. task: a :class:`RetryTask`.
        steps, batch_size: ints >= 1. lr: > 0. seed: corpus and batch order. carry_forget: as in
            :func:`retry_corpus`. n_conversations: corpus size.

    Returns:
        list of float: the loss of every step.

    Chapter: 15_turns_as_steps.
    """
    V.instance_of(tok, "tok", CharTokenizer)
    V.int_in(steps, "steps")
    V.int_in(batch_size, "batch_size")
    V.real_in(lr, "lr", 0.0, lo_open=True)
    dev = device_of(model)
    corpus = retry_corpus(task, n_conversations, seed=seed, carry_forget=carry_forget)
    fb = tok.encode(task.feedback)
    segs = []
    for p, answers in corpus:
        s = [(tok.encode(p.prompt), -1)]
        for k, a in enumerate(answers):
            if k:
                s.append((fb, -1))
            s.append((tok.encode(a, eos=True), k))
        segs.append(s)
    lay = episode_layout(segs, tok.pad_id)
    fake = MultiTurnRollout(**lay, logprobs=torch.zeros(lay["ids"].shape), turn_rewards=torch.zeros(len(segs), 0),
                            turn_mask=torch.zeros(len(segs), 0), num_turns=torch.zeros(len(segs), dtype=torch.long),
                            solved=torch.zeros(len(segs), dtype=torch.bool))
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(segs), (batch_size,), generator=g)
        sub = MultiTurnRollout(**{k: getattr(fake, k)[idx].to(dev) for k in
                                  ("ids", "attention_mask", "action_mask", "turn_index", "turn_end", "logprobs")},
                               turn_rewards=fake.turn_rewards[idx], turn_mask=fake.turn_mask[idx],
                               num_turns=fake.num_turns[idx], solved=fake.solved[idx])
        # trim columns that are padding in every row of the batch
        keep = sub.attention_mask.any(0)
        for k in ("ids", "attention_mask", "action_mask", "turn_index", "turn_end", "logprobs"):
            setattr(sub, k, getattr(sub, k)[:, keep])
        lp = turn_logprobs(model, sub)
        m = sub.action_mask
        loss = -(lp * m).sum() / m.sum().clamp_min(1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses
