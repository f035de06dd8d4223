"""Tests of rlkit.llm.multiturn (chapter 15): layout, rollout, log-probs, returns, advantages, trainer.

Every quantity is compared with an independent computation: a hand-built conversation, a slow
rebuild of each sampled conversation from its answers, a token-by-token forward pass, and slow
loops for the returns and the baselines.
"""
import copy
import math

import pytest
import torch

from rlkit.llm import ADDITION, CharTokenizer, load_pretrained
from rlkit.llm.multiturn import (
    RETRY_ADDITION,
    MultiTurnConfig,
    RetryTask,
    episode_layout,
    multiturn_metrics,
    retry_corpus,
    retry_warm_start,
    rollout_turns,
    token_discounts,
    train_multiturn,
    turn_advantages,
    turn_logprobs,
    turn_returns,
    turn_update,
    well_formed,
)
from rlkit.llm.trainer import Run
from rlkit.returns import discounted_returns


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    model, tok = load_pretrained()
    return copy.deepcopy(model), tok          # its retries are garbage, often cut at the budget (no <eos>)


def test_layout_against_hand_built_conversation():
    # prompt [5, 6]; turn 0 answers [7, 1]; feedback [9]; turn 1 answers [8, 8, 1]; second row: prompt [4], answer [1]
    lay = episode_layout([[([5, 6], -1), ([7, 1], 0), ([9], -1), ([8, 8, 1], 1)], [([4], -1), ([1], 0)]])
    assert lay["ids"].tolist() == [[5, 6, 7, 1, 9, 8, 8, 1], [0, 0, 0, 0, 0, 0, 4, 1]]
    assert lay["attention_mask"].tolist() == [[True] * 8, [False] * 6 + [True, True]]
    assert lay["action_mask"].tolist() == [[0, 0, 1, 1, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0, 1]]
    assert lay["turn_index"].tolist() == [[-1, -1, 0, 0, -1, 1, 1, 1], [-1] * 7 + [0]]
    assert lay["turn_end"].tolist() == [[False, False, False, True, False, False, False, True], [False] * 7 + [True]]
    with pytest.raises(TypeError, match=r"segments\[0\]\[0\]"):
        episode_layout([[[1, 2, 3]]])
    with pytest.raises(ValueError, match="no tokens"):
        episode_layout([[([], -1)]])


def _slow_rebuild(tok, task, problem, answers):
    """The token row of a conversation from its answers, built one token at a time."""
    ids, mask, turn = list(tok.encode(problem.prompt)), [], []
    mask = [0] * len(ids)
    turn = [-1] * len(ids)
    for k, a in enumerate(answers):
        if k:
            fb = tok.encode(task.feedback)
            ids += fb
            mask += [0] * len(fb)
            turn += [-1] * len(fb)
        t = tok.encode(a) + ([tok.eos_id] if len(a) < task.base.max_new_tokens else [])
        ids += t
        mask += [1] * len(t)
        turn += [k] * len(t)
    return ids, mask, turn


