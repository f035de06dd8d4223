"""Tests of rlkit.llm.explore (chapter 22): pass@k and distinct answers against brute-force
enumeration of subsets, the diversity bonus by hand, running statistics against numpy, RND's
normalisation, the FACTS task and its grammar, the three bonus hooks of rlkit.llm.train (what each
adds, in which order), and the train_explore wrapper's contracts (every setting it does not read is
refused by name)."""
import itertools
import math
import random

import numpy as np
import pytest
import torch

from rlkit.llm import GPT, CharTokenizer, GPTConfig, Problem, RLConfig, RLResult, sequence_advantages, train
from rlkit.llm.advantages import Group
from rlkit.llm.explore import (
    FACTS,
    RND,
    DiversityBonus,
    EntropyBonus,
    ExploreConfig,
    ExploreResult,
    ModelEval,
    RNDBonus,
    RunningMeanStd,
    coverage_metrics,
    distinct_correct,
    facts_check,
    facts_exact,
    facts_format,
    group_diversity_bonus,
    pass_at_k,
    sample_groups,
    train_explore,
)
from rlkit.llm.samplers import Fresh
from rlkit.llm.sampling import sample, token_logprobs
from rlkit.llm.trainer import Hook, KLPenalty
from rlkit.objectives import aggregate


def brute_pass_at_k(flags, k):
    subsets = list(itertools.combinations(range(len(flags)), k))
    return sum(any(flags[i] for i in s) for s in subsets) / len(subsets)


def brute_distinct(responses, flags, k):
    subsets = list(itertools.combinations(range(len(flags)), k))
    return sum(len({responses[i] for i in s if flags[i]}) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_pass_at_k_equals_enumeration_of_all_subsets(n):
    for c in range(n + 1):
        flags = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            assert float(pass_at_k(n, c, k)) == pytest.approx(brute_pass_at_k(flags, k), abs=1e-12), (n, c, k)


def test_pass_at_k_closed_forms_and_vectorised():
    assert float(pass_at_k(10, 3, 1)) == pytest.approx(0.3)               # pass@1 = c / n
    assert float(pass_at_k(10, 0, 5)) == 0.0 and float(pass_at_k(10, 6, 5)) == 1.0   # n - c < k
    n = torch.tensor([10, 20, 200])
    c = torch.tensor([2, 0, 17])
    want = torch.tensor([1 - math.comb(8, 4) / math.comb(10, 4), 0.0,
                         1 - math.comb(183, 4) / math.comb(200, 4)], dtype=torch.float64)
    assert torch.allclose(pass_at_k(n, c, 4), want, atol=1e-12)
    assert pass_at_k(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 3).shape == (0,)
    assert torch.isfinite(pass_at_k(1000, 999, 1000)).all()


def test_pass_at_k_is_unbiased_for_one_minus_one_minus_p_to_the_k():
    # exact expectation over c ~ Binomial(n, p)
    n, k, p = 8, 3, 0.3
    e = sum(math.comb(n, c) * p ** c * (1 - p) ** (n - c) * float(pass_at_k(n, c, k)) for c in range(n + 1))
    assert e == pytest.approx(1 - (1 - p) ** k, abs=1e-12)


def test_pass_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="n must be >= k"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(TypeError, match="integer"):
        pass_at_k(torch.tensor([3.0]), torch.tensor([1.0]), 1)
    with pytest.raises(ValueError, match="k"):
        pass_at_k(3, 1, 0)


def test_distinct_correct_against_enumeration():
    rng = random.Random(0)
    for _ in range(20):
        n = rng.randint(1, 7)
        resp = [rng.choice("abcd") for _ in range(n)]
        flags = [rng.random() < 0.6 for _ in range(n)]
        assert float(distinct_correct(resp, torch.tensor(flags), n)[0]) == len({r for r, f in zip(resp, flags) if f})
        for k in range(1, n + 1):
            got = float(distinct_correct(resp, torch.tensor(flags), n, k)[0])
            assert got == pytest.approx(brute_distinct(resp, flags, k), abs=1e-12)


def test_distinct_correct_groups_and_all_false():
    resp = ["1", "1", "2", "3", "x", "y", "x", "y"]
    corr = torch.tensor([1, 1, 1, 0, 0, 0, 0, 0])
    assert distinct_correct(resp, corr, 4).tolist() == [2.0, 0.0]
    assert distinct_correct(resp, corr, 4, k=4).tolist() == [2.0, 0.0]
    with pytest.raises(ValueError, match="group_size"):
        distinct_correct(resp, corr, 3)
    with pytest.raises(ValueError, match="correct"):
        distinct_correct(resp, corr[:5], 4)


def test_group_diversity_bonus_by_hand():
    resp = ["a", "a", "b", "c", "a", "a", "a", "a"]
    corr = torch.tensor([1, 1, 1, 0, 1, 1, 1, 0])
    d = group_diversity_bonus(resp, corr, 4)
    # group 1: "a" twice -> 1 - 1/3; "b" unique -> 1; "c" unique but wrong -> 0
    assert torch.allclose(d[:4], torch.tensor([2 / 3, 2 / 3, 1.0, 0.0]))
    # group 2: all identical -> 0
    assert torch.allclose(d[4:], torch.zeros(4))
    d_all = group_diversity_bonus(resp, corr, 4, only_correct=False)
    assert torch.allclose(d_all[:4], torch.tensor([2 / 3, 2 / 3, 1.0, 1.0]))
    assert group_diversity_bonus([], torch.zeros(0), 4).shape == (0,)
    with pytest.raises(ValueError, match="group_size"):
        group_diversity_bonus(resp, corr, 1)


def test_running_mean_std_matches_numpy_over_uneven_batches():
    rng = np.random.default_rng(0)
    rms = RunningMeanStd((3,))
    seen = []
    for b in (1, 5, 0, 17, 2):
        x = rng.normal(2.0, 3.0, size=(b, 3))
        seen.append(x)
        rms.update(torch.tensor(x))
    allx = np.concatenate(seen)
    assert rms.count == len(allx)
    assert np.allclose(rms.mean.numpy(), allx.mean(0)) and np.allclose(rms.var.numpy(), allx.var(0))
    s = RunningMeanStd()
    s.update(torch.tensor([1.0, 2.0, 3.0]))
    assert float(s.mean) == pytest.approx(2.0) and float(s.var) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="shape"):
        rms.update(torch.zeros(4, 2))
    with pytest.raises(ValueError):
        s.update(torch.tensor([float("nan")]))


