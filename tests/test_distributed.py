"""rlkit.distributed: the simulated backend's contract exactly, a smoke run of real actor processes, input checks.

The toy model is a linear layer whose weights the learner sets to its version number, so the
payload (the sum of the weights the actor held) proves which version produced a sample.
Ray is tested in tests/test_distributed_ray.py (inside a loopback-only network namespace).
"""
from __future__ import annotations

import dataclasses
import functools
import time
import types

import numpy as np
import pytest
import torch

from rlkit.distributed import ActorError, ActorPool, Sampled
from rlkit.llm import load_pretrained
from rlkit.llm.actors import GroupSampler, merge_batches, tiny_llm
from rlkit.staleness import LagDistribution

# ---- picklable, importable toys (a spawned actor imports this module by name) --------------------------------


def toy_model() -> torch.nn.Module:
    return torch.nn.Linear(3, 1)


def weights_of(version: int) -> dict:
    """The toy's weights at ``version``: every entry equals the version, so sum(weights) = 4 * version."""
    return {"weight": torch.full((1, 3), float(version)), "bias": torch.full((1,), float(version))}


def toy_sample(model, rng_seed, request, delay=0.0, fail_at=None):
    if fail_at is not None and request >= fail_at:
        raise ValueError(f"toy sampler failed on request {request}")
    if delay:
        time.sleep(delay)
    g = torch.Generator().manual_seed(rng_seed)
    w = sum(float(p.sum()) for p in model.parameters())
    return {"version_from_weights": w / 4.0, "u": float(torch.rand((), generator=g)), "request": request}


# ---- simulated backend: the contract, exactly ----------------------------------------------------------------


def run_simulated(lags, n_updates=30, per_update=5, n_actors=3, seed=7, max_lag=None):
    with ActorPool(toy_model, toy_sample, n_actors=n_actors, backend="simulated", seed=seed, lags=lags,
                   max_lag=max_lag) as pool:
        pool.publish(weights_of(0), 0)
        got = []
        for k in range(n_updates):
            got += pool.get(per_update)
            pool.publish(weights_of(k + 1), k + 1)
        return got, pool.lag_histogram(), list(pool.dropped), pool


def test_simulated_is_deterministic_and_records_versions():
    lags = LagDistribution.uniform(3)
    a, ha, _, _ = run_simulated(lags)
    b, hb, _, _ = run_simulated(lags)
    assert [(s.version, s.actor, s.seq, s.lag, s.payload["u"]) for s in a] == \
        [(s.version, s.actor, s.seq, s.lag, s.payload["u"]) for s in b]
    assert torch.equal(ha, hb)
    for s in a:
        assert isinstance(s, Sampled)
        assert s.payload["version_from_weights"] == s.version      # sampled with exactly that version's weights
        assert s.payload["request"] == s.request == s.seq * 3 + s.actor
        assert s.rng_seed == ((lambda h, l: ((int(h) << 32) | int(l)) >> 1)(
            *np.random.SeedSequence([7, s.request]).generate_state(2, dtype=np.uint32)))
    c, _, _, _ = run_simulated(lags, seed=8)
    assert [s.payload["u"] for s in a] != [s.payload["u"] for s in c]


def test_simulated_lags_follow_the_given_distribution():
    """Realised lags equal the lags drawn by LagDistribution.sample from the same generator (clamped early)."""
    lags = LagDistribution(probs=(0.1, 0.2, 0.3, 0.4))
    got, hist, _, pool = run_simulated(lags, n_updates=200, per_update=10, seed=3)
    g = torch.Generator().manual_seed(3)
    drawn = [int(lags.sample(1, g)[0]) for _ in range(len(got))]
    realised = [s.lag for s in got]
    for i, (r, d) in enumerate(zip(realised, drawn)):
        learner_version = i // 10
        assert r == min(d, learner_version)               # clamped to the oldest version held
    late = np.array(realised[40:])                        # once 4 versions exist, nothing is clamped
    freq = np.bincount(late, minlength=4) / len(late)
    se = np.sqrt(np.array(lags.probs) * (1 - np.array(lags.probs)) / len(late))
    assert np.all(np.abs(freq - np.array(lags.probs)) < 4 * se)
    assert int(hist.sum()) == pool.consumed == len(got)
    assert hist.tolist() == np.bincount(realised).tolist()
    assert pool.mean_lag == pytest.approx(np.mean(realised))


def test_simulated_nothing_lost_or_duplicated_and_max_lag_drops():
    got, hist, dropped, pool = run_simulated(LagDistribution.uniform(4), n_updates=40, per_update=4, n_actors=2,
                                             max_lag=2)
    assert all(s.lag <= 2 for s in got) and all(s.lag > 2 for s in dropped)
    assert len(got) == 160 and len(dropped) > 0
    for a in range(2):
        seqs = sorted(s.seq for s in got + dropped if s.actor == a)
        assert seqs == list(range(len(seqs)))                 # no gap, no duplicate
    assert len(hist) == 3 and int(hist.sum()) == 160
    assert pool.lost == []


