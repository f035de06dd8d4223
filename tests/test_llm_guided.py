"""Tests of rlkit.llm.guided (chapter 20: value-guided decoding).

Independent computations: brute-force enumeration of every response of a token tree (a slow loop over
leaves), chapter 5's sequence-level closed forms (kl_regularised_optimum, the exact best_of_n), hand-worked
guidance values, a masked softmax built by hand, and a per-row loop for the KL.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from rlkit.llm import ADDITION, encode_prompts, load_pretrained, sample, token_logprobs
from rlkit.llm.guided import (
    GuidedProcessor,
    SuccessCritic,
    best_of_n_binary,
    fit_success_critic,
    guidance_term,
    guided_logits,
    guided_token_kl,
    kl_optimum_binary,
    log_normaliser,
    random_token_tree,
    tree_guided_logprobs,
    tree_values,
)
from rlkit.reward_models import best_of_n, kl_regularised_optimum


@pytest.fixture(scope="module")
def lm():
    m, tok = load_pretrained()
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m, tok


def leaf_logprobs_slow(logits, K, D):
    """log pi(y) of every leaf by an explicit loop over token sequences."""
    out = []
    for seq in itertools.product(range(K), repeat=D):
        lp, node = 0.0, 0
        for d, v in enumerate(seq):
            lp += float(F.log_softmax(logits[d][node], -1)[v])
            node = node * K + v
        out.append(lp)
    return torch.tensor(out, dtype=torch.float64)


# ------------------------------------------------------------------ guidance arithmetic

def test_guidance_term_hand_values():
    p = torch.tensor([[0.0, 0.25, 1.0]], dtype=torch.float64)
    lp = p.log()
    eta = 2.0
    soft = guidance_term(lp, "soft", eta)
    assert torch.allclose(soft, torch.log(1 - p + p * math.exp(eta)))
    assert torch.allclose(guidance_term(lp, "value", eta), eta * p)
    ls = guidance_term(lp, "log_success", eta)
    assert torch.isneginf(ls[0, 0]) and math.isclose(float(ls[0, 1]), 2 * math.log(0.25))
    for kind in ("soft", "value", "log_success"):
        assert torch.equal(guidance_term(lp, kind, 0.0), torch.zeros_like(lp))     # eta = 0: no guidance, no NaN
    # the soft term is eta * V_beta with beta = 1 / eta, and tends to log p + eta as eta grows (Bayes + a constant)
    big = guidance_term(torch.log(torch.tensor([0.3, 0.6])), "soft", 60.0)
    assert torch.allclose(big - 60.0, torch.log(torch.tensor([0.3, 0.6])), atol=1e-6)


def test_guidance_input_errors_name_the_argument():
    with pytest.raises(ValueError, match="log_success"):
        guidance_term(torch.tensor([0.5]), "soft", 1.0)                 # a probability, not a log-probability
    with pytest.raises(ValueError, match="kind"):
        guidance_term(torch.tensor([-0.5]), "ppo", 1.0)
    with pytest.raises(ValueError, match="eta"):
        guidance_term(torch.tensor([-0.5]), "soft", -1.0)
    with pytest.raises(ValueError, match="next_values"):
        guided_logits(torch.zeros(2, 3), torch.zeros(2, 4), 1.0)
    with pytest.raises(ValueError, match="next_values"):
        guided_logits(torch.zeros(1, 2), torch.tensor([[float("nan"), 0.0]]), 1.0)


def test_log_normaliser_matches_a_hand_sum_and_is_finite_where_undefined():
    logits = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64)          # pi = (1/4, 3/4)
    nxt = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([0.5], dtype=torch.float64)
    want = math.log(0.25 * math.exp(2 * (0 - 0.5)) + 0.75 * math.exp(2 * (1 - 0.5)))
    assert math.isclose(float(log_normaliser(logits, nxt, v, 2.0)), want, rel_tol=1e-12)
    dead = log_normaliser(torch.zeros(1, 3), torch.full((1, 3), float("-inf")), torch.tensor([float("-inf")]), 1.0)
    assert float(dead) == 0.0
    assert log_normaliser(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0), 1.0).shape == (0,)


# ------------------------------------------------------------------ the exact tree

@pytest.mark.parametrize("K,D", [(2, 3), (3, 4)])
def test_tree_values_against_enumeration(K, D):
    logits, R = random_token_tree(K, D, generator=torch.Generator().manual_seed(K * 10 + D))
    base = leaf_logprobs_slow(logits, K, D)
    lp0, _ = tree_guided_logprobs(logits, tree_values(logits, R, "mean"), 0.0)
    assert torch.allclose(lp0, base, atol=1e-12)
    for beta in (0.1, 1.0, 5.0):
        soft = tree_values(logits, R, "soft", beta)
        assert math.isclose(float(soft[0][0]), beta * float(torch.logsumexp(base + R / beta, 0)), rel_tol=1e-10)
    assert math.isclose(float(tree_values(logits, R, "mean")[0][0]), float((base.exp() * R).sum()), rel_tol=1e-10)
    assert math.isclose(float(tree_values(logits, R, "log_success")[0][0].exp()), float((base.exp() * R).sum()),
                        rel_tol=1e-10)


def test_soft_guidance_is_normalised_and_is_the_kl_optimum_token_by_token():
    K, D = 3, 3
    logits, R = random_token_tree(K, D, generator=torch.Generator().manual_seed(1))
    base = leaf_logprobs_slow(logits, K, D)
    for beta in (0.05, 0.5, 2.0):
        soft = tree_values(logits, R, "soft", beta)
        for normalise in (True, False):
            lp, log_z = tree_guided_logprobs(logits, soft, 1 / beta, normalise=normalise)
            assert all(float(z.abs().max()) < 1e-10 for z in log_z)
            assert torch.allclose(lp, kl_regularised_optimum(base, R, beta), atol=1e-10)
    # log-success with eta = 1 is Bayes' rule pi(y | S), S ~ Bernoulli(R(y))
    lp, log_z = tree_guided_logprobs(logits, tree_values(logits, R, "log_success"), 1.0)
    assert all(float(z.abs().max()) < 1e-10 for z in log_z)
    assert torch.allclose(lp, torch.log_softmax(base + R.log(), 0), atol=1e-10)


def test_mean_value_guidance_is_not_normalised_and_not_the_optimum():
    K, D = 3, 3
    logits, R = random_token_tree(K, D, generator=torch.Generator().manual_seed(2))
    base = leaf_logprobs_slow(logits, K, D)
    mean = tree_values(logits, R, "mean")
    beta = 0.2
    lp, log_z = tree_guided_logprobs(logits, mean, 1 / beta)
    assert all(bool((z > 0).all()) for z in log_z)                             # Jensen: E[e^{eta (V' - V)}] > 1
    literal, _ = tree_guided_logprobs(logits, mean, 1 / beta, normalise=False)
    assert float(literal.exp().sum()) > 1.0
    assert math.isclose(float(lp.exp().sum()), 1.0, rel_tol=1e-12)
    assert float((lp - kl_regularised_optimum(base, R, beta)).abs().max()) > 1e-3


def test_tree_input_errors():
    logits, R = random_token_tree(2, 2, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="reward"):
        tree_values(logits, R[:3])
    with pytest.raises(ValueError, match="values"):
        tree_guided_logprobs(logits, tree_values(logits, R)[:-1], 1.0)
    with pytest.raises(ValueError, match="branching"):
        random_token_tree(1, 2)
    with pytest.raises(ValueError, match="beta"):
        tree_values(logits, R, "soft", beta=0.0)


# ------------------------------------------------------------------ binary closed forms

def test_binary_closed_forms_against_enumerated_sequence_level_computations():
    g = torch.Generator().manual_seed(3)
    ref = torch.log_softmax(torch.randn(12, generator=g, dtype=torch.float64), 0)
    R = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0], dtype=torch.float64)
    p = torch.tensor([float((ref.exp() * R).sum())], dtype=torch.float64)
    for eta in (0.5, 2.0, 7.0):
        lq = kl_regularised_optimum(ref, R, 1 / eta)
        acc, kl = kl_optimum_binary(p, eta)
        assert math.isclose(float(acc), float((lq.exp() * R).sum()), rel_tol=1e-10)
        assert math.isclose(float(kl), float((lq.exp() * (lq - ref)).sum()), rel_tol=1e-9)
    for n in (1, 2, 5):
        lq = best_of_n(ref, R, n)
        acc, kl = best_of_n_binary(p, n)
        q = lq.exp()
        assert math.isclose(float(acc), float((q * R).sum()), rel_tol=1e-10)
        assert math.isclose(float(kl), float((q * (lq - ref)).where(q > 0, torch.zeros_like(q)).sum()),
                            rel_tol=1e-9, abs_tol=1e-12)
        assert float(kl) <= math.log(n) - (n - 1) / n + 1e-12
    a, kl = kl_optimum_binary(torch.tensor([0.0, 1.0]), 3.0)                  # edge cases stay finite
    assert torch.equal(a, torch.tensor([0.0, 1.0])) and torch.equal(kl, torch.zeros(2))
    with pytest.raises(ValueError, match="p_success"):
        best_of_n_binary(torch.tensor([1.5]), 2)


# ------------------------------------------------------------------ the LLM pieces

def _prompts(tok, n=8, seed=0):
    probs = ADDITION.problems(n, seed=seed, split="test")
    return probs, encode_prompts(probs, tok)


def test_processor_guides_with_bayes_and_truncates_the_base_first(lm):
    model, tok = lm
    probs, (ids, mask) = _prompts(tok)
    with torch.no_grad():
        z = model(ids, attention_mask=mask)[:, -1]
    g = torch.Generator().manual_seed(0)
    ls = torch.log(torch.rand(z.shape, generator=g))                     # an arbitrary success table

    def fn(c, cm):
        return ls[: c.shape[0]]

    for eta in (0.5, 1.0, 3.0):
        out = GuidedProcessor(fn, eta, "log_success")(ids, mask, z)
        assert torch.allclose(F.log_softmax(out, -1), F.log_softmax(F.log_softmax(z, -1) + eta * ls, -1), atol=1e-5)
    proc = GuidedProcessor(fn, 2.0, "soft", top_p=0.8)
    out = proc(ids, mask, z)
    logp = F.log_softmax(z, -1)
    srt, order = logp.sort(-1, descending=True)
    before = srt.exp().cumsum(-1) - srt.exp()
    keep = torch.zeros_like(z, dtype=torch.bool).scatter(-1, order, before < 0.8)
    assert torch.equal(torch.isfinite(out), keep)                          # support = the BASE model's top-p set
    hand = torch.log(1 - ls.exp() + ls.exp() * math.exp(2.0))
    assert torch.allclose(F.log_softmax(out, -1)[keep], F.log_softmax((logp + hand).masked_fill(~keep, -math.inf),
                                                                        -1)[keep], atol=1e-5)
    assert proc.critic_rows == ids.shape[0]
    # a row where no supported candidate can succeed is left unguided
    dead = GuidedProcessor(lambda c, cm: torch.full_like(z, -math.inf), 1.0, "log_success")(ids, mask, z)
    assert torch.allclose(dead, logp)
    with pytest.raises(ValueError, match="log_success_fn"):
        GuidedProcessor(lambda c, cm: torch.zeros(1, 2), 1.0)(ids, mask, z)


def test_critic_fits_and_guided_sampling_logprobs_are_recomputed(lm):
    model, tok = lm
    torch.manual_seed(0)
    probs = ADDITION.problems(256, seed=5, split="train")
    ids, mask = encode_prompts(probs, tok)
    ro = sample(model, ids, mask, max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id,
                generator=torch.Generator().manual_seed(1))
    r = ADDITION.score(tok.decode_batch(ro.response_ids), probs)
    critic = SuccessCritic(model, hidden=16)
    losses = fit_success_critic(critic, ro, r, steps=40, lr=1e-2)
    assert losses.shape == (40,) and float(losses[-1]) < float(losses[0])
    assert all(not p.requires_grad for p in model.parameters()) and len(list(critic.parameters())) == 4
    ls = critic.log_success(ids, mask)
    assert ls.shape == (256, tok.vocab_size) and bool((ls <= 0).all())
    proc = GuidedProcessor(critic.log_success, 1.0, "log_success", top_p=0.95)
    g = sample(model, ids[:16], mask[:16], max_new_tokens=5, eos_id=tok.eos_id, pad_id=tok.pad_id,
               generator=torch.Generator().manual_seed(2), logits_processor=proc)
    with torch.no_grad():
        again = token_logprobs(model, g.prompt_ids, g.prompt_mask, g.response_ids, g.mask, logits_processor=proc)
    assert torch.allclose(again, g.logprobs, atol=1e-5)
    # the KL against a slow per-row, per-position loop
    kl = guided_token_kl(model, g, proc)
    P = g.prompt_ids.shape[1]
    for i in range(3):
        tot = 0.0
        for t in range(int(g.mask[i].sum())):
            ctx = torch.cat([g.prompt_ids[i:i + 1], g.response_ids[i:i + 1, :t]], 1)
            cm = torch.cat([g.prompt_mask[i:i + 1], torch.ones(1, t, dtype=torch.bool)], 1)
            with torch.no_grad():
                zz = model(ctx, attention_mask=cm)[:, -1]
            lq = F.log_softmax(proc(ctx, cm, zz), -1)
            lp = F.log_softmax(zz, -1)
            q = lq.exp()
            tot += float((q * (lq - lp)).where(q > 0, torch.zeros_like(q)).sum())
        assert math.isclose(float(kl[i]), tot, rel_tol=1e-4, abs_tol=1e-6)
        assert P == g.prompt_ids.shape[1]
    assert torch.allclose(guided_token_kl(model, g, None), torch.zeros(16), atol=1e-6)
    with pytest.raises(ValueError, match="rewards"):
        fit_success_critic(critic, ro, r[:3])