def _tiny():
    tok = CharTokenizer()
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16, block_size=16)), tok


def _facts_rollout(model, tok, n=12, seed=0):
    probs = FACTS.problems(n, seed=seed, split="all")
    ids, m = tok.encode_batch([p.prompt for p in probs])
    return sample(model, ids, m, max_new_tokens=FACTS.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
                  generator=torch.Generator().manual_seed(seed), logits_processor=facts_format(tok)), probs


def test_rnd_normalised_bonus_has_unit_scale_and_raw_error_falls_with_training():
    model, tok = _tiny()
    rnd = RND(model, out_dim=8, width=16, lr=1e-2, seed=0)
    ro, _ = _facts_rollout(model, tok, 32)
    b, raw = rnd.bonus(ro, normalize=True)
    assert b.shape == raw.shape == (32,) and torch.isfinite(b).all()
    # one batch: the bonus is raw / std(raw), so its population std is 1 (up to eps)
    assert float(b.std(unbiased=False)) == pytest.approx(1.0, rel=1e-4)
    before = float(raw.mean())
    for _ in range(30):
        rnd.fit(ro)
    after = float(rnd.raw(rnd.features(ro)).mean())
    assert after < 0.5 * before
    # the encoder is frozen
    assert all(not p.requires_grad for p in rnd.encoder.parameters())


def test_rnd_features_are_the_mean_hidden_state_over_real_response_tokens():
    model, tok = _tiny()
    rnd = RND(model, out_dim=4, width=8)
    ro, _ = _facts_rollout(model, tok, 4)
    z = rnd.features(ro)
    P = ro.prompt_ids.shape[1]
    for i in range(4):
        L = int(ro.mask[i].sum())
        p_ids = ro.prompt_ids[i][ro.prompt_mask[i]]
        ids = torch.cat([p_ids, ro.response_ids[i, :L]])[None]
        _, h = model(ids, return_hidden=True)
        want = h[0, len(p_ids):len(p_ids) + L].mean(0)
        assert torch.allclose(z[i], want, atol=1e-5), i
    assert P >= 1