def test_simulated_without_lags_is_the_in_process_loop():
    got, hist, _, _ = run_simulated(None, n_updates=5, per_update=3)
    assert all(s.lag == 0 for s in got) and hist.tolist() == [15]
    assert [s.version for s in got] == [k for k in range(5) for _ in range(3)]


def test_llm_group_sampler_and_merge():
    sampler = GroupSampler("addition", group_size=4, prompts=2)
    with ActorPool(tiny_llm, sampler, n_actors=2, backend="simulated", lags=1) as pool:
        model = tiny_llm()
        pool.publish(model.state_dict(), 0)
        first = pool.get(2)
        pool.publish(model.state_dict(), 1)
        second = pool.get(2)
    tok = load_pretrained()[1]
    batch, versions = merge_batches(first + second, tok)
    assert len(batch.rollout) == 32 and versions.tolist() == [0] * 32   # 4 x 2 prompts x 4; lag 1 at version 1 -> 0
    assert [s.lag for s in first + second] == [0, 0, 1, 1]
    assert batch.rewards.shape == (32,) and len(batch.problems) == 32
    ro = batch.rollout
    assert torch.all(ro.model_logprobs[ro.mask == 0] == 0) and torch.all(ro.model_logprobs[ro.mask == 1] < 0)
    again = sampler(tiny_llm(), first[0].rng_seed, first[0].request)        # recomputable from (version, seed)
    assert torch.equal(again.rollout.response_ids, first[0].payload.rollout.response_ids)
    with pytest.raises(TypeError, match="samples\\[0\\]"):
        merge_batches([1], tok)
    with pytest.raises(TypeError):
        merge_batches(first)                                # the tokenizer that pads is not optional


def test_merge_batches_pads_with_the_tokenizer_it_is_given():
    """A narrower prompt block is left-padded with the given tokenizer's pad id (not the shipped one's 0)."""
    with ActorPool(tiny_llm, GroupSampler("addition", group_size=2), backend="simulated") as pool:
        pool.publish(tiny_llm().state_dict(), 0)
        a, b = pool.get(2)
    ro = b.payload.rollout
    narrow = dataclasses.replace(b, payload=dataclasses.replace(b.payload, rollout=dataclasses.replace(
        ro, prompt_ids=ro.prompt_ids[:, 1:], prompt_mask=ro.prompt_mask[:, 1:])))
    batch, _ = merge_batches([a, narrow], types.SimpleNamespace(pad_id=7))
    merged = batch.rollout
    assert merged.prompt_ids.shape[1] == a.payload.rollout.prompt_ids.shape[1]
    assert merged.prompt_ids[2:, 0].tolist() == [7, 7] and not merged.prompt_mask[2:, 0].any()
    assert torch.equal(merged.prompt_ids[:2], a.payload.rollout.prompt_ids)
    with pytest.raises(TypeError, match="tok.pad_id"):
        merge_batches([a], object())


