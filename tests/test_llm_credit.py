"""Tests of rlkit.llm.credit (chapter 14) and the chapter-14 additions to tasks, model and rl.

Every function is compared with an independent computation: hand-worked cases, slow Python
loops over the definitions, exact enumeration, and Monte Carlo within its standard error.
"""
import copy
import math
import random

import pytest
import torch

from rlkit.llm import (
    ADDITION,
    GPT,
    VALUE_TARGETS,
    DenseRewards,
    GPTConfig,
    HiddenValueHead,
    KLPenalty,
    Problem,
    RLConfig,
    TokenGAE,
    dense_rewards,
    digit_rewards,
    encode_prompts,
    exact_match,
    exact_match_values,
    first_wrong_token,
    kl_token_rewards,
    load_pretrained,
    mc_prefix_values,
    most_negative_token,
    response_discounts,
    sample,
    state_values,
    terminal_rewards,
    token_advantages,
    token_kl_exact,
    train,
    value_targets,
)

MASK = torch.tensor([[1., 1., 1., 0.], [1., 1., 1., 1.], [1., 0., 0., 0.]])


def _slow_targets(r, v, m, kind, gamma, lam, n):
    """The definitions of eq-ch14-nstep and eq-ch14-lambda, one row and one step at a time (V after the end = 0)."""
    out = torch.zeros_like(r)
    for i in range(r.shape[0]):
        L = int(m[i].sum())
        V = [float(v[i, t]) for t in range(L)] + [0.0]
        R = [float(r[i, t]) for t in range(L)]
        for t in range(L):
            if kind == "mc":
                g = sum(gamma ** k * R[t + k] for k in range(L - t))
            elif kind == "nstep":
                mm = min(n, L - t)
                g = sum(gamma ** k * R[t + k] for k in range(mm)) + gamma ** mm * V[t + mm]
            else:                       # lambda-return as the weighted mixture of n-step returns
                g = 0.0
                for k in range(1, L - t):
                    gk = sum(gamma ** j * R[t + j] for j in range(k)) + gamma ** k * V[t + k]
                    g += (1 - lam) * lam ** (k - 1) * gk
                g += lam ** (L - t - 1) * sum(gamma ** j * R[t + j] for j in range(L - t))
            out[i, t] = g
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_value_targets_match_slow_definitions(gamma):
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64)
    m = MASK.double()
    for kind, n, lam in [("mc", 1, 0.0), ("nstep", 1, 0.0), ("nstep", 2, 0.0), ("nstep", 9, 0.0),
                         ("lambda", 1, 0.0), ("lambda", 1, 0.5), ("lambda", 1, 0.95), ("lambda", 1, 1.0)]:
        got = value_targets(r, v, m, kind, gamma=gamma, lam=lam, n=n)
        assert torch.allclose(got, _slow_targets(r, v, m, kind, gamma, lam, n), atol=1e-10), (kind, n, lam)
    # GAE's returns are the lambda-return; lambda 0 = TD(0); lambda 1 = MC; n >= T = MC
    for lam in (0.0, 0.3, 0.95, 1.0):
        assert torch.allclose(value_targets(r, v, m, "gae", gamma=gamma, lam=lam),
                              value_targets(r, v, m, "lambda", gamma=gamma, lam=lam), atol=1e-10)
    assert torch.allclose(value_targets(r, v, m, "lambda", gamma=gamma, lam=0.0),
                          value_targets(r, v, m, "nstep", gamma=gamma, n=1), atol=1e-10)
    assert torch.allclose(value_targets(r, v, m, "nstep", gamma=gamma, n=4), value_targets(r, v, m, "mc", gamma=gamma))
    assert set(VALUE_TARGETS) == {"gae", "nstep", "mc", "lambda"}


def test_hand_case_nstep_does_not_bootstrap_after_eos():
    # one response of 3 tokens, reward 1 at the end, critic says 0.5 everywhere (also in padding)
    r = torch.tensor([[0., 0., 1., 0.]])
    v = torch.full((1, 4), 0.5)
    m = torch.tensor([[1., 1., 1., 0.]])
    assert torch.allclose(value_targets(r, v, m, "nstep", n=2), torch.tensor([[0.5, 1.0, 1.0, 0.0]]))
    assert torch.allclose(value_targets(r, v, m, "nstep", n=1), torch.tensor([[0.5, 0.5, 1.0, 0.0]]))
    adv, ret = token_advantages(r, v, m, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[0.0, 0.0, 0.5, 0.0]]))
    adv1, _ = token_advantages(r, v, m, lam=1.0)                  # MC minus V
    assert torch.allclose(adv1, torch.tensor([[0.5, 0.5, 0.5, 0.0]]))


