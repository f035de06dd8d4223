"""Time and env steps for PPO to reach a 20-episode mean return of 475 on CartPole-v1.

Usage::

    "$BENCH_ENV/bin/python" benchmarks/bench_ppo_cartpole.py          # rlkit (+ SB3 if importable), seeds 0-4
    .venv/bin/python benchmarks/bench_ppo_cartpole.py --seeds 0 1 2 3 4 5 6 7 8 9
    .venv/bin/python benchmarks/bench_ppo_cartpole.py --no-sb3 --zoo-settings
    .venv/bin/python benchmarks/bench_ppo_cartpole.py --cleanrl /path/to/cleanrl/ppo.py

Every trial runs in a FRESH Python process, and "seconds" is measured from the moment the
process is launched (interpreter start, imports, env and network construction included) to the
moment the criterion is met: the mean undiscounted return of the last 20 completed training
episodes (stochastic policy, as logged during training) reaches 475.  "steps" is the env-step
count (summed over the vectorised envs) when the episode that completed the window finished.

Contenders (all one torch thread, CPU):

* ``rlkit``: ``rlkit.algos.train_ppo`` with its defaults (the book's tuned CartPole settings).
* ``rlkit-zoo`` (``--zoo-settings``): rlkit's PPO with exactly rl-zoo's hyperparameters (below), to
  separate the implementation from the tuning.
* ``sb3``: Stable Baselines3 ``PPO("MlpPolicy")`` with rl-baselines3-zoo's tuned CartPole-v1
  settings (hyperparams/ppo.yml: n_envs 8, n_steps 32, batch_size 256, gae_lambda 0.8, gamma 0.98,
  n_epochs 20, ent_coef 0.0, learning_rate lin_0.001, clip_range lin_0.2) and a callback that stops
  at the same criterion.  Only if ``stable_baselines3`` is importable: it is a benchmark-only
  install, into an environment of its own (``$BENCH_ENV``, see benchmarks/README.md).
* ``cleanrl``: a user-supplied CleanRL ``ppo.py`` (``--cleanrl PATH``), run as a subprocess with
  ``--env-id CartPole-v1 --seed S``; its stdout lines ``global_step=..., episodic_return=...`` are
  parsed and the process is stopped at the criterion.  Otherwise the reference figure measured on
  this machine earlier (~70 s, ~130k steps) is printed as "not measured here".

Timings depend on how busy the machine is: the script prints the load average before and after;
run it with the other cores as quiet as possible.  It also reports each trial's CPU seconds (user +
system time of the child process, launch to criterion), which contention inflates much less than
wall-clock time.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from string import Template

THRESHOLD, WINDOW = 475.0, 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------------------------
# child processes: each prints one JSON line {"steps": int|None, "t_hit": wall-clock time.time()}
# ---------------------------------------------------------------------------------------------

RLKIT_CHILD = Template(r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from rlkit.algos import PPOConfig, train_ppo
seed, max_steps, kw = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
cfg = PPOConfig(total_steps=max_steps, seed=seed, target_return=$thr, target_window=$win, **kw)
model, h = train_ppo("CartPole-v1", cfg, progress=False)
t_hit = time.time()
print(json.dumps({"steps": h.steps_to($thr, $win), "t_hit": t_hit, "train_s": h.wall_time[-1]}))
""").substitute(thr=THRESHOLD, win=WINDOW)

SB3_CHILD = Template(r"""
import json, sys, time
t_import = time.time()
import numpy as np, torch
torch.set_num_threads(1)
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
seed, max_steps = int(sys.argv[1]), int(sys.argv[2])

def lin(x):                       # rl-zoo's "lin_x": x * remaining progress
    return lambda progress_remaining: progress_remaining * x

class StopAt(BaseCallback):
    def __init__(self):
        super().__init__()
        self.returns, self.hit = [], None
    def _on_step(self):
        for info in self.locals["infos"]:
            ep = info.get("episode")
            if ep is not None:
                self.returns.append(float(ep["r"]))
                if len(self.returns) >= $win and np.mean(self.returns[-$win:]) >= $thr:
                    self.hit = (self.num_timesteps, time.time())
                    return False
        return True

env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
            ent_coef=0.0, learning_rate=lin(1e-3), clip_range=lin(0.2), seed=seed, device="cpu", verbose=0)
cb = StopAt()
t0 = time.time()
model.learn(total_timesteps=max_steps, callback=cb)
steps, t_hit = cb.hit if cb.hit else (None, time.time())
print(json.dumps({"steps": steps, "t_hit": t_hit, "train_s": t_hit - t0}))
""").substitute(thr=THRESHOLD, win=WINDOW)

ZOO_KW = dict(num_envs=8, num_steps=32, num_minibatches=1, gae_lambda=0.8, gamma=0.98, epochs=20,
              ent_coef=0.0, lr=1e-3, anneal_lr=True, clip_eps=0.2, anneal_clip=True)


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_python_child(code: str, args: list[str], timeout: float) -> dict:
    cpu0 = _child_cpu()
    t_launch = time.time()
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"child failed:\n{out.stderr[-2000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["seconds"] = res["t_hit"] - t_launch if res["steps"] is not None else None
    res["cpu_s"] = _child_cpu() - cpu0          # the child's whole CPU time (it exits at the criterion)
    return res