@pytest.mark.parametrize("greedy", [False, True])
def test_rollout_masks_rewards_against_slow_rebuild(lm, greedy):
    model, tok = lm
    probs = RETRY_ADDITION.problems(48, seed=3, split="train")
    ro = rollout_turns(model, tok, RETRY_ADDITION, probs, greedy=greedy, generator=torch.Generator().manual_seed(1))
    K = RETRY_ADDITION.max_turns
    assert ro.turn_rewards.shape == (48, K) and ro.turn_mask.shape == (48, K)
    for i, p in enumerate(probs):
        answers = ro.responses[i]
        n = len(answers)
        assert 1 <= n <= K and ro.num_turns[i].item() == n
        rewards = [float(a == p.answer) for a in answers]
        assert all(r == 0 for r in rewards[:-1])                       # it stops at the first correct answer
        assert rewards[-1] == 1 or n == K
        assert ro.turn_rewards[i].tolist() == rewards + [0.0] * (K - n)
        assert ro.turn_mask[i].tolist() == [1.0] * n + [0.0] * (K - n)
        assert bool(ro.solved[i]) == (rewards[-1] == 1)
        ids, mask, turn = _slow_rebuild(tok, RETRY_ADDITION, p, answers)
        real = ro.attention_mask[i]
        assert ro.ids[i][real].tolist() == ids
        assert ro.action_mask[i][real].tolist() == mask
        assert ro.turn_index[i][real].tolist() == turn
        assert (ro.action_mask[i][~real] == 0).all() and (ro.logprobs[i][ro.action_mask[i] == 0] == 0).all()
    if greedy:
        assert (ro.logprobs == 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_one_forward_pass_and_a_token_loop(lm, temperature):
    model, tok = lm
    probs = RETRY_ADDITION.problems(32, seed=5, split="train")
    ro = rollout_turns(model, tok, RETRY_ADDITION, probs, temperature=temperature,
                       generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        lp = turn_logprobs(model, ro, temperature=temperature)
    am = ro.action_mask.bool()
    assert torch.allclose(lp[am], ro.logprobs[am], atol=1e-5)
    assert (lp[~am] == 0).all()
    # a slow loop: each model token from the unpadded prefix before it
    for i in range(4):
        row = ro.ids[i][ro.attention_mask[i]]
        acts = ro.action_mask[i][ro.attention_mask[i]]
        lps = ro.logprobs[i][ro.attention_mask[i]]
        for t in range(1, len(row)):
            if acts[t]:
                with torch.no_grad():
                    z = model(row[None, :t])[0, -1]
                ref = torch.log_softmax(z / temperature, -1)[row[t]]
                assert abs(ref.item() - lps[t].item()) < 1e-5


def test_turn_logprobs_gradient_flows_only_through_model_tokens(lm):
    model, tok = lm
    m = copy.deepcopy(model)
    ro = rollout_turns(m, tok, RETRY_ADDITION, RETRY_ADDITION.problems(8, seed=1),
                       generator=torch.Generator().manual_seed(0))
    lp, ent = turn_logprobs(m, ro, with_entropy=True)
    assert lp.requires_grad and torch.isfinite(ent).all() and (ent[ro.action_mask == 0] == 0).all()
    lp.sum().backward()
    assert m.wte.weight.grad is not None and torch.isfinite(m.wte.weight.grad).all()


def _slow_turn_returns(r, m, gamma):
    B, K = r.shape
    out = torch.zeros(B, K, dtype=torch.float64)
    for i in range(B):
        n = int(m[i].sum())
        for k in range(n):
            out[i, k] = sum(gamma ** (j - k) * float(r[i, j]) for j in range(k, n))
    return out


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.9, 1.0])
def test_turn_returns_against_slow_loop(gamma):
    g = torch.Generator().manual_seed(0)
    r = torch.rand(20, 4, generator=g, dtype=torch.float64)
    n = torch.randint(0, 5, (20,), generator=g)
    m = (torch.arange(4)[None] < n[:, None]).double()
    r_pad = torch.where(m > 0, r, torch.tensor(float("nan"), dtype=torch.float64))   # NaN in padding is ignored
    got = turn_returns(r_pad, m, gamma)
    assert torch.allclose(got, _slow_turn_returns(r, m, gamma), atol=1e-12)
    # hand case: wrong, wrong, right with gamma = 0.5 -> 0.25, 0.5, 1
    hand = turn_returns(torch.tensor([[0.0, 0.0, 1.0]]), torch.ones(1, 3), 0.5)
    assert hand.tolist() == [[0.25, 0.5, 1.0]]


def test_turn_returns_input_checks():
    with pytest.raises(ValueError, match="prefix"):
        turn_returns(torch.zeros(1, 3), torch.tensor([[1.0, 0.0, 1.0]]), 0.5)
    with pytest.raises(ValueError, match="gamma"):
        turn_returns(torch.zeros(1, 3), torch.ones(1, 3), 1.5)
    with pytest.raises(ValueError, match=r"turn_rewards must be \[B, K\]"):
        turn_returns(torch.zeros(2, 1, 3), torch.ones(2, 1, 3), 0.5)
    assert turn_returns(torch.zeros(0, 3), torch.zeros(0, 3), 0.9).shape == (0, 3)


