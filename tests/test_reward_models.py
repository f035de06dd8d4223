"""Tests of rlkit.reward_models against independent computations (loops, closed forms, identities,
Monte Carlo), plus the two outcomes chapter 5 relies on: optimising a learned reward without a KL
penalty raises the proxy and lowers the true reward; with the penalty the true reward holds."""
import itertools
import math

import pytest
import torch

from rlkit.reward_models import (
    ResponseBandit,
    RewardNet,
    best_of_n,
    bradley_terry_loss,
    enumerate_responses,
    fit_bradley_terry,
    fit_reward_model,
    flattery_bandit,
    kl_regularised_optimum,
    optimise_policy,
    policy_summary,
    simulate_preferences,
    token_counts,
)

F64 = torch.float64
torch.set_num_threads(1)  # tiny tensors: one thread is faster on a shared machine (see book/setup.md)


# ------------------------------------------------------------------------------ response space

def test_enumerate_responses_matches_itertools_product():
    got = enumerate_responses(3, 4)
    want = torch.tensor(list(itertools.product(range(3), repeat=4)))
    assert got.dtype == torch.int64
    assert torch.equal(got, want)


def test_token_counts_by_loop():
    g = torch.Generator().manual_seed(0)
    resp = torch.randint(0, 5, (7, 6), generator=g)
    got = token_counts(resp, 5)
    for i in range(7):
        for v in range(5):
            assert got[i, v] == sum(int(t) == v for t in resp[i])
    assert got.dtype == torch.float32


def test_flattery_bandit_hand_worked_rewards_and_reference():
    task = flattery_bandit(length=3, p_flattery=0.2, quality=(0.0, 1.0), content_probs=(1, 3),
                           flattery_gain=0.5, flattery_budget=1, flattery_penalty=2.0)
    assert isinstance(task, ResponseBandit)
    assert task.responses.shape == (27, 3) and task.token_names == ("c0", "c1", "F")
    row = {tuple(r.tolist()): i for i, r in enumerate(task.responses)}
    # (c1, c1, c0): content (1 + 1 + 0) / 3, no flattery
    assert task.true_reward[row[(1, 1, 0)]].item() == pytest.approx(2 / 3)
    # (F, c1, c1): content 2/3, one flattery token inside the budget: + 0.5
    assert task.true_reward[row[(2, 1, 1)]].item() == pytest.approx(2 / 3 + 0.5)
    # (F, F, F): no content, 3 * 0.5 - 2 * (3 - 1)^2
    assert task.true_reward[row[(2, 2, 2)]].item() == pytest.approx(1.5 - 8.0)
    # reference: independent tokens with probabilities (0.8 * 1/4, 0.8 * 3/4, 0.2)
    p_tok = [0.2, 0.6, 0.2]
    for r, i in row.items():
        want = math.prod(p_tok[t] for t in r)
        assert task.ref_logprobs[i].exp().item() == pytest.approx(want, rel=1e-5)


def test_flattery_bandit_defaults_make_the_collapse_rare_under_the_reference():
    task = flattery_bandit()
    p = task.ref_logprobs.exp()
    n_f = task.features[:, -1]
    assert p.sum().item() == pytest.approx(1.0, abs=1e-5)
    assert p[n_f >= 4].sum().item() < 1e-3               # the reward model will hardly ever see it
    assert task.true_reward[n_f == 6].max() < task.true_reward[n_f == 0].min()


# ------------------------------------------------------------------------------ reward model

def test_bradley_terry_loss_matches_formula_and_is_stable():
    rc = torch.tensor([1.0, 0.0, -2.0])
    rr = torch.tensor([0.0, 0.0, 1.0])
    want = -torch.log(torch.sigmoid(rc - rr)).mean()
    assert bradley_terry_loss(rc, rr).item() == pytest.approx(want.item(), rel=1e-6)
    big = bradley_terry_loss(torch.tensor([50.0, -50.0]), torch.tensor([-0.0, 0.0]))
    assert torch.isfinite(big) and big.item() == pytest.approx(25.0, rel=1e-4)


def test_simulate_preferences_frequency_is_bradley_terry():
    g = torch.Generator().manual_seed(1)
    n = 40_000
    a = torch.full((n,), 0.3)
    b = torch.zeros(n)
    freq = simulate_preferences(a, b, scale=0.5, generator=g).float().mean().item()
    want = 1 / (1 + math.exp(-0.6))
    assert abs(freq - want) < 4 * math.sqrt(want * (1 - want) / n)