def test_facts_exact_against_sampling_and_the_generic_processor_path():
    model, tok = _tiny()
    ex = facts_exact(model, tok, a_values=[12, 37], ks=(1, 4))
    assert ex["q"].shape == (2, 90) and bool((ex["q"].sum(1) <= 1 + 1e-9).all())
    gen = facts_exact(model, tok, a_values=[12, 37], ks=(1, 4), logits_processor=facts_format(tok))
    assert torch.allclose(ex["q"], gen["q"], atol=1e-9)
    # q[a, b] is the probability of the exact fact string: compare with the sampled frequency of "10=120"
    resp, _ = sample_groups(model, tok, FACTS, [Problem("12*", "", {"a": 12})], 4000,
                            logits_processor=facts_format(tok), generator=torch.Generator().manual_seed(0))
    for b in (10, 55):
        q = float(ex["q"][0, b - 10])
        freq = sum(r == f"{b}={12 * b}" for r in resp) / len(resp)
        assert abs(freq - q) < 4 * math.sqrt(q * (1 - q) / len(resp)) + 1e-3, (b, freq, q)
    tot = ex["q"].sum(1)
    assert torch.allclose(ex["pass@4"], 1 - (1 - tot) ** 4)
    assert torch.allclose(ex["distinct@1"], tot)


def test_facts_checker_and_grammar():
    p = Problem("37*", "", {"a": 37})
    assert facts_check("45=1665", p) == 1.0 and facts_check("10=370", p) == 1.0
    for bad in ("45=1666", "5=185", "05=185", "45", "=", "", "45=1665x", "450=16650"):
        assert facts_check(bad, p) == 0.0, bad
    assert all(FACTS.is_heldout(q.prompt) is False for q in FACTS.problems(20, seed=1, split="all"))
    model, tok = _tiny()
    ro, probs = _facts_rollout(model, tok, 64)
    texts = tok.decode_batch(ro.response_ids)
    for t in texts:                                  # an untrained model still writes "dd=" first
        assert len(t) >= 3 and t[0] in "123456789" and t[1].isdigit() and t[2] == "=", t


def test_coverage_metrics_of_known_responses():
    resp = ["10=370", "10=370", "20=740", "11=1", "x", "x", "x", "x"]
    corr = torch.tensor([1, 1, 1, 0, 0, 0, 0, 0])
    m = coverage_metrics(resp, corr, 4, ks=(1, 2))
    assert m["pass@1"] == pytest.approx((3 / 4 + 0) / 2)
    assert m["pass@2"] == pytest.approx((1 - math.comb(1, 2) / math.comb(4, 2)) / 2)
    assert m["distinct"] == pytest.approx(1.0)                     # (2 + 0) / 2
    assert m["distinct@2"] == pytest.approx((brute_distinct(resp[:4], [1, 1, 1, 0], 2)) / 2)
    with pytest.raises(ValueError, match="len\\(responses\\)"):
        coverage_metrics([], torch.zeros(0), 4)
    with pytest.raises(ValueError, match="info"):
        facts_check("10=370", Problem("37*", ""))


def _cfg(**kw):
    return RLConfig(**{**dict(algo="grpo", steps=2, prompts_per_step=2, group_size=4, lr=1e-4), **kw})


class Probe(Hook):
    """Keeps every step after its advantages (the reward channels the hooks before it filled in)."""

    def __init__(self):
        self.steps = []

    def on_advantages(self, run, step):
        self.steps.append(step)