@pytest.mark.parametrize("gamma", [0.0, 0.6, 1.0])
def test_token_discounts_per_turn_reproduce_turn_returns(lm, gamma):
    model, tok = lm
    ro = rollout_turns(model, tok, RETRY_ADDITION, RETRY_ADDITION.problems(40, seed=9),
                       generator=torch.Generator().manual_seed(4))
    rew, disc = token_discounts(ro, gamma, per="turn")
    G_tok = discounted_returns(rew, disc, 0.0)
    G_turn = turn_returns(ro.turn_rewards, ro.turn_mask, gamma)
    am = ro.action_mask.bool()
    expect = G_turn.gather(1, ro.turn_index.clamp_min(0))
    assert torch.allclose(G_tok[am], expect[am], atol=1e-6)
    # per token: a solved-first-time conversation with n answer tokens gives the first token gamma^(n-1)
    rew_t, disc_t = token_discounts(ro, gamma, per="token")
    G_t = discounted_returns(rew_t, disc_t, 0.0)
    for i in range(len(ro)):
        if ro.num_turns[i] == 1 and ro.solved[i]:
            pos = ro.action_mask[i].nonzero().squeeze(-1)
            assert abs(G_t[i, pos[0]].item() - gamma ** (len(pos) - 1)) < 1e-6