def test_fit_bradley_terry_recovers_a_linear_reward():
    g = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    w = torch.tensor([1.0, -2.0, 0.5])
    x = torch.randn(600, 3, generator=g)
    y = torch.randn(600, 3, generator=g)
    a_wins = simulate_preferences(x @ w, y @ w, scale=0.3, generator=g)
    chosen = torch.where(a_wins[:, None], x, y)
    rejected = torch.where(a_wins[:, None], y, x)
    net = RewardNet(3, hidden=16)
    losses = fit_bradley_terry(net, chosen, rejected, epochs=150, lr=1e-2)
    assert losses[-1] < losses[0]
    test = torch.randn(500, 3, generator=g)
    with torch.no_grad():
        pred = net(test)
    corr = torch.corrcoef(torch.stack([pred, test @ w]))[0, 1].item()
    assert corr > 0.95


def test_reward_net_shape_checks():
    net = RewardNet(4)
    assert net(torch.zeros(2, 5, 4)).shape == (2, 5)
    with pytest.raises(ValueError, match="x must have shape"):
        net(torch.zeros(3, 5))
    with pytest.raises(TypeError):
        net(torch.zeros(3, 4, dtype=torch.int64))


# ------------------------------------------------------------------------------ the optimum

def _objective(logp, ref, r, beta):
    p = logp.exp()
    return (p * r).sum() - beta * (p * (logp - ref)).sum()


def test_kl_regularised_optimum_beats_random_policies_and_equals_beta_log_z():
    g = torch.Generator().manual_seed(3)
    ref = torch.log_softmax(torch.randn(9, generator=g, dtype=F64), -1)
    r = torch.randn(9, generator=g, dtype=F64)
    for beta in (0.1, 1.0, 5.0):
        opt = kl_regularised_optimum(ref, r, beta)
        j_opt = _objective(opt, ref, r, beta)
        # Gibbs variational principle: max value = beta log E_ref[exp(r / beta)]
        want = beta * math.log(sum(math.exp(ref[i].item() + r[i].item() / beta) for i in range(9)))
        assert j_opt.item() == pytest.approx(want, rel=1e-9)
        for _ in range(50):
            other = torch.log_softmax(opt + 0.5 * torch.randn(9, generator=g, dtype=F64), -1)
            assert _objective(other, ref, r, beta) <= j_opt + 1e-12


def test_kl_regularised_optimum_limits_and_stability():
    ref = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    r = torch.tensor([0.0, 1.0, -1.0])
    assert torch.allclose(kl_regularised_optimum(ref, r, math.inf), ref, atol=1e-6)
    assert torch.allclose(kl_regularised_optimum(ref, r, 1e6).exp(), ref.exp(), atol=1e-5)
    sharp = kl_regularised_optimum(ref, torch.tensor([0.0, 50.0, -50.0]), 1e-3)
    assert torch.isfinite(sharp[:2]).all() and sharp[1].exp().item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="beta"):
        kl_regularised_optimum(ref, r, 0.0)
    with pytest.raises(ValueError, match="reward"):
        kl_regularised_optimum(ref, r[:2], 1.0)


def test_policy_summary_by_hand():
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.25, 0.25, 0.5])
    s = policy_summary(p.log(), q.log(), true=torch.tensor([1.0, 3.0, 100.0]))
    assert s["kl"] == pytest.approx(math.log(2), rel=1e-6)
    assert s["true"] == pytest.approx(2.0, rel=1e-6)


# ------------------------------------------------------------------------------ best of n

def test_best_of_n_against_monte_carlo_and_the_kl_formula():
    g = torch.Generator().manual_seed(4)
    ref = torch.log_softmax(torch.randn(6, generator=g, dtype=F64), -1)
    proxy = torch.randn(6, generator=g, dtype=F64)          # no ties
    assert torch.allclose(best_of_n(ref, proxy, 1), ref)
    n = 4
    bon = best_of_n(ref, proxy, n).exp()
    draws = torch.multinomial(ref.exp(), 200_000 * n, replacement=True, generator=g).view(-1, n)
    kept = draws.gather(1, proxy[draws].argmax(1, keepdim=True)).squeeze(1)
    freq = torch.bincount(kept, minlength=6).double() / kept.numel()
    assert torch.allclose(freq, bon, atol=4e-3)
    kl = (bon * (bon.log() - ref)).sum().item()
    assert kl < math.log(n) - (n - 1) / n                      # the bound (Beirami et al., 2024) ...
    # ... which is reached only in the continuous limit: many responses, each unlikely, no ties
    m = 20_000
    ref_fine = torch.full((m,), -math.log(m), dtype=F64)
    bon_fine = best_of_n(ref_fine, torch.randn(m, generator=g, dtype=F64), n).exp()
    kl_fine = (bon_fine * (bon_fine.log() - ref_fine)).sum().item()
    assert kl_fine == pytest.approx(math.log(n) - (n - 1) / n, abs=1e-3)