def test_train_explore_runs_every_bonus_and_logs():
    model, tok = _tiny()
    cfg = _cfg()
    fmt = facts_format(tok)
    calls = []

    def ev(m):
        r, c = sample_groups(m, tok, FACTS, FACTS.problems(3, seed=0, split="all"), 4, logits_processor=fmt,
                             generator=torch.Generator().manual_seed(0))
        calls.append(1)
        return coverage_metrics(r, c, 4, ks=(1, 4))

    ex = ExploreConfig(entropy_coef=0.01, diversity_coef=0.5, rnd_coef=0.3)
    res = train_explore(model, tok, FACTS, cfg, ex, logits_processor=fmt, eval_fn=ev, eval_every=1)
    assert isinstance(res, ExploreResult) and isinstance(res, RLResult) and res.explore == ex
    assert res.evals["step"] == [0, 1, 2] and len(calls) == 3 and res.config.eval_every == 1
    assert all(isinstance(x, float) for x in res.evals["pass@1"])
    for k in ("reward", "bonus_div", "bonus_rnd", "rnd_raw", "entropy", "distinct_correct"):
        assert len(res.history[k]) == 2 and np.isfinite(res.array(k)).all(), k
    assert res.rnd is not None and res.rnd.rew_rms.count == 16
    assert "kl" not in res.history and "kl_seq" not in res.history      # no reference model runs without a KL term
    kl = train_explore(model, tok, FACTS, cfg.replace(steps=1), ExploreConfig(kl_coef=0.1), logits_processor=fmt)
    assert np.isfinite(kl.array("kl")).all() and np.isfinite(kl.array("kl_seq")).all()
    assert kl.explore.kl_coef == 0.1 and kl.rnd is None and kl.evals["step"] == []
    none = train_explore(model, tok, FACTS, cfg.replace(steps=1), logits_processor=fmt)
    assert none.history["bonus_div"] == [0.0] and none.history["bonus_rnd"] == [0.0] == none.history["rnd_raw"]


def test_train_explore_stops_on_the_callback_and_evaluates_there():
    model, tok = _tiny()
    seen = []

    def cb(k, history):
        seen.append((k, len(history["reward"])))
        return k == 0

    res = train_explore(model, tok, FACTS, _cfg(steps=5), logits_processor=facts_format(tok),
                        eval_fn=lambda m: {"x": torch.tensor(1.0)}, eval_every=3, callback=cb)
    assert seen == [(0, 1)] and res.evals["step"] == [0, 1] and res.evals["x"] == [1.0, 1.0]


def test_train_explore_refuses_the_fields_it_does_not_read():
    model, tok = _tiny()
    with pytest.raises(ValueError, match="RLConfig.eval_problems"):
        train_explore(model, tok, FACTS, _cfg(eval_problems=16), logits_processor=facts_format(tok))
    # rlkit 0.2's critic and KL fields (refused or read here before) are no longer settings of RLConfig
    with pytest.raises(ValueError, match=r"RLConfig.kl_in .*KLPenalty"):
        _cfg(kl_in="reward")


def test_train_explore_refuses_eval_every_without_eval_fn_and_the_old_refusals():
    model, tok = _tiny()
    fmt = facts_format(tok)
    with pytest.raises(ValueError, match="eval_every"):
        train_explore(model, tok, FACTS, _cfg(), logits_processor=fmt, eval_every=1)
    with pytest.raises(ValueError, match="eval_every"):
        train_explore(model, tok, FACTS, _cfg(eval_every=1), logits_processor=fmt)
    with pytest.raises(ValueError, match="kl_coef"):
        ExploreConfig(kl_coef=-0.1)
    for kw in (dict(top_k=5), dict(top_p=0.9)):
        with pytest.raises(ValueError, match="top_k and cfg.top_p"):
            train_explore(model, tok, FACTS, _cfg(**kw), logits_processor=fmt)
    for algo in ("ppo", "gspo"):
        with pytest.raises(ValueError, match="cfg.algo"):
            train_explore(model, tok, FACTS, _cfg(algo=algo), logits_processor=fmt)
    with pytest.raises(TypeError, match="explore"):
        train_explore(model, tok, FACTS, _cfg(), explore={"rnd_coef": 1.0})
    with pytest.raises(TypeError, match="eval_fn"):
        train_explore(model, tok, FACTS, _cfg(), eval_fn=3)


