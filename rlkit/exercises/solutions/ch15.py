r"""Checkers for the exercises of chapter 15, ``lessons/15_turns_as_steps.ipynb``.

* ``turn_nstep_return(turn_rewards, turn_values, turn_mask, gamma, n)``: per-turn n-step returns with a
  turn-level critic, :math:`G^{(n)}_u = \sum_{j=u}^{\min(u+n,N)-1}\gamma^{j-u} r_j + \gamma^n V(s_{u+n})\,[u+n<N]`,
  0 at turns not taken; ``[B, K]`` -> ``[B, K]`` (the chapter displays the Monte-Carlo ``turn_returns``).
* ``model_token_mask(ids, prompt_len, feedback_len, eos_id)``: which tokens of a RIGHT-padded
  conversation are the model's (its answers and their ``<eos>``), as a float 0/1 ``[B, L]``.
* ``turn_grpo_advantage(returns, turn_mask, group_size, eps)``: GRPO's group-normalised advantage per
  turn index, :math:`(G_{i,k} - \mathrm{mean}_{S_k} G)/(\mathrm{std}_{S_k} G + \zeta)` (sample std; 0 when
  :math:`|S_k| < 2`), 0 at turns not taken (the chapter displays the leave-one-out ``turn_advantages``).
* ``retry_value(q, gamma, K)``: the expected turn-1 return after a wrong first answer when each
  later attempt is right with probability :math:`q`, independently:
  :math:`\sum_{j=1}^{K-1} \gamma^{j} (1-q)^{j-1} q`.
"""
from __future__ import annotations

import torch

from rlkit import _validate as V
from rlkit.exercises import Case, exercise, mistake

__all__: list[str] = []


# ------------------------------------------------------------ 1. turn_nstep_return

def _tr_cases():
    g = torch.Generator().manual_seed(15)
    r = torch.rand(6, 4, generator=g, dtype=torch.float64)
    v = torch.rand(6, 4, generator=g, dtype=torch.float64)
    n = torch.tensor([4, 3, 1, 2, 4, 3])
    m = (torch.arange(4)[None] < n[:, None]).double()
    r = torch.where(m > 0, r, torch.full_like(r, 0.7))          # rewards of turns not taken are junk
    v = torch.where(m > 0, v, torch.full_like(v, 0.9))          # and so are their values
    return [
        Case(args=(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.4, 0.8]]), torch.ones(1, 3), 0.5, 1),
             label="wrong, wrong, right; V = (0.2, 0.4, 0.8), gamma = 0.5, n = 1: 0.2, 0.4, 1"),
        Case(args=(torch.tensor([[1.0, 0.3, 0.3]]), torch.tensor([[0.5, 0.9, 0.9]]), torch.tensor([[1.0, 0.0, 0.0]]),
                   0.9, 2), label="solved at turn 1: the later columns (rewards and values) are padding"),
        Case(args=(r, v, m, 0.8, 2), label="6 conversations of 1 to 4 turns, n = 2, junk after the end"),
        Case(args=(r, v, m, 0.8, 1), label="n = 1: the one-step TD target of every turn"),
        Case(args=(r, v, m, 0.6, 4), label="n = 4 covers every conversation: the Monte-Carlo return"),
        Case(args=(r, v, m, 0.0, 2), label="gamma = 0: each turn keeps its own reward"),
    ]


def _nstep(turn_rewards, turn_values, turn_mask, gamma, n, *, past_end=False, boot_shift=0, boot_power=0):
    m = turn_mask.to(turn_rewards.dtype)
    B, K = turn_rewards.shape
    N = m.sum(1).long()
    out = torch.zeros_like(turn_rewards)
    for i in range(B):
        for u in range(int(N[i])):
            end = min(u + n, int(N[i]))
            out[i, u] = sum(gamma ** (j - u) * turn_rewards[i, j] for j in range(u, end))
            b = u + n - boot_shift
            if (u + n < int(N[i]) or (past_end and u + n < K)) and b < K:
                out[i, u] = out[i, u] + gamma ** (n - boot_power) * turn_values[i, b]
    return out


@exercise(chapter=15, cases=_tr_cases, atol=1e-9, description="per-turn n-step returns with a turn-level critic")
def turn_nstep_return(turn_rewards, turn_values, turn_mask, gamma, n):
    """G^(n)_u = sum_{j=u}^{min(u+n, N)-1} gamma^(j-u) r_j + gamma^n V(s_{u+n}) [u + n < N], 0 at turns not taken."""
    V.layout("B K", floating=True, turn_rewards=turn_rewards, turn_values=turn_values)
    V.check_mask(turn_mask, turn_rewards, "turn_rewards", "turn_mask")
    gamma = V.real_in(gamma, "gamma", 0.0, 1.0)
    n = V.int_in(n, "n", 1)
    return _nstep(turn_rewards, turn_values, turn_mask, gamma, n)


@mistake(turn_nstep_return, "your returns never bootstrap: that is the Monte-Carlo turn return (what "
         "rlkit.llm.turn_returns computes); an n-step return stops after n turns and adds gamma^n V(s_{u+n})")
def _tr_monte_carlo(turn_rewards, turn_values, turn_mask, gamma, n):
    return _nstep(turn_rewards, turn_values, turn_mask, gamma, turn_rewards.shape[1] + 1)


@mistake(turn_nstep_return, "a window that runs past the last turn taken bootstrapped from the value of a turn "
         "that was not taken; after the conversation ends there is nothing left to earn, so no bootstrap")
