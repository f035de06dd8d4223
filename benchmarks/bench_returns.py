"""Time rlkit's returns against the articles' per-element loop and against one memory pass.

    python benchmarks/bench_returns.py                 # [1024, 1024] float32, 1 thread
    python benchmarks/bench_returns.py --threads 2 --B 256 --T 4096

For each of ``gae``, ``vtrace`` and ``lambda_returns`` it prints

* the time of rlkit's function (best of ``--repeats`` runs, alternating with the memory pass so
  that both see the same load on a shared machine);
* the time of the plain per-element Python loop, written the way the source articles write GAE
  (for each row, for t from T-1 down to 0, on Python floats). It is timed on ``--loop-rows``
  rows and scaled linearly to the full batch (the loop is linear in rows by construction);
  converting each row to a Python list is included;
* the time of one memory pass over the same input tensors (``.clone()`` of every input, each
  copy dropped at once so that its memory is reused: no allocation cost is counted), the floor
  any implementation must pay to read its inputs and write as much back;

and both ratios: speed-up over the loop (higher is better) and slowdown relative to the memory
pass (lower is better). It also times the readable loop that each rlkit function is written as
(a step per time index, vectorised over the batch: what ``rlkit.show`` prints, and what runs when
autograd needs a graph), and checks that all three implementations agree.

    python benchmarks/bench_returns.py --crossover

times rlkit's readable loops against its blocked scan over a grid of batch sizes and segment
lengths: the measurement behind ``rlkit.returns._LOOP_MAX_T``, the length from which the
functions use the scan when no gradient is needed.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import time

import torch

from rlkit import returns as R
from rlkit.offpolicy import vtrace
from rlkit.returns import gae, lambda_returns

# ----------------------------------------------------------------------------------------------
# the articles' loops (per element, Python floats), one row at a time
# ----------------------------------------------------------------------------------------------


def loop_gae_row(rewards, values, next_values, discounts, lam):
    T = len(rewards)
    advantages = [0.0] * T
    gae_t = 0.0
    for t in range(T - 1, -1, -1):
        delta = rewards[t] + discounts[t] * next_values[t] - values[t]
        gae_t = delta + discounts[t] * lam * gae_t
        advantages[t] = gae_t
    return advantages, [advantages[t] + values[t] for t in range(T)]


def loop_lambda_row(rewards, discounts, next_values, lam):
    T = len(rewards)
    out = [0.0] * T
    g = next_values[T - 1]
    for t in range(T - 1, -1, -1):
        g = rewards[t] + discounts[t] * ((1 - lam) * next_values[t] + lam * g)
        out[t] = g
    return out


def loop_vtrace_row(log_rhos, rewards, values, next_values, discounts, rho_bar=1.0, c_bar=1.0):
    T = len(rewards)
    vs = [0.0] * T
    acc = 0.0
    for t in range(T - 1, -1, -1):
        rho = math.exp(log_rhos[t])
        delta = min(rho_bar, rho) * (rewards[t] + discounts[t] * next_values[t] - values[t])
        acc = delta + discounts[t] * min(c_bar, rho) * acc
        vs[t] = values[t] + acc
    pg = [0.0] * T
    for t in range(T):
        v_next = vs[t + 1] if t + 1 < T else next_values[T - 1]
        pg[t] = min(rho_bar, math.exp(log_rhos[t])) * (rewards[t] + discounts[t] * v_next
                                                       - values[t])
    return vs, pg


def run_loop(fn, tensors, rows, *extra):
    out = []
    for i in range(rows):
        out.append(fn(*(x[i].tolist() for x in tensors), *extra))
    return out


# ----------------------------------------------------------------------------------------------
# rlkit's readable loops (one vectorised step per time index): the code rlkit.show prints
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def readable_loops():
    """Make rlkit's functions run their loops instead of the blocked scan."""
    saved, R._LOOP_MAX_T = R._LOOP_MAX_T, 10 ** 9
    try:
        yield
    finally:
        R._LOOP_MAX_T = saved


def looped(fn):
    def run():
        with readable_loops():
            return fn()
    return run


# ----------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------


def clone_pass(tensors):
    return [x.clone() for x in tensors]         # fresh memory, like a function's outputs


def copy_pass(tensors, bufs):
    for x, b in zip(tensors, bufs):
        b.copy_(x)                              # the same traffic into memory already mapped


def minor_faults():
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except ImportError:  # not on Windows
        return float("nan")