def test_train_explore_measures_only_with_a_kl_coef_of_zero():
    # ExploreConfig.kl_coef=0 runs the reference (k1 in the reward, coef 0): rlkit 0.2's RLConfig.log_kl=True
    m1, tok = _tiny()
    m2, _ = _tiny()
    fmt = facts_format(tok)
    a = train_explore(m1, tok, FACTS, _cfg(), ExploreConfig(kl_coef=0.0), logits_processor=fmt)
    b = train_explore(m2, tok, FACTS, _cfg(), logits_processor=fmt)
    assert np.isfinite(a.array("kl")).all() and np.isfinite(a.array("kl_seq")).all() and "kl" not in b.history
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize("temperature", [1.0, 0.8])
def test_train_explore_is_train_with_the_four_hooks_bit_for_bit(temperature):
    # at a temperature other than 1, rlkit 0.2's loop recomputed log pi_old under the grammar: Fresh(recompute=True)
    m1, tok = _tiny()
    m2, _ = _tiny()
    fmt = facts_format(tok)
    cfg = _cfg(algo="dr_grpo", lr=1e-3, seed=2, temperature=temperature)
    ex = ExploreConfig(entropy_coef=0.01, diversity_coef=0.5, diversity_all=True, rnd_coef=0.3, rnd_steps=2,
                       kl_coef=0.1)
    a = train_explore(m1, tok, FACTS, cfg, ex, logits_processor=fmt)
    b = train(m2, tok, FACTS, cfg, logits_processor=fmt, evaluation=False, sampler=Fresh(recompute=temperature != 1.0),
              hooks=[KLPenalty(0.1, "k1", where="reward", processed=True), DiversityBonus(0.5, all=True),
                     RNDBonus(0.3, steps=2), EntropyBonus(0.01)])
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p, q)
    assert a.history.keys() == b.history.keys()
    for k in a.history:
        if k != "train_seconds":
            assert a.history[k] == b.history[k], k
    assert b.evals["step"] == []


def test_group_adds_the_bonuses_after_the_penalties_in_list_order():
    torch.manual_seed(0)
    N, T, G = 8, 5, 4
    r = torch.rand(N)
    x = torch.randn(N, T)
    d1, d2 = torch.rand(N), torch.rand(N)

    class S:
        rewards, token_rewards, penalties, bonuses = r, None, [(0.3, x)], [(0.7, d1), (0.1, d2)]
        batch = type("B", (), {"rollout": type("R", (), {"mask": torch.ones(N, T)})()})()

    class R:
        cfg = RLConfig(algo="dr_grpo", group_size=G, prompts_per_step=2)

    want = sequence_advantages(((r - 0.3 * x.sum(-1)) + 0.7 * d1) + 0.1 * d2, "dr_grpo", G)
    assert torch.equal(Group("dr_grpo")(R(), S())[:, 0], want)


def test_diversity_bonus_adds_its_bonus_and_logs_the_distinct_answers():
    model, tok = _tiny()
    probe = Probe()
    res = train(model, tok, FACTS, _cfg(steps=1, group_size=8), logits_processor=facts_format(tok), evaluation=False,
                hooks=[DiversityBonus(2.0, all=True), probe])
    step = probe.steps[0]
    b = step.batch
    want = group_diversity_bonus(b.responses, b.rewards > 0.5, 8, only_correct=False)
    assert len(step.bonuses) == 1 and step.bonuses[0][0] == 2.0 and torch.equal(step.bonuses[0][1], want)
    assert res.history["bonus_div"] == [float(want.mean())]
    assert res.history["distinct_correct"] == [float(distinct_correct(b.responses, b.rewards > 0.5, 8).mean())]
    off = Probe()
    res0 = train(model, tok, FACTS, _cfg(steps=1), logits_processor=facts_format(tok), evaluation=False,
                 hooks=[DiversityBonus(0.0), off])
    assert off.steps[0].bonuses == [] and res0.history["bonus_div"] == [0.0]
    with pytest.raises(ValueError, match="coef"):
        DiversityBonus(-1.0)