def test_nan_in_padding_and_empty_inputs_stay_finite():
    r = torch.tensor([[1., float("nan")], [0.0, 0.0]])
    v = torch.tensor([[0.2, float("inf")], [0.1, float("nan")]])
    m = torch.tensor([[1., 0.], [0., 0.]])
    for kind in VALUE_TARGETS:
        out = value_targets(r, v, m, kind)
        assert torch.isfinite(out).all() and out[0, 0] == 1.0 and (out[1] == 0).all()
    a, ret = token_advantages(r, v, m)
    assert torch.isfinite(a).all() and torch.isfinite(ret).all()
    e = torch.zeros(0, 3)
    assert value_targets(e, e, e, "lambda").shape == (0, 3)
    assert terminal_rewards(torch.zeros(0), torch.zeros(0, 3)).shape == (0, 3)
    assert most_negative_token(e, e).shape == (0,)
    assert kl_token_rewards(r, r, m, 0.1).isfinite().all()


def test_bad_inputs_are_refused_naming_the_argument():
    r = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="prefix"):
        value_targets(r, r, torch.tensor([[0., 1., 1.], [1., 1., 1.]]))
    with pytest.raises(ValueError, match="kind"):
        value_targets(r, r, torch.ones(2, 3), "td")
    with pytest.raises(ValueError, match="mask"):
        value_targets(r, r, torch.ones(2, 4))
    with pytest.raises(ValueError, match="beta"):
        kl_token_rewards(r, r, torch.ones(2, 3), -1.0)
    with pytest.raises(ValueError, match="rewards"):
        terminal_rewards(torch.zeros(2, 1), torch.ones(2, 3))
    with pytest.raises((ValueError, TypeError), match="gamma"):
        response_discounts(torch.ones(2, 3), 1.5)


def test_terminal_rewards_and_discounts_hand_case():
    out = terminal_rewards(torch.tensor([2., 3., 5.]), MASK)
    assert torch.equal(out, torch.tensor([[0., 0., 2., 0.], [0., 0., 0., 3.], [5., 0., 0., 0.]]))
    d = response_discounts(MASK, 0.9)
    assert torch.allclose(d, torch.tensor([[.9, .9, 0, 0], [.9, .9, .9, 0], [0, 0, 0, 0]]))


def test_kl_token_rewards_sum_to_sequence_log_ratio():
    g = torch.Generator().manual_seed(3)
    lp, lq = -torch.rand(3, 4, generator=g), -torch.rand(3, 4, generator=g)
    R = torch.tensor([1.0, 0.0, 0.5])
    out = kl_token_rewards(lp, lq, MASK, 0.1, R)
    seq = ((lp - lq) * MASK).sum(-1)
    assert torch.allclose(out.sum(-1), R - 0.1 * seq)
    assert (out[MASK == 0] == 0).all()


