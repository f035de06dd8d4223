"""Chapter 16's forced lag for real actors: rlkit.llm.lagged.HeldBack.

HeldBack publishes the learner's version v to the pool only once the learner has reached v + delay.
With the simulated backend at lag 0 every sample is drawn with the newest published version, so the
age of the data at update k must be exactly min(k, delay): checked against that closed form. With
delay 0 the sampler must be rlkit.llm.samplers.Pool, bit for bit. A pool reused by a second run must
not hand it the first run's samples, and the version recorded with a sample must be the weights that
drew it (verify=True recomputes the behaviour log-probs from the archived version).
"""
import pytest
import torch

from rlkit.distributed import ActorPool
from rlkit.llm import ADDITION, RLConfig, load_pretrained, train
from rlkit.llm.actors import GroupSampler, tiny_llm
from rlkit.llm.advantages import OffPolicy
from rlkit.llm.lagged import ClippedLoss, HeldBack
from rlkit.llm.samplers import Pool

torch.set_num_threads(1)
CFG = dict(algo="ppo", steps=5, prompts_per_step=2, group_size=4, minibatches=1, eval_every=5, eval_problems=8)


def _run(sampler, seed=0):
    model, tok = load_pretrained()
    return train(model, tok, ADDITION, RLConfig(**CFG, seed=seed), sampler=sampler,
                 advantages=OffPolicy("vtrace", lr=1e-3), loss=ClippedLoss(), evaluation=False)


def _pool(**kw):
    return ActorPool(tiny_llm, GroupSampler("addition", group_size=4, prompts=1), n_actors=2, backend="simulated",
                     seed=0, **kw)


@pytest.mark.parametrize("delay", [0, 2, 7])
def test_the_age_at_update_k_is_min_k_delay(delay):
    with _pool() as pool:
        s = HeldBack(pool, delay, verify=True)
        res = _run(s)
    ages = [c[4] for c in res.consumed]
    assert ages == [min(k, delay) for k in range(5) for _ in range(2)]
    assert res.history["mean_age"] == [float(min(k, delay)) for k in range(5)]
    assert max(res.behaviour_gaps) < 1e-5 and len(res.behaviour_gaps) == 5
    assert res.discarded == 0


def test_delay_zero_is_the_pool_sampler_bit_for_bit():
    with _pool() as pool:
        a = _run(Pool(pool))
    with _pool() as pool:
        b = _run(HeldBack(pool, 0))
    ha, hb = ({k: v for k, v in r.history.items() if k != "train_seconds"} for r in (a, b))
    assert ha == hb
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)


def test_a_reused_pool_serves_a_second_run_only_its_own_versions():
    with _pool() as pool:
        first = _run(HeldBack(pool, 1, verify=True))
        second = _run(HeldBack(pool, 1, verify=True), seed=1)
        assert pool.version == 2 * 5 - 1           # two runs of learner versions 0-5, version 5 still held back
    for res in (first, second):
        assert [c[3] for c in res.consumed] == [max(0, k - 1) for k in range(5) for _ in range(2)]
        assert max(res.behaviour_gaps) < 1e-5


def test_a_pool_that_only_serves_earlier_versions_times_out_instead_of_spinning():
    with _pool(lags=1) as pool:                     # samples one version behind the newest: the first run's
        _run(HeldBack(pool, 0))
        with pytest.raises(TimeoutError, match="earlier run"):
            _run(HeldBack(pool, 0, timeout=0.5), seed=1)


def test_held_back_checks_its_arguments():
    with _pool() as pool:
        with pytest.raises(ValueError, match="delay"):
            HeldBack(pool, -1)
        with pytest.raises(TypeError, match="delay"):
            HeldBack(pool, 1.5)
        with pytest.raises(TypeError, match="verify"):
            HeldBack(pool, 1, verify="yes")
    with pytest.raises(TypeError, match="pool"):
        HeldBack(object(), 1)