def test_rnd_bonus_pays_the_error_before_the_predictor_fits_the_batch():
    m1, tok = _tiny()
    fmt = facts_format(tok)
    probe = Probe()
    res = train(m1, tok, FACTS, _cfg(steps=1, seed=4), logits_processor=fmt, evaluation=False,
                hooks=[RNDBonus(0.5, lr=1e-2, steps=3, out=8, width=16, normalize=False), probe])
    step = probe.steps[0]
    enc, _ = _tiny()                                  # the encoder is a copy of the model before training
    fresh = RND(enc, out_dim=8, width=16, lr=1e-2, seed=4)
    raw_before, _ = fresh.bonus(step.rollout, normalize=False)
    coef, bonus = step.bonuses[0]
    assert coef == 0.5 and torch.equal(bonus, raw_before)              # normalize=False: the raw error
    assert res.history["rnd_raw"] == [float(raw_before.mean())] == res.history["bonus_rnd"]
    for _ in range(3):                                                  # then `steps` Adam steps on the batch
        fresh.fit(step.rollout)
    for p, q in zip(fresh.predictor.parameters(), res.rnd.predictor.parameters()):
        assert torch.equal(p, q)
    assert all(not p.requires_grad for p in res.rnd.encoder.parameters())
    assert res.rnd.encoder is not m1
    off = train(m1, tok, FACTS, _cfg(steps=1), logits_processor=fmt, evaluation=False, hooks=[RNDBonus(0.0)])
    assert off.rnd is None and off.history["rnd_raw"] == [0.0]


def test_entropy_bonus_is_minus_alpha_times_the_aggregated_entropy():
    torch.manual_seed(0)
    ent, mask = torch.rand(4, 6), (torch.rand(4, 6) > 0.3).float()

    class S:
        pass

    class R:
        cfg = RLConfig(algo="dr_grpo").resolved()

    step = S()
    step.mask = mask
    rows = torch.arange(4)
    term = EntropyBonus(0.05).loss(R(), step, rows, None, ent)
    assert torch.equal(term, -(0.05 * aggregate(ent, mask, R.cfg.aggregation)))
    assert EntropyBonus(0.0).loss(R(), step, rows, None, ent) is None


def test_kl_penalty_scores_the_reference_through_the_grammar_when_processed():
    # before the first update the reference is the policy: through the grammar their KL is 0 (up to the
    # sampler's rounding); without it the KL counts the mass the grammar removes from the reference
    model, tok = _tiny()
    fmt = facts_format(tok)
    runs = {}
    for processed in (True, False):
        m, _ = _tiny()
        probe = Probe()
        runs[processed] = train(m, tok, FACTS, _cfg(steps=1), logits_processor=fmt, evaluation=False,
                                hooks=[KLPenalty(0.0, "k1", where="reward", processed=processed), probe])
        ro = probe.steps[0].rollout
        ref = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask,
                             logits_processor=fmt if processed else None)
        assert torch.equal(probe.steps[0].data["logp_ref"], ref)
    assert abs(runs[True].history["kl_seq"][0]) < 1e-4 and runs[False].history["kl_seq"][0] > 0.1


def test_model_eval_stores_floats():
    model, tok = _tiny()
    res = train(model, tok, FACTS, _cfg(steps=2, eval_every=1), logits_processor=facts_format(tok),
                evaluation=ModelEval(lambda m: {"n": torch.tensor(2), "p": np.float32(0.5)}))
    assert res.evals["step"] == [0, 1, 2] and res.evals["n"] == [2.0] * 3 and res.evals["p"] == [0.5] * 3
    assert all(type(x) is float for x in res.evals["n"])


def test_plain_config_matches_no_bonus_bit_for_bit():
    # ExploreConfig() adds nothing: two runs with the same seed give the same weights
    m1, tok = _tiny()
    m2, _ = _tiny()
    cfg = RLConfig(algo="dr_grpo", steps=2, prompts_per_step=2, group_size=4, lr=1e-3, seed=3)
    fmt = facts_format(tok)
    train_explore(m1, tok, FACTS, cfg, ExploreConfig(), logits_processor=fmt)
    train_explore(m2, tok, FACTS, cfg, ExploreConfig(diversity_coef=0.0, rnd_coef=0.0), logits_processor=fmt)
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)
