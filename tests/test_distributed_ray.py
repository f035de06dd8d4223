"""rlkit.distributed with backend="ray": the actor/learner loop on a local Ray instance, on loopback only.

Ray probes external addresses to find its own IP. Nothing on the book's machines may send traffic
anywhere but loopback, so Ray is started ONLY inside a loopback-only network namespace: the test
re-runs this file as a script under

    unshare -rn sh -c 'ip link set lo up && exec python tests/test_distributed_ray.py --in-namespace'

with RAY_USAGE_STATS_ENABLED=0, and the script refuses to start Ray unless ``lo`` is its only
network interface. It runs a few updates of the tiny LLM with two Ray actors and checks the
ActorPool contract (as for the in-process backends: versions recorded, every sample recomputable
from its version's weights and seed, nothing lost or duplicated, lags measured), that an actor's
exception reaches the learner with its traceback, and that every Ray node's address is 127.0.0.1.
Skips, with the reason, without Ray (``pip install -e ".[ray]"``) or without ``unshare``; in CI
(``CI`` set, as ``.ci/run`` does) it fails instead, because CI installs the extra.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
UPDATES, PER_UPDATE, N_ACTORS = 4, 2, 2
MARK = "RAY-RESULT "


def failing_sample(model, rng_seed, request):
    """A sampler that fails on its third request (shipped to the Ray worker by value: it lives in __main__)."""
    if request >= 2:
        raise ValueError(f"ray toy sampler failed on request {request}")
    return request


def namespace_run() -> dict:
    """The Ray part. Runs only as ``--in-namespace``, i.e. inside ``unshare -rn`` with only ``lo`` up."""
    import random
    import time

    import ray
    import torch

    from rlkit.distributed import ActorError, ActorPool, loopback_only
    from rlkit.llm import load_pretrained, sequence_advantages, token_logprobs
    from rlkit.llm.actors import GroupSampler, merge_batches, tiny_llm
    from rlkit.objectives import ppo_clip_loss

    if not loopback_only() or os.environ.get("RAY_USAGE_STATS_ENABLED") != "0":
        raise SystemExit("refusing to start Ray: not inside a loopback-only network namespace with "
                         "RAY_USAGE_STATS_ENABLED=0")
    t0 = time.perf_counter()
    times = {}
    torch.set_num_threads(1)
    random.seed(0)
    torch.manual_seed(0)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=128 * 2 ** 20, log_to_driver=False)
    times["ray.init"] = time.perf_counter() - t0
    out = {"nodes": [n["NodeManagerAddress"] for n in ray.nodes()], "node_ip": ray.util.get_node_ip_address(),
           "seconds": times}
    sampler = GroupSampler("addition", group_size=4)
    model, tok = load_pretrained()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    published = {}
    with ActorPool(tiny_llm, sampler, n_actors=N_ACTORS, backend="ray", queue_size=2, timeout=120) as pool:
        published[0] = {k: v.clone() for k, v in model.state_dict().items()}
        pool.publish(model.state_dict(), 0)
        got = []
        for k in range(UPDATES):
            samples = pool.get(PER_UPDATE)
            times.setdefault("first samples", time.perf_counter() - t0)
            got += samples
            batch, _ = merge_batches(samples, tok)         # a real update: GRPO-style, ratio to the behaviour
            ro = batch.rollout
            adv = sequence_advantages(batch.rewards, "grpo", sampler.group_size)[:, None] * ro.mask
            logp = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
            loss, _ = ppo_clip_loss(logp, ro.model_logprobs, adv, eps=0.2, mask=ro.mask)
            opt.zero_grad()
            loss.backward()
            opt.step()
            published[k + 1] = {k2: v.clone() for k2, v in model.state_dict().items()}
            pool.publish(model.state_dict(), k + 1)
        out["hist"] = pool.lag_histogram().tolist()
        out["version"] = pool.version
        times["loop"] = time.perf_counter() - t0
    times["pool closed"] = time.perf_counter() - t0
    # the contract: every sample is what its recorded version's weights give for its seed and request
    check = tiny_llm()
    out["samples"] = []
    for s in got:
        check.load_state_dict(published[s.version])
        again = sampler(check, s.rng_seed, s.request)
        out["samples"].append(dict(actor=s.actor, seq=s.seq, version=s.version, lag=s.lag, request=s.request,
                                   same_tokens=bool(torch.equal(again.rollout.response_ids,
                                                                s.payload.rollout.response_ids)),
                                   logp_diff=float((again.rollout.model_logprobs
                                                    - s.payload.rollout.model_logprobs).abs().max())))
    try:
        with ActorPool(tiny_llm, failing_sample, n_actors=1, backend="ray", timeout=60) as pool:
            pool.publish(model.state_dict(), 0)
            pool.get(5)
        out["error"] = None
    except ActorError as e:
        out["error"] = str(e)
    times["error pool"] = time.perf_counter() - t0
    out["still_initialised"] = ray.is_initialized()       # the pools did not shut down a Ray they did not start
    ray.shutdown()
    times["ray.shutdown"] = time.perf_counter() - t0
    return out


# ---- the pytest side (never starts Ray itself) ----------------------------------------------------------------

def _skip_reason() -> str | None:
    if importlib.util.find_spec("ray") is None:
        return 'ray is not installed (optional extra): pip install -e ".[ray]" to run the Ray tests'
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare/ip not found: Ray runs only inside a loopback-only network namespace here"
    try:
        r = subprocess.run(["unshare", "-rn", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create a network namespace ({e}): Ray runs only inside a loopback-only one here"
    if r.returncode != 0:
        return ("`unshare -rn` is not permitted here (" + r.stderr.decode(errors="replace").strip()
                + "): Ray runs only inside a loopback-only network namespace")
    return None


def test_ray_actor_learner_loop_on_loopback_only():
    import pytest

    reason = _skip_reason()
    if reason and os.environ.get("CI"):
        pytest.fail(f"CI installs the ray extra and must run this test: {reason}")   # .ci/run sets CI=true
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT))
    cmd = f"ip link set lo up && exec '{sys.executable}' '{HERE}' --in-namespace"
    r = subprocess.run(["unshare", "-rn", "sh", "-c", cmd], capture_output=True, text=True, timeout=600, env=env,
                       cwd=str(ROOT))
    assert r.returncode == 0, f"the Ray run failed:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    lines = [line for line in r.stdout.splitlines() if line.startswith(MARK)]
    assert lines, f"no result from the Ray run:\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
    out = json.loads(lines[-1][len(MARK):])
    assert out["nodes"] and all(a == "127.0.0.1" for a in out["nodes"]), out["nodes"]
    assert out["node_ip"] == "127.0.0.1"
    samples = out["samples"]
    assert len(samples) == UPDATES * PER_UPDATE and out["version"] == UPDATES
    for s in samples:                              # sampled with exactly the recorded version's weights
        assert s["same_tokens"] and s["logp_diff"] < 1e-4, s
        assert s["lag"] >= 0 and s["request"] == s["seq"] * N_ACTORS + s["actor"]
    keys = [(s["actor"], s["seq"]) for s in samples]
    assert len(set(keys)) == len(keys)
    for a in {s["actor"] for s in samples}:
        seqs = [s["seq"] for s in samples if s["actor"] == a]
        assert seqs == list(range(len(seqs)))
    assert sum(out["hist"]) == len(samples)
    assert out["hist"] == [sum(s["lag"] == l for s in samples) for l in range(len(out["hist"]))]
    assert out["error"] and "ray toy sampler failed on request 2" in out["error"] and "Traceback" in out["error"]
    assert out["still_initialised"]
    print("seconds since the script started:", {k: round(v, 1) for k, v in out["seconds"].items()})


if __name__ == "__main__" and "--in-namespace" in sys.argv:
    print(MARK + json.dumps(namespace_run()), flush=True)
