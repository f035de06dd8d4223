"""Tests of rlkit.llm.offline (chapter 21) on the shipped tiny model: logs, learners, critics and the
exact on-policy value, against independent computations."""
import math

import pytest
import torch

from rlkit.llm import ADDITION, encode_prompts, exact_match_values, load_pretrained, sample, token_logprobs
from rlkit.llm.offline import (
    LogDataset,
    RewardProbe,
    TokenCritic,
    answer_probability,
    collect_logs,
    fit_token_critic,
    iql_token_weights,
    prompt_baselines,
    q_logits_processor,
    response_features,
    response_logprobs,
    train_weighted_bc,
)


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model, tok = load_pretrained()
    model.eval()
    probs = ADDITION.problems(24, seed=3, split="train")
    logs = collect_logs(model, tok, ADDITION, probs, temperatures=(1.0, 1.5), samples_per_temperature=2,
                        generator=torch.Generator().manual_seed(0))
    return model, tok, probs, logs


def test_logs_layout_and_behaviour_logprobs(setup):
    model, tok, probs, logs = setup
    assert len(logs) == 24 * 2 * 2
    assert logs.prompt_index.tolist() == [j for j in range(24) for _ in range(4)]
    assert logs.temperature.tolist() == [t for _ in range(24) for t in (1.0, 1.0, 1.5, 1.5)]
    assert all(logs.problems[i] is probs[j] for i, j in enumerate(logs.prompt_index.tolist()))
    texts = tok.decode_batch(logs.response_ids)
    assert torch.equal(logs.rewards, ADDITION.score(texts, logs.problems))
    # stored log-probs are those of the sampling temperature of each row, recomputed independently
    for t in (1.0, 1.5):
        sel = logs.temperature == t
        lp = token_logprobs(model, logs.prompt_ids[sel], logs.prompt_mask[sel], logs.response_ids[sel],
                            logs.mask[sel], temperature=t)
        assert torch.allclose(lp, logs.behaviour_logprobs[sel], atol=1e-5)
    assert torch.allclose(response_logprobs(model, logs, temperature=1.0)[logs.temperature == 1.0],
                          logs.behaviour_logprobs[logs.temperature == 1.0], atol=1e-5)
    sub = logs.select(torch.tensor([3, 0]))
    assert len(sub) == 2 and sub.problems[0] is logs.problems[3]
    assert len(logs.select(logs.rewards > 0)) == int(logs.rewards.sum())
    with pytest.raises(ValueError):
        LogDataset(logs.prompt_ids, logs.prompt_mask, logs.response_ids, logs.mask, logs.behaviour_logprobs,
                   logs.rewards[:3], logs.temperature, logs.prompt_index, logs.problems)


def test_prompt_baselines_slow_loop(setup):
    _, _, _, logs = setup
    b = prompt_baselines(logs)
    r, g = logs.rewards.tolist(), logs.prompt_index.tolist()
    for i in range(len(logs)):
        others = [r[j] for j in range(len(logs)) if g[j] == g[i] and j != i]
        assert math.isclose(float(b[i]), sum(others) / len(others), abs_tol=1e-6)
    full = prompt_baselines(logs, leave_one_out=False)
    assert math.isclose(float(full[0]), sum(r[:4]) / 4, abs_tol=1e-6)


def test_answer_probability_is_the_exact_value(setup):
    model, tok, probs, _ = setup
    v = answer_probability(model, tok, probs)
    ids, m = encode_prompts(probs, tok)
    ro = sample(model, ids, m, max_new_tokens=ADDITION.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                generator=torch.Generator().manual_seed(1))
    assert torch.allclose(v, exact_match_values(model, tok, ro, probs)[:, 0], atol=1e-5)
    # Monte Carlo at temperature 1.5 agrees with the exact value within 5 standard errors
    rows = [p for p in probs[:4] for _ in range(400)]
    ids, m = encode_prompts(rows, tok)
    ro = sample(model, ids, m, max_new_tokens=ADDITION.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                temperature=1.5, generator=torch.Generator().manual_seed(2))
    mc = ADDITION.score(tok.decode_batch(ro.response_ids), rows).view(4, 400).mean(1)
    exact = answer_probability(model, tok, probs[:4], temperature=1.5)
    se = torch.sqrt(exact * (1 - exact) / 400).clamp_min(0.01)
    assert bool(((mc - exact).abs() < 5 * se).all()), (mc, exact)


def test_weighted_bc_filtered_equals_bc_on_successes(setup):
    _, _, _, logs = setup
    good = logs.select(logs.rewards > 0)
    a, _ = load_pretrained()
    b, _ = load_pretrained()
    # one full-batch step: the self-normalised weighted loss with w = r is BC on the successes
    la = train_weighted_bc(a, logs, logs.rewards, steps=1, batch_size=10_000, seed=0)
    lb = train_weighted_bc(b, good, None, steps=1, batch_size=10_000, seed=0)
    assert math.isclose(la[0], lb[0], rel_tol=1e-5)
    c, _ = load_pretrained()
    assert math.isnan(train_weighted_bc(c, logs, torch.zeros(len(logs)), steps=1)[0])
    with pytest.raises(ValueError):
        train_weighted_bc(c, logs, -torch.ones(len(logs)), steps=1)


def test_features_critic_and_cql(setup):
    model, tok, _, logs = setup
    z = response_features(model, logs)
    ids = torch.cat([logs.prompt_ids[:2], logs.response_ids[:2]], 1)
    att = torch.cat([logs.prompt_mask[:2], torch.ones_like(logs.response_ids[:2], dtype=torch.bool)], 1)
    _, h = model(ids, attention_mask=att, return_hidden=True)
    P = logs.prompt_ids.shape[1]
    assert torch.allclose(z[0, 0], h[0, P - 1], atol=1e-5)
    assert float(z[logs.mask == 0].abs().sum()) == 0.0
    unseen = torch.ones(tok.vocab_size, dtype=torch.bool)
    unseen[logs.response_ids[logs.mask > 0].unique()] = False
    tops = {}
    for alpha in (0.0, 1.0):
        critic = TokenCritic(model.config.n_embd, tok.vocab_size, seed=0)
        hist = fit_token_critic(critic, z, logs, cql_alpha=alpha, steps=150, lr=1e-2)
        assert hist["q_loss"][-1] < hist["q_loss"][0]
        with torch.no_grad():
            q, _ = critic(z[logs.mask > 0])
        tops[alpha] = float(q[:, unseen].max(-1).values.mean())
    assert tops[1.0] < 0.0 < tops[0.0]                     # CQL pushes never-logged tokens down
    w = iql_token_weights(critic, z, logs, beta=0.1)
    assert w.shape == logs.mask.shape and float(w[logs.mask == 0].abs().sum()) == 0.0
    assert float(w.max()) <= 100.0 + 1e-4
    # the Q processor decodes argmax Q
    proc = q_logits_processor(critic, model)
    out = proc(logs.prompt_ids[:3], logs.prompt_mask[:3], torch.zeros(3, tok.vocab_size))
    with torch.no_grad():
        q0, _ = critic(z[:3, 0])
    assert torch.allclose(out, q0, atol=1e-5)


def test_reward_probe_learns(setup):
    model, _, _, logs = setup
    probe = RewardProbe(model)
    losses = probe.fit(logs, steps=100)
    assert losses[-1] < losses[0]
    p = probe.predict(logs.prompt_ids, logs.prompt_mask, logs.response_ids, logs.mask)
    assert p.shape == (len(logs),) and bool(((p > 0) & (p < 1)).all())