def _slow_loo(G, m, group):
    B, K = G.shape
    out = torch.zeros(B, K, dtype=torch.float64)
    for i in range(B):
        g0 = (i // group) * group
        for k in range(K):
            if not m[i, k]:
                continue
            others = [float(G[j, k]) for j in range(g0, g0 + group) if j != i and m[j, k]]
            out[i, k] = float(G[i, k]) - (sum(others) / len(others) if others else 0.0)
    return out


def test_turn_advantages_against_slow_loops():
    g = torch.Generator().manual_seed(1)
    G = torch.rand(24, 3, generator=g, dtype=torch.float64)
    n = torch.randint(1, 4, (24,), generator=g)
    m = (torch.arange(3)[None] < n[:, None]).double()
    G = G * m
    assert torch.allclose(turn_advantages(G, m, 6, "loo"), _slow_loo(G, m, 6), atol=1e-12)
    A = turn_advantages(G, m, 6, "mean")
    assert torch.allclose((A * m).view(4, 6, 3).sum(1), torch.zeros(4, 3, dtype=torch.float64), atol=1e-12)
    assert (A[m == 0] == 0).all()
    assert torch.equal(turn_advantages(G, m, 6, "none"), G * m)
    with pytest.raises(ValueError, match="divide"):
        turn_advantages(G, m, 5)
    with pytest.raises(ValueError, match="baseline"):
        turn_advantages(G, m, 6, "std")
    assert turn_advantages(torch.zeros(0, 3), torch.zeros(0, 3), 4).shape == (0, 3)


def test_empty_batch_and_metrics(lm):
    model, tok = lm
    ro = rollout_turns(model, tok, RETRY_ADDITION, [])
    assert len(ro) == 0 and ro.turn_rewards.shape == (0, 3)
    assert turn_logprobs(model, ro).shape[0] == 0
    mt = multiturn_metrics(ro)
    assert all(math.isnan(v) for v in mt.values())
    ro = rollout_turns(model, tok, RETRY_ADDITION, RETRY_ADDITION.problems(16, seed=2), greedy=True)
    mt = multiturn_metrics(ro)
    assert mt["mean_turns"] == ro.num_turns.float().mean().item()
    assert mt["first_attempt"] == sum(r[0] == p.answer for r, p in zip(ro.responses, ro.problems)) / 16
    wf = well_formed(ro)
    assert wf.shape == (16, 3) and (wf[ro.turn_mask == 0] == 0).all()


def test_retry_task_checks():
    with pytest.raises(ValueError, match="newline"):
        RetryTask(ADDITION, feedback="no\n")
    with pytest.raises(ValueError, match="max_turns"):
        RetryTask(ADDITION, max_turns=0)
    model, tok = load_pretrained()
    long = RetryTask(ADDITION, max_turns=6, feedback="wrong")
    with pytest.raises(ValueError, match="block_size"):
        rollout_turns(model, tok, long, long.problems(2))
    with pytest.raises(TypeError):
        rollout_turns(model, tok, ADDITION, ADDITION.problems(2))


def test_retry_corpus_keeps_the_bug_at_every_turn():
    corpus = retry_corpus(RETRY_ADDITION, 4000, seed=0)
    carry = [(p, a) for p, a in corpus if p.info["carry"]]
    for p, answers in corpus:
        assert 1 <= len(answers) <= 3
        assert all(a != p.answer for a in answers[:-1])
        if not p.info["carry"]:
            assert answers == [p.answer]
    # each attempt at a carry problem is right with probability 0.2, independently of the earlier ones
    first = sum(a[0] == p.answer for p, a in carry) / len(carry)
    second = [a[1] == p.answer for p, a in carry if len(a) > 1]
    assert abs(first - 0.2) < 0.03 and abs(sum(second) / len(second) - 0.2) < 0.03


def test_warm_start_and_trainer_smoke():
    model, tok = load_pretrained()
    model = copy.deepcopy(model)
    losses = retry_warm_start(model, tok, steps=3, batch_size=16, n_conversations=200)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    cfg = MultiTurnConfig(gamma=0.5, steps=2, prompts_per_step=2, group_size=4, eval_every=1, format_bonus=0.1)
    res = train_multiturn(model, tok, RETRY_ADDITION, cfg, eval_set=RETRY_ADDITION.problems(8, seed=0, split="test"))
    assert res.evals["step"] == [0, 1, 2]
    assert len(res.history["loss"]) == 2 and all(math.isfinite(x) for x in res.history["loss"])
    with pytest.raises(ValueError, match="gamma"):
        MultiTurnConfig(gamma=1.2)
    with pytest.raises(TypeError):
        train_multiturn(model, CharTokenizer(), RETRY_ADDITION, config={"gamma": 1})


def test_trainer_is_the_run_shell_and_turn_update():
    """train_multiturn = trainer.Run (optimiser, generators, log, clock, evaluations) + turn_update per step:
    one update by hand on a Run gives the trainer's first update to the bit (its evaluations draw no noise)."""
    base, tok = load_pretrained()
    cfg = MultiTurnConfig(gamma=0.5, steps=1, prompts_per_step=2, group_size=4, eval_every=1, format_bonus=0.1,
                          grad_clip=0.5, seed=0)
    ev = RETRY_ADDITION.problems(4, seed=0, split="test")
    m1, m2 = copy.deepcopy(base), copy.deepcopy(base)
    res = train_multiturn(m1, tok, RETRY_ADDITION, cfg, eval_set=ev)
    ro, A, loss, norm = turn_update(Run(m2, tok, RETRY_ADDITION, cfg), RETRY_ADDITION)
    assert res.history["loss"] == [loss] and res.history["grad_norm"] == [norm] and norm > cfg.grad_clip
    assert res.history["first_attempt"] == [multiturn_metrics(ro)["first_attempt"]]
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert res.evals["step"] == [0, 1] and len(res.evals["train_seconds"]) == 2
    assert res.evals["train_seconds"][0] == 0.0 < res.evals["train_seconds"][1] == res.history["train_seconds"][0]


def test_trainer_refuses_eval_problems_it_would_ignore():
    """MultiTurnConfig.eval_problems sizes the default held-out set only: with eval_set it was silently ignored."""
    model, tok = load_pretrained()
    ev = RETRY_ADDITION.problems(4, seed=0, split="test")
    with pytest.raises(ValueError, match="eval_problems=8 is ignored when eval_set is given"):
        train_multiturn(copy.deepcopy(model), tok, RETRY_ADDITION, MultiTurnConfig(steps=1, eval_problems=8),
                        eval_set=ev)
