"""Actor/learner throughput on the tiny LLM: samples per second the learner consumes, and their lags.

    python benchmarks/bench_actors.py                       # in-process, 1 and 2 actor processes, Ray
    python benchmarks/bench_actors.py --repeats 5 --updates 40 --json out.json

One *sample* is one group: ``--group-size`` responses to one training prompt of the addition task
(:class:`rlkit.llm.actors.GroupSampler`, behaviour log-probs recorded). The learner takes
``--per-update`` groups per update (a batch of per-update x group-size responses, the same shape
for every contender), does one real GRPO step on them (group-normalised advantages, PPO-clip of
the ratio to the behaviour log-probs, one Adam step) and publishes its weights as the next version.
Measured after ``--warmup`` updates, over ``--updates`` updates:

* **samples/s**: groups consumed by the learner per second of wall time (updates included);
* **lag**: learner version at consumption minus the version that sampled the group
  (:meth:`rlkit.distributed.ActorPool.lag_histogram`), its mean and histogram;
* **CPU ms per sample** and **cores busy**: user + system CPU time of the learner and the actor
  processes over the timed window (``/proc``; not measured for Ray), per sample and per second of
  wall time. On a shared machine this separates the cost of the design from the cores it got.

Contenders (``rlkit.distributed.ActorPool``, all with one torch thread per process):

* ``inline``: the in-process loop: sample the groups with the current weights, then update (the
  same ``sample_fn`` and seeds, no pool: what ``backend="simulated"`` with lag 0 computes, without
  its archive copy per version);
* ``process-1``, ``process-2``: 1 or 2 actor processes (torch.multiprocessing, spawn) + the learner;
* ``ray-1``, ``ray-2``: the same with Ray actors, if Ray is installed. Ray is started ONLY inside a
  loopback-only network namespace: this script re-runs itself under
  ``unshare -rn sh -c 'ip link set lo up && exec python ...'`` with ``RAY_USAGE_STATS_ENABLED=0``.

Each contender is run ``--repeats`` times, alternating contenders; the median is reported. Actor
start-up (spawning processes, importing torch, starting Ray) happens before the timed window.
The goal (issue 11): with 2 actor processes and a learner on 2 cores, at least 1.3x the samples/s
of the in-process loop at the same batch shape. Numbers: benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from rlkit.distributed import ActorPool, Sampled, _rng_seed, loopback_only
from rlkit.llm import load_pretrained, sequence_advantages, token_logprobs
from rlkit.llm.actors import GroupSampler, merge_batches, tiny_llm
from rlkit.objectives import ppo_clip_loss

HERE = Path(__file__).resolve()
TOK = load_pretrained()[1]          # GroupSampler encodes with the shipped tokenizer


def grpo_step(model, opt, samples, group_size: int) -> float:
    """One GRPO update on the merged groups: advantages per group, PPO-clip against the behaviour log-probs."""
    batch, _ = merge_batches(samples, TOK)
    ro = batch.rollout
    adv = sequence_advantages(batch.rewards, "grpo", group_size)[:, None] * ro.mask
    model.train()
    logp = token_logprobs(model, ro.prompt_ids, ro.prompt_mask, ro.response_ids, ro.mask)
    loss, _ = ppo_clip_loss(logp, ro.model_logprobs, adv, eps=0.2, mask=ro.mask)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    model.eval()
    return float(batch.correct.mean())


def run_one(backend: str, n_actors: int, args) -> dict:
    """One timed learner run; returns samples/s and the lags of the timed window."""
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    sampler = GroupSampler(args.task, group_size=args.group_size)
    model = tiny_llm()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    kw = {}
    if backend == "ray":
        kw["ray_init"] = dict(num_cpus=max(2, n_actors), object_store_memory=128 * 2 ** 20)
    if backend == "inline":
        return _inline(model, opt, sampler, args)
    with ActorPool(tiny_llm, sampler, n_actors=n_actors, backend=backend, seed=args.seed,
                   queue_size=args.queue_size, timeout=300, **kw) as pool:
        pool.publish(model.state_dict(), 0)
        version = 0
        for _ in range(args.warmup):                     # actors are up and the caches are warm
            grpo_step(model, opt, pool.get(args.per_update), args.group_size)
            version += 1
            pool.publish(model.state_dict(), version)
        n_before = len(pool.lags)
        pids = [p.pid for p in pool._procs]                  # the actor processes ("process" only)
        cpu0 = time.process_time() + sum(_cpu_seconds(pid) for pid in pids)
        t0 = time.perf_counter()
        acc = []
        for _ in range(args.updates):
            acc.append(grpo_step(model, opt, pool.get(args.per_update), args.group_size))
            version += 1
            pool.publish(model.state_dict(), version)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() + sum(_cpu_seconds(pid) for pid in pids) - cpu0 if pids else None
        lags = pool.lags[n_before:]
    return _result(f"{backend}-{n_actors}", lags, seconds, acc, args, cpu)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _inline(model, opt, sampler, args) -> dict:
    """The in-process loop: sample the batch with the current weights, then update (no pool, no copies)."""
    j = 0

    def batch():
        nonlocal j
        out = []
        with torch.no_grad():
            for _ in range(args.per_update):
                out.append(Sampled(sampler(model, _rng_seed(args.seed, j), j), 0, 0, j))
                j += 1
        return out

    for _ in range(args.warmup):
        grpo_step(model, opt, batch(), args.group_size)
    cpu0, t0 = time.process_time(), time.perf_counter()
    acc = [grpo_step(model, opt, batch(), args.group_size) for _ in range(args.updates)]
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return _result("inline", [0] * (args.updates * args.per_update), seconds, acc, args, cpu)


def _result(name, lags, seconds, acc, args, cpu=None) -> dict:
    hist = torch.bincount(torch.tensor(lags)).tolist()
    return {"contender": name, "cpu_ms_per_sample": None if cpu is None else 1e3 * cpu / len(lags),
            "cores_busy": None if cpu is None else cpu / seconds,
            "samples_per_s": len(lags) / seconds, "responses_per_s": len(lags) * args.group_size / seconds,
            "seconds": seconds, "mean_lag": sum(lags) / len(lags), "max_lag": max(lags), "lag_hist": hist,
            "accuracy": sum(acc) / len(acc)}


def ray_in_namespace(args, actors) -> list[dict] | str:
    """Run the Ray contenders in a child process inside a loopback-only network namespace."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return 'Ray is not installed (pip install -e ".[ray]")'
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare/ip not found: Ray runs only inside a loopback-only network namespace here"
    child = [sys.executable, str(HERE), "--in-namespace", "--actors", *map(str, actors),
             *(f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
               if k not in ("actors", "backends", "json", "in_namespace"))]
    cmd = "ip link set lo up && exec " + " ".join(f"'{c}'" for c in child)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    r = subprocess.run(["unshare", "-rn", "sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        return f"Ray run failed: {r.stderr[-2000:]}"
    lines = [line for line in r.stdout.splitlines() if line.startswith("RAY-RUNS ")]
    return json.loads(lines[-1][len("RAY-RUNS "):]) if lines else f"no result from the Ray run: {r.stderr[-2000:]}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="addition")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--per-update", type=int, default=8, help="groups per update (batch = per-update x group-size)")
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--queue-size", type=int, default=16, help="samples waiting for the learner (>= per-update)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--actors", type=int, nargs="+", default=[1, 2])
    p.add_argument("--backends", nargs="+", default=["inline", "process", "ray"])
    p.add_argument("--json", default=None, help="write every run to this file")
    p.add_argument("--in-namespace", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.in_namespace:                 # the Ray child: only here is Ray ever started
        if not loopback_only() or os.environ.get("RAY_USAGE_STATS_ENABLED") != "0":
            raise SystemExit("refusing to start Ray outside a loopback-only namespace")
        runs = [run_one("ray", n, args) for _ in range(args.repeats) for n in args.actors]
        print("RAY-RUNS " + json.dumps(runs), flush=True)
        return

    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"load average {os.getloadavg()[0]:.1f}; batch {args.per_update} groups x {args.group_size}")
    runs = []
    for _ in range(args.repeats):
        if "inline" in args.backends:
            runs.append(run_one("inline", 1, args))
            print(" ", _fmt(runs[-1]), flush=True)
        if "process" in args.backends:
            for n in args.actors:
                runs.append(run_one("process", n, args))
                print(" ", _fmt(runs[-1]), flush=True)
    if "ray" in args.backends:
        ray_runs = ray_in_namespace(args, args.actors)
        if isinstance(ray_runs, str):
            print("ray:", ray_runs)
        else:
            for r in ray_runs:
                print(" ", _fmt(r))
            runs += ray_runs
    print(f"\nmedian of {args.repeats} runs ({args.updates} updates each), load average {os.getloadavg()[0]:.1f}:")
    print("| contender | samples/s | responses/s | x inline | mean lag | lag histogram (0, 1, ...) "
          "| CPU ms per sample | cores busy |")
    print("|---|---|---|---|---|---|---|---|")
    names = list(dict.fromkeys(r["contender"] for r in runs))
    base = statistics.median(r["samples_per_s"] for r in runs if r["contender"] == "inline") \
        if "inline" in names else float("nan")
    for name in names:
        rs = [r for r in runs if r["contender"] == name]
        sps = statistics.median(r["samples_per_s"] for r in rs)
        lag = statistics.median(r["mean_lag"] for r in rs)
        hist = max(rs, key=lambda r: -abs(r["samples_per_s"] - sps))["lag_hist"]
        cpu = [r["cpu_ms_per_sample"] for r in rs if r.get("cpu_ms_per_sample") is not None]
        busy = [r["cores_busy"] for r in rs if r.get("cores_busy") is not None]
        cpu_s = f"{statistics.median(cpu):.1f} | {statistics.median(busy):.2f}" if cpu else "n/a | n/a"
        print(f"| {name} | {sps:.1f} | {sps * args.group_size:.0f} | {sps / base:.2f}x | {lag:.2f} | {hist} "
              f"| {cpu_s} |")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))


def _fmt(r: dict) -> str:
    cpu = "" if r.get("cpu_ms_per_sample") is None else \
        f", {r['cpu_ms_per_sample']:.1f} CPU ms/sample, {r['cores_busy']:.2f} cores busy"
    return (f"{r['contender']:>10}: {r['samples_per_s']:6.1f} samples/s, mean lag {r['mean_lag']:.2f}, "
            f"lags {r['lag_hist']}, accuracy {r['accuracy']:.2f}{cpu}")


if __name__ == "__main__":
    main()