def _tr_past_end(*a):
    return _nstep(*a, past_end=True)


@mistake(turn_nstep_return, "off by one: you bootstrapped from V(s_{u+n-1}); after the n rewards r_u .. "
         "r_{u+n-1} the conversation is in state s_{u+n}")
def _tr_boot_shift(*a):
    return _nstep(*a, boot_shift=1)


@mistake(turn_nstep_return, "the bootstrap is n turns ahead: weight V(s_{u+n}) by gamma^n, not gamma^(n-1)")
def _tr_boot_power(*a):
    return _nstep(*a, boot_power=1)


@mistake(turn_nstep_return, "rewards after the conversation ended were counted: the window stops at the last "
         "turn taken")
def _tr_no_mask(turn_rewards, turn_values, turn_mask, gamma, n):
    full = torch.ones_like(turn_rewards)
    return _nstep(turn_rewards, turn_values, full, gamma, n) * turn_mask.to(turn_rewards.dtype)


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


# ------------------------------------------------------------ 3. turn_grpo_advantage

def _ta_cases():
    g = torch.Generator().manual_seed(5)
    G = torch.rand(12, 3, generator=g, dtype=torch.float64)
    n = torch.tensor([3, 1, 2, 3, 1, 1, 2, 2, 3, 1, 3, 2])
    m = (torch.arange(3)[None] < n[:, None]).double()
    tie = torch.tensor([[1.0, 0.5], [1.0, 0.0], [1.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    tie_m = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    return [
        Case(args=(torch.tensor([[1.0, 0.0], [0.5, 1.0], [0.25, 0.5], [1.0, 0.0]], dtype=torch.float64),
                   torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]], dtype=torch.float64), 4, 1e-6),
             label="one group of 4; two conversations reached turn 2"),
        Case(args=(G * m, m, 4, 1e-6), label="3 groups of 4, 1 to 3 turns each"),
        Case(args=(G * m, m, 6, 0.1), label="2 groups of 6, zeta = 0.1"),
        Case(args=(tie, tie_m, 4, 1e-6),
             label="turn 2 taken by one conversation only (advantage 0); three equal returns at turn 1"),
    ]


def _grpo_turn(returns, turn_mask, group_size, eps, *, pool=False, zeros=False, loo=False, unbiased=True,
               scale=True):
    m = turn_mask.to(returns.dtype)
    B, K = returns.shape
    out = torch.zeros_like(returns)
    for i in range(B):
        g0 = (i // group_size) * group_size
        for k in range(K):
            if m[i, k] == 0:
                continue
            cols = range(K) if pool else [k]
            S = [returns[j, c] * m[j, c] for j in range(g0, g0 + group_size) for c in cols
                 if zeros or m[j, c] > 0]
            if loo:
                S = [returns[j, k] for j in range(g0, g0 + group_size) if j != i and m[j, k] > 0]
            x = torch.stack(S) if S else returns.new_zeros(0)
            if len(S) <= 1 and not loo:
                continue
            mean = x.mean() if len(S) else returns.new_zeros(())
            a = returns[i, k] - mean
            if scale and not loo:
                std = x.std(unbiased=unbiased)
                a = a / (std + eps)
            out[i, k] = a
    return out


@exercise(chapter=15, cases=_ta_cases, atol=1e-9, description="GRPO's group-normalised advantage, per turn index")
def turn_grpo_advantage(returns, turn_mask, group_size, eps):
    """(G_ik - mean of S_k) / (std of S_k + eps), S_k = the returns of i's group at turn k (0 if fewer than 2)."""
    V.layout("B K", floating=True, returns=returns)
    V.check_mask(turn_mask, returns, "returns", "turn_mask")
    eps = V.real_in(eps, "eps", 0.0, lo_open=True)
    return _grpo_turn(returns, turn_mask, group_size, eps)


@mistake(turn_grpo_advantage, "that is the chapter's leave-one-out advantage (rlkit.llm.turn_advantages): GRPO's "
         "baseline is the mean over ALL the group's returns at that turn, the conversation's own included, and it "
         "divides by their standard deviation")
def _ta_loo(returns, turn_mask, group_size, eps):
    return _grpo_turn(returns, turn_mask, group_size, eps, loo=True)


@mistake(turn_grpo_advantage, "the statistics pooled every turn of the group; a turn-k return is compared only "
         "with other turn-k returns (the states differ)")
def _ta_pooled(returns, turn_mask, group_size, eps):
    return _grpo_turn(returns, turn_mask, group_size, eps, pool=True)


@mistake(turn_grpo_advantage, "conversations that stopped before turn k were counted with return 0; a turn "
         "that was not taken is missing, not a zero")
def _ta_zeros(returns, turn_mask, group_size, eps):
    return _grpo_turn(returns, turn_mask, group_size, eps, zeros=True)


@mistake(turn_grpo_advantage, "the advantage is not divided by the standard deviation: that is Dr. GRPO's "
         "centred return, not GRPO's")
def _ta_unscaled(returns, turn_mask, group_size, eps):
    return _grpo_turn(returns, turn_mask, group_size, eps, scale=False)


@mistake(turn_grpo_advantage, "the standard deviation is the sample one (divide by |S_k| - 1), as in "
         "rlkit.objectives.grpo_advantages and torch.std; you divided by |S_k|")
def _ta_population(returns, turn_mask, group_size, eps):
    return _grpo_turn(returns, turn_mask, group_size, eps, unbiased=False)


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