def best_times(fns, repeats, clock):
    """Best (minimum) time of each function, measured round-robin; the minimum is the
    estimate least disturbed by other processes on a shared machine."""
    for f in fns:
        f()
    ts = [[] for _ in fns]
    for _ in range(repeats):
        for f, t in zip(fns, ts):
            t0 = clock()
            f()
            t.append(clock() - t0)
    return [min(t) for t in ts]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=1024, help="batch rows")
    ap.add_argument("--T", type=int, default=1024, help="time steps")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--loop-rows", type=int, default=16,
                    help="rows on which the Python loop is timed, then scaled to --B")
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--crossover", action="store_true",
                    help="time the readable loops against the blocked scan on a grid of shapes")
    ap.add_argument("--wall", action="store_true",
                    help="time with the wall clock (default: process CPU time with 1 thread, "
                         "which other processes on a shared machine do not inflate)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    use_cpu_clock = args.threads == 1 and not args.wall
    clock = time.process_time if use_cpu_clock else time.perf_counter
    B, T = args.B, args.T
    g = torch.Generator().manual_seed(0)
    r = torch.randn(B, T, generator=g)
    v = torch.randn(B, T, generator=g)
    nv = torch.cat([v[:, 1:], torch.randn(B, 1, generator=g)], dim=1)
    d = torch.where(torch.rand(B, T, generator=g) < 0.01, 0.0, 0.99)
    lr = 0.3 * torch.randn(B, T, generator=g)
    lam = 0.95
    rows = min(args.loop_rows, B)

    if args.crossover:
        return crossover(args, clock)

    cases = {
        "gae": (lambda: gae(r, v, nv, d, lam), looped(lambda: gae(r, v, nv, d, lam)),
                lambda: run_loop(loop_gae_row, (r, v, nv, d), rows, lam), (r, v, nv, d)),
        "vtrace": (lambda: vtrace(lr, r, v, nv, d), looped(lambda: vtrace(lr, r, v, nv, d)),
                   lambda: run_loop(loop_vtrace_row, (lr, r, v, nv, d), rows),
                   (lr, r, v, nv, d)),
        "lambda_returns": (lambda: lambda_returns(r, d, nv, lam),
                           looped(lambda: lambda_returns(r, d, nv, lam)),
                           lambda: run_loop(loop_lambda_row, (r, d, nv), rows, lam), (r, d, nv)),
    }

    print(f"[{B}, {T}] float32, torch threads = {args.threads}; best of {args.repeats} runs, "
          f"{'process CPU time' if use_cpu_clock else 'wall-clock time'}")
    print(f"loop  = the articles' per-element Python loop, timed on {rows} rows and scaled "
          f"linearly (x{B / rows:g}) to {B} rows")
    print("clone = one memory pass: .clone() of every input tensor (fresh memory, as a "
          "function's outputs)")
    print("copy  = the same pass into buffers allocated beforehand (bandwidth only, no page "
          "faults)")
    print("faults/call = minor page faults per rlkit call: on some VMs first-touching freshly "
          "mapped\n  memory dominates (about 1000 faults per 4 MiB); the allocator returns "
          "memory to the OS or not\n  depending on its state, so the rlkit and clone columns "
          "vary between runs while copy does not.\n")
    hdr = (f"{'function':15s} {'rlkit':>7s} {'its loop':>9s} {'loop':>8s} {'clone':>6s} "
           f"{'copy':>6s} | {'loop/rlkit':>10s} {'rlkit/clone':>11s} {'rlkit/copy':>10s} "
           f"{'faults/call':>11s}")
    print(hdr + "\n" + " " * 15 + "   (all times in ms)")
    print("-" * len(hdr))
    for name, (fast, ref, loop, inputs) in cases.items():
        bufs = [torch.empty_like(x) for x in inputs]
        # each timed in its own phase: their allocations interfere with each other's page
        # faults when interleaved (the CPU clock already discounts other processes)
        f0 = minor_faults()
        t_fast, = best_times([fast], args.repeats, clock)
        faults = (minor_faults() - f0) / (args.repeats + 1)
        t_clone, = best_times([lambda inputs=inputs: clone_pass(inputs)], args.repeats, clock)
        t_copy, = best_times([lambda inputs=inputs, bufs=bufs: copy_pass(inputs, bufs)],
                             args.repeats, clock)
        t_ref, = best_times([ref], 3, clock)
        t_loop = best_times([loop], 2, clock)[0] * B / rows
        # the three implementations agree
        out_f, out_r, out_l = fast(), ref(), loop()
        out_f = out_f if isinstance(out_f, tuple) else (out_f,)
        out_r = out_r if isinstance(out_r, tuple) else (out_r,)
        out_l = [torch.tensor([x if not isinstance(x, tuple) else x[k] for x in out_l])
                 for k in range(len(out_f))]
        ok = all(torch.allclose(a, b, atol=1e-3) for a, b in zip(out_f, out_r)) and all(
            torch.allclose(a[:rows], b, atol=1e-3) for a, b in zip(out_f, out_l))
        print(f"{name:15s} {t_fast * 1e3:7.2f} {t_ref * 1e3:9.2f} {t_loop * 1e3:8.0f} "
              f"{t_clone * 1e3:6.2f} {t_copy * 1e3:6.2f} | {t_loop / t_fast:10.0f} "
              f"{t_fast / t_clone:11.1f} {t_fast / t_copy:10.1f} {faults:11.0f}"
              + ("" if ok else "   MISMATCH!"))


def crossover(args, clock):
    """Loop versus blocked scan for gae (no autograd) over a grid of [B, T]."""
    print(f"gae without autograd, float32, torch threads = {args.threads}: time of rlkit's "
          f"readable loop / time of its blocked scan\n(> 1: the scan pays; rlkit uses it "
          f"for T > {R._LOOP_MAX_T})\n")
    Ts = [2, 4, 8, 16, 64, 256, 1024]
    print(f"{'B':>6s} " + " ".join(f"{'T=' + str(T):>7s}" for T in Ts))
    for B in [1, 16, 256, 4096]:
        row = []
        for T in Ts:
            g = torch.Generator().manual_seed(0)
            x = [torch.randn(B, T, generator=g) for _ in range(3)]
            d = torch.full((B, T), 0.99)
            saved, R._LOOP_MAX_T = R._LOOP_MAX_T, 0
            try:
                t_scan, = best_times([lambda x=x, d=d: gae(*x, d, 0.95)], 5, clock)
            finally:
                R._LOOP_MAX_T = saved
            t_loop, = best_times([looped(lambda x=x, d=d: gae(*x, d, 0.95))], 5, clock)
            row.append(t_loop / t_scan)
        print(f"{B:6d} " + " ".join(f"{q:7.1f}" for q in row))


if __name__ == "__main__":
    main()