def test_the_moved_llm_pieces_resolve_from_rlkit_distributed_for_one_release():
    """rlkit.distributed imports nothing of rlkit.llm; its old names for the actor pieces resolve lazily."""
    import subprocess
    import sys

    import rlkit.distributed as D
    import rlkit.llm.actors as A

    assert D.tiny_llm is A.tiny_llm and D.GroupSampler is A.GroupSampler and D.merge_batches is A.merge_batches
    assert not {"tiny_llm", "GroupSampler", "merge_batches"} & set(D.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        D.nothing  # noqa: B018
    code = "import sys, rlkit.distributed; assert not [m for m in sys.modules if m.startswith('rlkit.llm')]"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- real processes: a smoke run with robust assertions -------------------------------------------------------


def test_process_backend_smoke():
    """2 actor processes: samples arrive, versions advance, lags measured, nothing lost, clean shutdown."""
    sample_fn = functools.partial(toy_sample, delay=0.002)
    with ActorPool(toy_model, sample_fn, n_actors=2, backend="process", queue_size=4, timeout=60) as pool:
        pool.publish(weights_of(0), 0)
        got = []
        for k in range(12):
            got += pool.get(3)
            pool.publish(weights_of(k + 1), k + 1)
        hist = pool.lag_histogram()
        with pytest.raises(TimeoutError, match="of 10000 samples arrived in time"):
            pool.get(10_000, timeout=0.3)                        # 2 ms a sample: cannot finish in time
        kept = len(pool._pending)
        got += pool.get(kept + 1)                                # what arrived before the timeout is not lost
        procs = list(pool._procs)
        assert pool.lost == []
    assert len(got) == 37 + kept
    for s in got:
        assert s.payload["version_from_weights"] == s.version    # the version tag is the weights used
        assert s.lag >= 0 and s.payload["request"] == s.request == s.seq * 2 + s.actor
    assert max(s.version for s in got) >= 6                      # versions advanced
    assert int(hist.sum()) == 36 and hist.tolist() == np.bincount([s.lag for s in got[:36]]).tolist()
    assert [s.lag for s in got[36:]] == [12 - s.version for s in got[36:]]
    keys = [(s.actor, s.seq) for s in got]
    assert len(set(keys)) == len(keys)                           # no duplicate
    for a in {s.actor for s in got}:
        seqs = [s.seq for s in got if s.actor == a]
        assert seqs == list(range(len(seqs)))                    # in order, none lost
    assert all(not p.is_alive() for p in procs)                  # clean shutdown


def test_process_actor_exception_reaches_the_learner():
    sample_fn = functools.partial(toy_sample, fail_at=2)
    with ActorPool(toy_model, sample_fn, n_actors=1, backend="process", timeout=60) as pool:
        pool.publish(weights_of(0), 0)
        procs = pool._procs
        with pytest.raises(ActorError, match="toy sampler failed on request 2") as info:
            pool.get(10)
        kept = [(item[0], item[1]) for item in pool._pending]     # seq 0 and 1 arrived whole: kept, not lost
        with pytest.raises(ActorError, match="toy sampler failed on request 2"):
            pool.get(3)                                          # the failure is not forgotten
        assert [(s.actor, s.seq) for s in pool.get(2)] == [(0, 0), (0, 1)]
    assert "Traceback" in str(info.value) and "toy_sample" in str(info.value)
    assert kept == [(0, 0), (0, 1)]
    assert all(not p.is_alive() for p in procs)


# ---- input checks -------------------------------------------------------------------------------------------


def test_validation_names_the_argument():
    with pytest.raises(TypeError, match="make_model"):
        ActorPool(3, toy_sample)
    with pytest.raises(TypeError, match="sample_fn"):
        ActorPool(toy_model, None)
    with pytest.raises(ValueError, match="n_actors"):
        ActorPool(toy_model, toy_sample, n_actors=0)
    with pytest.raises(ValueError, match="backend"):
        ActorPool(toy_model, toy_sample, backend="threads")
    with pytest.raises(ValueError, match="lags"):
        ActorPool(toy_model, toy_sample, backend="process", lags=2)
    with pytest.raises(TypeError, match="lags"):
        ActorPool(toy_model, toy_sample, lags=0.5)
    with pytest.raises(ValueError, match="queue_size"):
        ActorPool(toy_model, toy_sample, queue_size=0)
    with pytest.raises(ValueError, match="max_lag"):
        ActorPool(toy_model, toy_sample, max_lag=-1)
    with pytest.raises(ValueError, match="timeout"):
        ActorPool(toy_model, toy_sample, timeout=0)
    with pytest.raises(ValueError, match="address"):
        ActorPool(toy_model, toy_sample, address="auto")
    with pytest.raises(TypeError, match="sample_fn must be picklable"):
        ActorPool(toy_model, lambda m, s, r: 0, backend="process")
    with ActorPool(toy_model, toy_sample) as pool:
        with pytest.raises(RuntimeError, match="publish the first weights"):
            pool.get(1)
        with pytest.raises(ValueError, match="missing \\['bias'\\]"):
            pool.publish({"weight": torch.zeros(1, 3)}, 0)
        with pytest.raises(ValueError, match="state_dict\\['weight'\\]"):
            pool.publish({"weight": torch.zeros(3), "bias": torch.zeros(1)}, 0)
        pool.publish(weights_of(0), 0)
        with pytest.raises(ValueError, match="version must be >= 1"):
            pool.publish(weights_of(0), 0)
        with pytest.raises(ValueError, match="n must be >= 1"):
            pool.get(0)
        assert pool.lag_histogram().shape == (0,) and np.isnan(pool.mean_lag)
    with pytest.raises(RuntimeError, match="closed"):
        pool.get(1)
    with pytest.raises(RuntimeError, match="start the pool"):
        ActorPool(toy_model, toy_sample).publish(weights_of(0), 0)
    with pytest.raises(ValueError, match="GroupSampler.group_size"):
        GroupSampler(group_size=0)


def test_ray_is_optional_and_its_error_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)              # as if Ray were not installed
    with pytest.raises(ImportError, match=r'pip install -e "\.\[ray\]"'):
        ActorPool(tiny_llm, GroupSampler(), backend="ray")
    with pytest.raises(ValueError, match="ray_init"):
        ActorPool(tiny_llm, GroupSampler(), backend="ray", address="auto", ray_init={"num_cpus": 2})
    with pytest.raises(ValueError, match="ray_init"):
        ActorPool(tiny_llm, GroupSampler(), backend="process", ray_init={"num_cpus": 2})


def test_ray_refuses_a_local_instance_outside_a_loopback_only_namespace(monkeypatch):
    import sys
    import types

    import rlkit.distributed as D

    def must_not_start(*args, **kwargs):
        raise AssertionError("ray.init must not be called outside a loopback-only namespace")

    fake = types.ModuleType("ray")
    fake.is_initialized = lambda: False
    fake.init = must_not_start
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(D, "loopback_only", lambda: False)
    monkeypatch.delenv("RLKIT_RAY_ANY_NETWORK", raising=False)
    with pytest.raises(RuntimeError, match="loopback-only namespace"):
        with ActorPool(tiny_llm, GroupSampler(), backend="ray"):
            pass

