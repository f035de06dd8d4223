r"""Checkers for the exercises of chapter 15, ``lessons/15_turns_as_steps.ipynb``.

* ``turn_return(turn_rewards, turn_mask, gamma)``: per-turn discounted returns
  :math:`G_k = \sum_{j=k}^{N-1}\gamma^{j-k} r_j` over the turns taken, 0 elsewhere; ``[B, K]`` -> ``[B, K]``.
* ``model_token_mask(ids, prompt_len, feedback_len, eos_id)``: which tokens of a RIGHT-padded
  conversation are the model's (its answers and their ``<eos>``), as a float 0/1 ``[B, L]``.
* ``turn_advantage(returns, turn_mask, group_size)``: the leave-one-out baseline per turn index,
  :math:`\hat A_{i,k} = G_{i,k} - \mathrm{mean}_{j \in S_k,\, j \ne i} G_{j,k}` (0 when alone), 0 at
  turns not taken.
* ``retry_value(q, gamma, K)``: the expected turn-1 return after a wrong first answer when each
  later attempt is right with probability :math:`q`, independently:
  :math:`\sum_{j=1}^{K-1} \gamma^{j} (1-q)^{j-1} q`.
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


# ------------------------------------------------------------------- 1. turn_return

def _tr_cases():
    g = torch.Generator().manual_seed(15)
    r = torch.rand(6, 4, generator=g, dtype=torch.float64)
    n = torch.tensor([4, 3, 1, 2, 4, 3])
    m = (torch.arange(4)[None] < n[:, None]).double()
    r = torch.where(m > 0, r, torch.full_like(r, 0.7))          # rewards of turns not taken are junk
    return [
        Case(args=(torch.tensor([[0.0, 0.0, 1.0]]), torch.ones(1, 3), 0.5),
             label="wrong, wrong, right with gamma = 0.5: returns 0.25, 0.5, 1"),
        Case(args=(torch.tensor([[1.0, 0.3, 0.3]]), torch.tensor([[1.0, 0.0, 0.0]]), 0.9),
             label="solved at turn 1: the later columns are padding"),
        Case(args=(r, m, 0.8), label="6 conversations of 1 to 4 turns, junk 0.7 after the end"),
        Case(args=(r, m, 0.0), label="gamma = 0: each turn keeps its own reward"),
    ]


@exercise(chapter=15, cases=_tr_cases, atol=1e-9, description="per-turn discounted returns of conversations")
def turn_return(turn_rewards, turn_mask, gamma):
    """G_k = r_k + gamma * G_{k+1} over the turns taken (turn_mask 1), 0 elsewhere; [B, K] -> [B, K]."""
    V.layout("B K", floating=True, turn_rewards=turn_rewards)
    m = V.check_mask(turn_mask, turn_rewards, "turn_rewards", "turn_mask").to(turn_rewards.dtype)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
    r = torch.where(m > 0, turn_rewards, torch.zeros((), dtype=turn_rewards.dtype))
    out = torch.zeros_like(r)
    G = torch.zeros(r.shape[0], dtype=r.dtype)
    for k in reversed(range(r.shape[1])):
        G = (r[:, k] + gamma * G) * m[:, k]
        out[:, k] = G
    return out


@mistake(turn_return, "you discounted from the start of the conversation (gamma^j); the return of "
         "turn k discounts from turn k itself (gamma^(j - k))")
def _tr_from_start(turn_rewards, turn_mask, gamma):
    m = turn_mask.to(turn_rewards.dtype)
    K = turn_rewards.shape[1]
    w = gamma ** torch.arange(K, dtype=turn_rewards.dtype)
    disc = turn_rewards * m * w
    return disc.flip(-1).cumsum(-1).flip(-1) * m


@mistake(turn_return, "rewards after the conversation ended were counted: mask the turns not taken "
         "before summing")
def _tr_no_mask(turn_rewards, turn_mask, gamma):
    out = torch.zeros_like(turn_rewards)
    G = torch.zeros(turn_rewards.shape[0], dtype=turn_rewards.dtype)
    for k in reversed(range(turn_rewards.shape[1])):
        G = turn_rewards[:, k] + gamma * G
        out[:, k] = G
    return out * turn_mask


@mistake(turn_return, "gamma was ignored: that is the gamma = 1 return")
def _tr_undiscounted(turn_rewards, turn_mask, gamma):
    return turn_return(turn_rewards, turn_mask, 1.0)


@mistake(turn_return, "the turn's own reward was discounted too (gamma^(j - k + 1)); r_k enters G_k undiscounted")
def _tr_discount_own(turn_rewards, turn_mask, gamma):
    return gamma * turn_return(turn_rewards, turn_mask, gamma)


# ------------------------------------------------------------------- 2. model_token_mask

def _conv(prompt, turns, fb, eos, width):
    ids = list(prompt)
    for k, t in enumerate(turns):
        if k:
            ids += fb
        ids += t + [eos]
    return ids + [0] * (width - len(ids))


def _mtm_cases():
    EOS, FB = 1, 40
    one = torch.tensor([_conv([3, 4, 14, 5, 6, 16], [[9, 4]], [FB], EOS, 10)])
    three = torch.tensor([
        _conv([3, 4, 14, 5, 6, 16], [[9, 4], [9, 4], [10, 4]], [FB], EOS, 17),
        _conv([5, 5, 14, 2, 3, 16], [[7, 8]], [FB], EOS, 17),
        _conv([11, 11, 14, 11, 11, 16], [[3, 2, 8], [3, 3, 8]], [FB], EOS, 17),
    ])
    two_fb = torch.tensor([_conv([3, 4, 14, 5, 6, 16], [[9, 4], [10, 4]], [FB, FB + 1], EOS, 13)])
    short = torch.tensor([_conv([3, 14, 5, 16], [[9, 4], [10, 4]], [FB], 2, 12),
                          _conv([6, 14, 7, 16], [[13, 3]], [FB], 2, 12)])
    return [
        Case(args=(one, 6, 1, EOS), label="one turn: 37+45=82<eos> then padding"),
        Case(args=(three, 6, 1, EOS), label="three conversations of 3, 1 and 2 turns"),
        Case(args=(two_fb, 6, 2, EOS), label="a two-token feedback"),
        Case(args=(short, 4, 1, 2), label="a 4-token prompt and <eos> id 2 (another tokenizer)"),
    ]


@exercise(chapter=15, cases=_mtm_cases, match_dtype=False,
          description="which tokens of a conversation are the model's (a 0/1 mask of any floating dtype)")
def model_token_mask(ids, prompt_len, feedback_len, eos_id):
    """1.0 at the model's tokens (answers and their <eos>) of right-padded conversations; ids [B, L] -> [B, L].

    Each conversation: prompt_len prompt tokens, then turns; every turn ends with eos_id, and every
    turn but the last is followed by feedback_len feedback tokens; padding (id 0) after the last <eos>.
    """
    V.layout("B L", ids=ids)
    out = torch.zeros(ids.shape, dtype=torch.float32)
    for b in range(ids.shape[0]):
        row = ids[b].tolist()
        t = prompt_len
        while t < len(row) and row[t] != 0:
            while t < len(row) and row[t] != eos_id:        # the answer
                out[b, t] = 1.0
                t += 1
            if t < len(row):
                out[b, t] = 1.0                              # its <eos>
            t += 1 + feedback_len                            # the feedback, if another turn follows
    return out


def _mtm_variant(ids, prompt_len, feedback_len, eos_id, *, count_eos=True, skip_fb=True, start=None):
    out = torch.zeros(ids.shape, dtype=torch.float32)
    for b in range(ids.shape[0]):
        row = ids[b].tolist()
        t = prompt_len if start is None else start
        while t < len(row) and row[t] != 0:
            while t < len(row) and row[t] != eos_id:
                out[b, t] = 1.0
                t += 1
            if t < len(row) and count_eos:
                out[b, t] = 1.0
            t += 1 + (feedback_len if skip_fb else 0)
    return out


@mistake(model_token_mask, "the feedback tokens were counted as the model's: they are the checker's "
         "reply (the environment), not actions")
def _mtm_feedback(ids, prompt_len, feedback_len, eos_id):
    return _mtm_variant(ids, prompt_len, feedback_len, eos_id, skip_fb=False)


@mistake(model_token_mask, "the <eos> that ends each turn was left out: the model chooses to end its turn, "
         "so <eos> is an action")
def _mtm_no_eos(ids, prompt_len, feedback_len, eos_id):
    return _mtm_variant(ids, prompt_len, feedback_len, eos_id, count_eos=False)


@mistake(model_token_mask, "off by one at the prompt: the '=' (the last prompt token) was marked as the model's")
def _mtm_off_by_one(ids, prompt_len, feedback_len, eos_id):
    out = model_token_mask(ids, prompt_len, feedback_len, eos_id)
    out[:, prompt_len - 1] = 1.0
    return out


@mistake(model_token_mask, "padding was counted: stop at the padding after the last <eos>")
def _mtm_padding(ids, prompt_len, feedback_len, eos_id):
    out = model_token_mask(ids, prompt_len, feedback_len, eos_id)
    return torch.where(ids == 0, torch.ones_like(out), out)


# ------------------------------------------------------------------- 3. turn_advantage

def _ta_cases():
    g = torch.Generator().manual_seed(5)
    G = torch.rand(12, 3, generator=g, dtype=torch.float64)
    n = torch.tensor([3, 1, 2, 3, 1, 1, 2, 2, 3, 1, 3, 2])
    m = (torch.arange(3)[None] < n[:, None]).double()
    return [
        Case(args=(torch.tensor([[1.0, 0.0], [0.5, 1.0], [0.25, 0.5], [1.0, 0.0]]),
                   torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]), 4),
             label="one group of 4; two conversations reached turn 2"),
        Case(args=(G * m, m, 4), label="3 groups of 4, 1 to 3 turns each"),
        Case(args=(G * m, m, 6), label="2 groups of 6"),
    ]


@exercise(chapter=15, cases=_ta_cases, atol=1e-9, description="turn-level advantage with a leave-one-out baseline")
def turn_advantage(returns, turn_mask, group_size):
    """G_ik minus the mean G_jk of the OTHER conversations j of i's group that took turn k (0 if none); [B, K]."""
    V.layout("B K", floating=True, returns=returns)
    m = V.check_mask(turn_mask, returns, "returns", "turn_mask").to(returns.dtype)
    B, K = returns.shape
    out = torch.zeros_like(returns)
    for i in range(B):
        g0 = (i // group_size) * group_size
        for k in range(K):
            if m[i, k] == 0:
                continue
            others = [returns[j, k] for j in range(g0, g0 + group_size) if j != i and m[j, k] > 0]
            out[i, k] = returns[i, k] - (sum(others) / len(others) if others else 0.0)
    return out


@mistake(turn_advantage, "the baseline pooled every turn of the group; a turn-k action is compared only "
         "with other turn-k returns (the states differ)")
def _ta_pooled(returns, turn_mask, group_size):
    m = turn_mask.to(returns.dtype)
    B, K = returns.shape
    g, mg = returns.view(-1, group_size, K), m.view(-1, group_size, K)
    tot, cnt = (g * mg).sum((1, 2), keepdim=True), mg.sum((1, 2), keepdim=True)
    b = (tot - g) / (cnt - 1).clamp_min(1)
    return ((g - b) * mg).view(B, K)


@mistake(turn_advantage, "conversations that stopped before turn k were counted with return 0; a turn "
         "that was not taken is missing, not a zero")
def _ta_zeros(returns, turn_mask, group_size):
    m = turn_mask.to(returns.dtype)
    B, K = returns.shape
    g = (returns * m).view(-1, group_size, K)
    b = (g.sum(1, keepdim=True) - g) / (group_size - 1)
    return ((g - b) * m.view(-1, group_size, K)).view(B, K)


@mistake(turn_advantage, "the conversation's own return was included in its baseline (the 'mean' "
         "baseline); leave it out")
def _ta_with_self(returns, turn_mask, group_size):
    m = turn_mask.to(returns.dtype)
    B, K = returns.shape
    g, mg = (returns * m).view(-1, group_size, K), m.view(-1, group_size, K)
    b = g.sum(1, keepdim=True) / mg.sum(1, keepdim=True).clamp_min(1)
    return ((g - b) * mg).view(B, K)


# ------------------------------------------------------------------- 4. retry_value

def _rv_cases():
    return [
        Case(args=(0.5, 0.5, 3), label="q = 0.5, gamma = 0.5, K = 3: 0.25 + 0.0625"),
        Case(args=(0.9, 1.0, 3), label="gamma = 1: the chance of a later success, 0.99"),
        Case(args=(0.3, 0.9, 5), label="q = 0.3, gamma = 0.9, K = 5"),
        Case(args=(0.7, 0.8, 1), label="K = 1: no retry, value 0"),
    ]


@exercise(chapter=15, cases=_rv_cases, atol=1e-9, description="the turn-1 value of a wrong first answer")
def retry_value(q, gamma, K):
    """sum_{j=1}^{K-1} gamma^j (1 - q)^(j - 1) q, as a float64 0-dim tensor."""
    q = V.real_in(q, "q", 0.0, 1.0)
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
    K = V.int_in(K, "K")
    return torch.tensor(sum(gamma ** j * (1 - q) ** (j - 1) * q for j in range(1, K)), dtype=torch.float64)


@mistake(retry_value, "the success at turn j + 1 is j turns after turn 1: discount it by gamma^j, not gamma^(j-1)")
def _rv_offset(q, gamma, K):
    return torch.tensor(sum(gamma ** (j - 1) * (1 - q) ** (j - 1) * q for j in range(1, K)), dtype=torch.float64)


@mistake(retry_value, "a success at turn j + 1 needs the j - 1 retries before it to fail: multiply by (1 - q)^(j - 1)")
def _rv_no_fail(q, gamma, K):
    return torch.tensor(sum(gamma ** j * q for j in range(1, K)), dtype=torch.float64)


@mistake(retry_value, "there are K - 1 retries after the first answer, not K")
def _rv_k_retries(q, gamma, K):
    return torch.tensor(sum(gamma ** j * (1 - q) ** (j - 1) * q for j in range(1, K + 1)), dtype=torch.float64)