def run_cleanrl(path: str, seed: int, max_steps: int, timeout: float) -> dict:
    """Run a CleanRL-style ppo.py, parse its episodic returns from stdout, stop at the criterion."""
    pat = re.compile(r"global_step=(\d+),\s*episodic_return=\[?\s*([-\d.eE+]+)")
    t_launch = time.time()
    proc = subprocess.Popen([sys.executable, path, "--env-id", "CartPole-v1", "--seed", str(seed),
                             "--total-timesteps", str(max_steps)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=os.path.dirname(os.path.abspath(path)),
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    returns, res = [], {"steps": None, "seconds": None, "cpu_s": None}
    try:
        for line in proc.stdout:
            m = pat.search(line)
            if m:
                returns.append(float(m.group(2)))
                if len(returns) >= WINDOW and statistics.fmean(returns[-WINDOW:]) >= THRESHOLD:
                    res = {"steps": int(m.group(1)), "seconds": time.time() - t_launch, "cpu_s": None}
                    break
            if time.time() - t_launch > timeout:
                break
    finally:
        proc.kill()
        proc.wait()
    return res


def summarize(name, rows):
    ok = [r for r in rows if r["steps"] is not None]
    if not ok:
        return f"{name:<10} never reached {THRESHOLD} within the step budget"
    s = sorted(r["seconds"] for r in ok)
    n = sorted(r["steps"] for r in ok)
    c = sorted(r["cpu_s"] for r in ok if r.get("cpu_s") is not None)
    miss = len(rows) - len(ok)
    cpu = f"cpu median {statistics.median(c):5.1f} s  | " if c else ""
    return (f"{name:<10} median {statistics.median(s):6.1f} s  worst {s[-1]:6.1f} s  | {cpu}"
            f"median {statistics.median(n):8.0f} steps  worst {n[-1]:7d} steps"
            + (f"  ({miss} of {len(rows)} seeds never reached it)" if miss else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--max-steps", type=int, default=100_000, help="step budget per trial (also rlkit's "
                    "learning-rate annealing horizon, as rl-zoo's n_timesteps=1e5 is SB3's)")
    ap.add_argument("--no-sb3", action="store_true", help="skip Stable Baselines3 even if installed")
    ap.add_argument("--zoo-settings", action="store_true", help="also run rlkit's PPO with rl-zoo's settings")
    ap.add_argument("--cleanrl", metavar="PATH", help="path to a CleanRL ppo.py to time")
    ap.add_argument("--rlkit-kwargs", default="{}", help="JSON dict of extra PPOConfig fields")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per trial")
    ap.add_argument("--json", metavar="FILE", help="also write all results to FILE")
    args = ap.parse_args()

    contenders = [("rlkit", lambda s: run_python_child(RLKIT_CHILD, [str(s), str(args.max_steps), args.rlkit_kwargs],
                                                      args.timeout))]
    if args.zoo_settings:
        contenders.append(("rlkit-zoo", lambda s: run_python_child(
            RLKIT_CHILD, [str(s), str(args.max_steps), json.dumps(ZOO_KW)], args.timeout)))
    try:
        import stable_baselines3  # noqa: F401
        have_sb3 = not args.no_sb3
    except ImportError:
        have_sb3 = False
    if have_sb3:
        contenders.append(("sb3", lambda s: run_python_child(SB3_CHILD, [str(s), str(args.max_steps)], args.timeout)))
    if args.cleanrl:
        contenders.append(("cleanrl", lambda s: run_cleanrl(args.cleanrl, s, 500_000, args.timeout)))

    print(f"criterion: mean of the last {WINDOW} training-episode returns >= {THRESHOLD} on CartPole-v1")
    print(f"cores: {os.cpu_count()}, load average before: {os.getloadavg()}")
    results = {name: [] for name, _ in contenders}
    # interleave contenders seed by seed so that background load affects them alike
    for seed in args.seeds:
        for name, fn in contenders:
            r = fn(seed)
            results[name].append(dict(seed=seed, **{k: r.get(k) for k in ("steps", "seconds", "cpu_s", "train_s")}))
            sec = "never" if r["seconds"] is None else f"{r['seconds']:.1f} s"
            cpu = "" if r.get("cpu_s") is None else f"  (cpu {r['cpu_s']:.1f} s)"
            print(f"  seed {seed:2d}  {name:<10} {sec:>9}  {r['steps']} steps{cpu}", flush=True)

    print(f"load average after: {os.getloadavg()}")
    print()
    header = "| seed | " + " | ".join(f"{n} s | {n} cpu s | {n} steps" for n in results) + " |"
    print(header)
    print("|" + "---|" * (1 + 3 * len(results)))
    fmt = lambda x, f: "-" if x is None else f.format(x)
    for i, seed in enumerate(args.seeds):
        cells = []
        for n in results:
            r = results[n][i]
            cells += [fmt(r["seconds"], "{:.1f}"), fmt(r.get("cpu_s"), "{:.1f}"), fmt(r["steps"], "{:d}")]
        print(f"| {seed} | " + " | ".join(cells) + " |")
    print()
    for n, rows in results.items():
        print(summarize(n, rows))
    if not have_sb3:
        print("sb3        not measured here (stable_baselines3 not importable); reference on this machine: "
              "~27 s, ~39k steps")
    if not args.cleanrl:
        print("cleanrl    not measured here (pass --cleanrl PATH); reference on this machine: ~70 s, ~130k steps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