def test_chain_rule_of_kl_by_exact_enumeration():
    """Sum over tokens of the exact next-token KL, averaged over pi, equals the sequence KL (and so does k1)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=4, block_size=5, n_layer=1, n_head=1, n_embd=8)
    pi, ref = GPT(cfg), GPT(cfg)
    with torch.no_grad():
        for p in pi.parameters():
            p.mul_(20)                                         # sharpen pi so the KL is sizeable
    prompt = torch.tensor([[2]])
    # enumerate all responses of exactly 3 tokens from the 4-token vocabulary (no eos)
    seqs = torch.cartesian_prod(*[torch.arange(4)] * 3)
    P = prompt.expand(len(seqs), 1)
    ids = torch.cat([P, seqs], 1)
    with torch.no_grad():
        lp = torch.log_softmax(pi(ids)[:, :3], -1).gather(-1, seqs[..., None]).squeeze(-1)
        lq = torch.log_softmax(ref(ids)[:, :3], -1).gather(-1, seqs[..., None]).squeeze(-1)
    prob = lp.sum(-1).exp()
    assert abs(float(prob.sum()) - 1) < 1e-5
    seq_kl = float((prob * (lp.sum(-1) - lq.sum(-1))).sum())
    from rlkit.llm import Rollout
    ro = Rollout(prompt_ids=P, prompt_mask=torch.ones_like(P, dtype=torch.bool), response_ids=seqs,
                 mask=torch.ones(len(seqs), 3), logprobs=lp, model_logprobs=lp,
                 finished=torch.zeros(len(seqs), dtype=torch.bool))
    chain = float((prob * token_kl_exact(pi, ref, ro).sum(-1)).sum())
    k1 = float((prob * (-kl_token_rewards(lp, lq, torch.ones_like(lp), 1.0)).sum(-1)).sum())
    assert seq_kl > 0.05
    assert abs(chain - seq_kl) < 1e-4 and abs(k1 - seq_kl) < 1e-4


def test_digit_rewards_have_the_optimum_of_exact_match():
    p = Problem("37+45=", "82")
    assert digit_rewards("82\n", p) == [1 / 3, 1 / 3, 1 / 3]
    assert digit_rewards("72\n", p) == [0.0, 1 / 3, 1 / 3]
    assert digit_rewards("821\n", p) == [1 / 3, 1 / 3, 0.0, 0.0]
    assert digit_rewards("8\n", p) == [1 / 3, 0.0]
    # exhaustive over all responses of <= 3 tokens on a small alphabet: sum == 1 iff exact match
    alphabet = "1278\n"
    rng = random.Random(0)
    for _ in range(2000):
        L = rng.randint(1, 4)
        s = "".join(rng.choice(alphabet) for _ in range(L))
        cut = s.split("\n")[0] if "\n" in s else None
        text = s[:s.index("\n") + 1] if "\n" in s else s
        total = sum(digit_rewards(text, p))
        exact = cut is not None and exact_match(cut, p) == 1.0
        assert (abs(total - 1) < 1e-12) == exact, text
        assert total <= 1 + 1e-12


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_pretrained()
    model.eval()
    return model, tok


def _rollout(model, tok, problems, seed=0):
    ids, m = encode_prompts(problems, tok)
    return sample(model, ids, m, max_new_tokens=ADDITION.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                  generator=torch.Generator().manual_seed(seed))


def test_dense_rewards_first_wrong_token_and_most_negative(tiny):
    model, tok = tiny
    probs = [Problem("37+45=", "82"), Problem("58+67=", "125"), Problem("10+10=", "20")]
    texts = ["72", "115", "20"]
    ids = torch.zeros(3, 5, dtype=torch.long)
    m = torch.zeros(3, 5)
    for i, t in enumerate(texts):
        e = tok.encode(t, eos=True)
        ids[i, :len(e)] = torch.tensor(e)
        m[i, :len(e)] = 1
    d = dense_rewards(ADDITION, tok, ids, m, probs)
    assert torch.allclose(d[0], torch.tensor([0, 1 / 3, 1 / 3, 0, 0]))
    assert torch.allclose(d[1], torch.tensor([.25, 0, .25, .25, 0]))
    assert torch.allclose(d.sum(-1), torch.tensor([2 / 3, 0.75, 1.0]))
    assert first_wrong_token(tok, ids, m, probs).tolist() == [0, 1, -1]
    adv = torch.tensor([[-1., 0., 0., 0., 0.], [0.2, -0.5, -0.5, 0, 0], [0.1, 0.1, 0.1, 0, 0]])
    assert most_negative_token(adv, m).tolist() == [0, -1, -1]          # ties -> no single token
    assert most_negative_token(adv + torch.tensor([0, 0, 1e-3, 0, 0]), m).tolist() == [0, 1, -1]
    assert most_negative_token(adv + torch.tensor([0, 0, 1e-3, 0, 0]), m, tol=1e-2).tolist() == [0, -1, -1]


def test_exact_match_values_agree_with_monte_carlo_and_a_slow_product(tiny):
    model, tok = tiny
    probs = ADDITION.problems(24, seed=4, split="test")
    ro = _rollout(model, tok, probs)
    exact = exact_match_values(model, tok, ro, probs)
    # slow: the product of the model's probabilities of the remaining answer tokens, prefix by prefix
    for i in range(4):
        p = probs[i]
        tgt = tok.encode(p.answer, eos=True)
        for t in range(int(ro.mask[i].sum())):
            resp = ro.response_ids[i, :t].tolist()
            if resp != tgt[:t] or t >= len(tgt):
                assert exact[i, t] == 0
                continue
            ids = torch.tensor([tok.encode(p.prompt) + tgt])
            with torch.no_grad():
                lp = torch.log_softmax(model(ids)[0], -1)
            P = len(p.prompt)
            want = math.exp(sum(float(lp[P - 1 + s, tgt[s]]) for s in range(t, len(tgt))))
            assert abs(float(exact[i, t]) - want) < 1e-4
    # MC with 400 continuations of the first-token prefixes, within 4.5 binomial standard errors
    pre = [tok.decode(ro.response_ids[i, :1]) for i in range(len(probs))]
    keep = [i for i in range(len(probs)) if ro.mask[i].sum() > 1]
    k = 400
    mc, se = mc_prefix_values(model, tok, ADDITION, [probs[i] for i in keep], [pre[i] for i in keep], k,
                              generator=torch.Generator().manual_seed(1))
    v = exact[keep, 1]
    sd = torch.sqrt(torch.clamp(v * (1 - v), min=1.0 / k) / k)
    assert ((mc - v).abs() <= 4.5 * sd).all(), (mc, v)
    assert se.shape == mc.shape and (se >= 0).all()


def test_mc_prefix_values_with_the_token_checker_counts_only_the_rewards_to_come(tiny):
    model, tok = tiny
    p = ADDITION.problems(1, seed=0, split="test")
    full, _ = mc_prefix_values(model, tok, ADDITION, p, [""], 64, token_checker=True,
                               generator=torch.Generator().manual_seed(0))
    pre = p[0].answer[:1]
    rest, _ = mc_prefix_values(model, tok, ADDITION, p, [pre], 64, token_checker=True,
                               generator=torch.Generator().manual_seed(0))
    L = len(p[0].answer) + 1
    assert 0 <= float(rest) <= (L - 1) / L + 1e-6 and 0 <= float(full) <= 1 + 1e-6


def test_hidden_states_and_hidden_value_head(tiny):
    model, tok = tiny
    ids, m = encode_prompts(ADDITION.problems(3, seed=1), tok)
    logits, h = model(ids, attention_mask=m, return_hidden=True)
    assert torch.allclose(logits, model(ids, attention_mask=m))
    assert torch.allclose(logits, h @ model.wte.weight.T, atol=1e-5)
    assert h.shape == (*ids.shape, model.config.n_embd)
    head = HiddenValueHead(copy.deepcopy(model), init=0.25)
    assert torch.allclose(head(ids, attention_mask=m), torch.full(ids.shape, 0.25))
    frozen = HiddenValueHead(copy.deepcopy(model), freeze_body=True)
    assert [n for n, p in frozen.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]
    ro = _rollout(model, tok, ADDITION.problems(3, seed=1))
    assert state_values(head, ro).shape == ro.mask.shape


def test_critic_settings_and_train_with_dense_rewards_and_value_targets(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="target"):              # the critic's settings belong to TokenGAE
        TokenGAE(target="td")
    with pytest.raises(ValueError, match="target_lam"):
        TokenGAE(target_lam=1.5)
    with pytest.raises((ValueError, TypeError), match="n must be"):
        TokenGAE(n=0)
    from rlkit.llm import Task
    bare = Task("bare", ADDITION._generate, max_new_tokens=5)
    with pytest.raises(ValueError, match="token checker"):
        train(copy.deepcopy(model), tok, bare, RLConfig(algo="ppo", steps=1), hooks=[DenseRewards()])
    ev = ADDITION.problems(8, seed=0, split="test")
    for kw in (dict(hooks=[DenseRewards()]), dict(advantages=TokenGAE(target="nstep", n=2)),
               dict(advantages=TokenGAE(target="lambda", target_lam=0.5)), dict(advantages=TokenGAE(target="mc"))):
        cfg = RLConfig(algo="ppo", steps=2, prompts_per_step=4, group_size=2, eval_every=2, seed=0)
        r = train(copy.deepcopy(model), tok, ADDITION, cfg, eval_problems=ev, **kw)
        assert len(r.history["reward"]) == 2 and all(math.isfinite(x) for x in r.history["loss"])
    r = train(copy.deepcopy(model), tok, ADDITION, RLConfig(algo="grpo", steps=1, prompts_per_step=2, group_size=2),
              hooks=[DenseRewards()], eval_problems=ev)
    assert len(r.history["reward"]) == 1


def test_default_ppo_is_unchanged_by_value_target_lambda_at_lam(tiny):
    """TokenGAE(target="lambda") with target_lam = lam is GAE's target: the same run, number for number."""
    model, tok = tiny
    ev = ADDITION.problems(8, seed=0, split="test")
    base = RLConfig(algo="ppo", steps=2, prompts_per_step=4, group_size=2, eval_every=2, seed=1)
    a = train(copy.deepcopy(model), tok, ADDITION, base, hooks=[KLPenalty()], eval_problems=ev)
    b = train(copy.deepcopy(model), tok, ADDITION, base, hooks=[KLPenalty()],
              advantages=TokenGAE(target="lambda", target_lam=TokenGAE().lam), eval_problems=ev)
    for k in ("loss", "reward", "kl"):
        assert all(abs(x - y) < 1e-5 for x, y in zip(a.history[k], b.history[k])), k