def test_best_of_n_with_ties_shares_mass_and_kl_is_below_the_bound():
    ref = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64))
    proxy = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=F64)
    bon = best_of_n(ref, proxy, 2).exp()
    # P(at least one of the two draws is in {0, 1}) = 1 - 0.7^2 = 0.51, shared 1:2
    assert torch.allclose(bon, torch.tensor([0.17, 0.34, 0.49 * 3 / 7, 0.49 * 4 / 7], dtype=F64))
    kl = (bon * (bon.log() - ref)).sum().item()
    assert kl < math.log(2) - 0.5


# ------------------------------------------------------------------------------ optimisation

def test_optimise_policy_exact_converges_to_the_closed_form():
    g = torch.Generator().manual_seed(5)
    ref = torch.log_softmax(torch.randn(12, generator=g), -1)
    r = torch.randn(12, generator=g)
    logits, hist = optimise_policy(ref, r, beta=0.5, steps=600, lr=0.05, record_every=100, true=-r)
    target = kl_regularised_optimum(ref, r, 0.5)
    assert torch.allclose(torch.softmax(logits, -1), target.exp(), atol=1e-4)
    assert hist["step"] == [0, 100, 200, 300, 400, 500, 600]
    assert hist["kl"][0] == pytest.approx(0.0, abs=1e-6)
    assert hist["true"][-1] == pytest.approx(-hist["proxy"][-1], rel=1e-6)


def test_optimise_policy_sampled_estimate_moves_towards_the_optimum():
    g = torch.Generator().manual_seed(6)
    ref = torch.log_softmax(torch.zeros(5), -1)
    r = torch.tensor([0.0, 0.5, 1.0, 0.2, -1.0])
    logits, hist = optimise_policy(ref, r, beta=0.3, steps=400, lr=0.05, samples=64, generator=g, record_every=400)
    target = kl_regularised_optimum(ref, r, 0.3)
    from rlkit.divergences import kl_categorical
    assert hist["proxy"][-1] > hist["proxy"][0] + 0.5
    assert float(kl_categorical(target, logits)) < 0.05


def test_optimise_policy_validates():
    ref = torch.zeros(3)
    with pytest.raises(ValueError, match="beta"):
        optimise_policy(ref, torch.zeros(3), beta=-1.0)
    with pytest.raises(ValueError, match="proxy"):
        optimise_policy(ref, torch.zeros(4))
    with pytest.raises(ValueError, match="samples"):
        optimise_policy(ref, torch.zeros(3), samples=1)


# ------------------------------------------------------------------------------ the chapter's claim

def test_reward_hacking_without_penalty_and_not_with_it():
    torch.manual_seed(0)
    task = flattery_bandit()
    ref_true = policy_summary(task.ref_logprobs, task.ref_logprobs, true=task.true_reward)["true"]
    _, proxy = fit_reward_model(task, generator=torch.Generator().manual_seed(0))
    _, free = optimise_policy(task.ref_logprobs, proxy, beta=0.0, steps=300, lr=0.05, record_every=300,
                              true=task.true_reward)
    _, held = optimise_policy(task.ref_logprobs, proxy, beta=2.0, steps=300, lr=0.05, record_every=300,
                              true=task.true_reward)
    assert free["proxy"][-1] - free["proxy"][0] > 3.0          # the proxy soars ...
    assert free["true"][-1] < ref_true - 1.0                    # ... while the true reward collapses
    assert held["true"][-1] >= ref_true - 0.02                  # the KL penalty keeps it
    assert held["kl"][-1] < 1.0


def test_fit_reward_model_depends_only_on_its_generator():
    task = flattery_bandit(length=3)
    torch.manual_seed(1)
    net_a, proxy_a = fit_reward_model(task, n_pairs=200, epochs=20, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(999)
    torch.rand(10)
    _, proxy_b = fit_reward_model(task, n_pairs=200, epochs=20, generator=torch.Generator().manual_seed(7))
    assert torch.equal(proxy_a, proxy_b)
    # standardised under the reference policy: mean 0, sd 1
    p = task.ref_logprobs.exp()
    assert (p * proxy_a).sum().item() == pytest.approx(0.0, abs=1e-5)
    assert (p * proxy_a ** 2).sum().item() == pytest.approx(1.0, rel=1e-4)
    chosen, rejected = net_a.pairs
    assert chosen.shape == rejected.shape == (200,)
    with pytest.raises(TypeError, match="ResponseBandit"):
        fit_reward_model("not a task")
