"""The robustness runner: run chapters under other seeds and other CPU kernels, list what fails.

A chapter's check cells assert its claims on the numbers it just produced. Those numbers
depend on the seeds and, through the floating-point kernels MKL and ATen pick for the CPU,
on the machine. A claim that holds only on the seeds and the CPU it was written on is one
run's luck, so before a chapter's claims are trusted, run::

    python -m rlkit.robustness lessons/06_*.ipynb --seed-bases 0 1000 2000 --kernels native emulated

Each chapter runs once per variant (a seed base times a kernel setting), in a fresh kernel, with
every cell executed even after a failure; the table lists, for each variant, the code cells
that raised (their index among the notebook's code cells, counted from 1, and the exception).

Kernel settings:

* ``native``: whatever MKL and ATen pick on this CPU (``MKL_CBWR`` and ``ATEN_CPU_CAPABILITY``
  removed from the environment).
* ``emulated``: ``MKL_CBWR=COMPATIBLE ATEN_CPU_CAPABILITY=default``: MKL's conditional numerical
  reproducibility in its most portable mode, and ATen's un-vectorised kernels. Its numbers
  differ from native ones after a few updates, as an Intel machine's differ from an AMD one's.
* ``avx2``: ``MKL_CBWR=AVX2 ATEN_CPU_CAPABILITY=avx2``: the kernels of a machine without AVX-512.

Seed bases set ``RLKIT_SEED_BASE`` (see :func:`rlkit.utils.seeds`). The runner is a tool for
authors, not a CI step; ``--json`` keeps the full results, ``--jobs`` runs variants side by side.
Notebooks run through :func:`notebook_client`, which polls the kernel's channels in 1-second
slices: with nbclient's one poll per cell, a missed wake-up of the asyncio poll held a finished
cell, its kernel idle, until the cell's timeout ran out (seen on chapters 1, 6 and 13, about one
run in twenty, and once in the student-edition test). A run that still stops on a cell timeout
(``--timeout`` seconds per cell) or a dead kernel is run once more (``--retries``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

__all__ = ["KERNELS", "cpu_model", "variant_env", "notebook_client", "run_notebook", "run", "format_table", "main"]

#: The kernel settings the runner knows, each with the environment variables it sets (None removes one).
KERNELS: dict[str, dict[str, str | None]] = {
    "native": {"MKL_CBWR": None, "ATEN_CPU_CAPABILITY": None},
    "emulated": {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"},
    "avx2": {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
}



def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; elsewhere Python's ``platform`` module): which kernels ran."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()

def variant_env(seed_base: int, kernel: str, base: dict | None = None) -> dict[str, str]:
    """The environment a chapter runs in for one variant: ``base`` (default ``os.environ``) with
    ``RLKIT_SEED_BASE`` and the kernel's variables set (or removed), and ``RLKIT_THREADS`` 1 unless set."""
    if isinstance(seed_base, bool) or not isinstance(seed_base, int) or seed_base < 0:
        raise ValueError(f"seed_base must be an int >= 0, got {seed_base!r}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    env = dict(os.environ if base is None else base)
    env["RLKIT_SEED_BASE"] = str(seed_base)
    env.setdefault("RLKIT_THREADS", "1")  # one torch thread per chapter, as the book runs them
    for k, v in KERNELS[kernel].items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _sliced(get_msg, step: float = 1.0):
    """``get_msg`` of a kernel client's channel, waiting in slices of ``step`` seconds.

    nbclient waits for a cell's reply with one poll of the shell socket for the cell's whole
    timeout (and for its outputs with one unbounded poll of the iopub socket). Now and then the
    asyncio poll misses the socket's wake-up and returns only when that timeout runs out, with the
    reply long since there. Polling in short slices re-checks the socket every ``step`` seconds, so a
    missed wake-up costs at most ``step``; the overall deadline is the caller's, as before.
    """
    from queue import Empty

    async def get(timeout=None):
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await get_msg(timeout=step if left is None else min(step, left))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    return get


def notebook_client(nb, timeout: int = 300, **kwargs):
    """An ``nbclient.NotebookClient`` for ``nb`` whose kernel channels are polled in 1-second slices.

    Everything else is nbclient's (``kwargs`` are its options). The robustness runner and the
    student-edition test execute notebooks through it. Why: nbclient waits for a cell's reply with
    one poll of the shell socket for the cell's whole timeout, and that asyncio poll sometimes
    missed the wake-up, holding a finished cell until the timeout ran out; a poll in slices checks
    the socket again every second.
    """
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=timeout, **kwargs)

    def patch(**_):
        for channel in (client.kc.shell_channel, client.kc.iopub_channel):
            channel.get_msg = _sliced(channel.get_msg)

    client.on_notebook_start = patch
    return client


def _execute_here(path: str, timeout: int) -> dict:
    """Run one notebook in this process's environment (the child side of :func:`run_notebook`)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = notebook_client(nb, timeout=timeout, allow_errors=True, kernel_name="python3",
                             resources={"metadata": {"path": str(Path(path).parent)}})
    t0 = time.perf_counter()
    error = None
    try:
        client.execute()
    except Exception as err:  # a timeout or a dead kernel: report it, with the cells that ran
        error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    seconds = time.perf_counter() - t0
    failures = []
    code_i = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        code_i += 1
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                failures.append({"cell": code_i, "ename": out.get("ename", ""),
                                 "evalue": (out.get("evalue", "") or "").splitlines()[0][:300] if out.get("evalue")
                                 else ""})
                break
    claims = []
    for cell in nb.cells:
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = out.get("data", {})
            if "application/vnd.rlkit.claim+json" in data:
                claims.append(data["application/vnd.rlkit.claim+json"])
    return {"seconds": seconds, "failures": failures, "error": error, "claims": claims}


def run_notebook(path: str | Path, seed_base: int = 0, kernel: str = "native", timeout: int = 300) -> dict:
    """Execute ``path`` once under one variant, in a child process with that variant's environment.

    Returns ``{"notebook", "seed_base", "kernel", "seconds", "failures": [{"cell", "ename",
    "evalue"}], "error", "claims"}``; ``failures`` is empty when every cell ran.
    """
    path = Path(path)
    if not path.is_file() or path.suffix != ".ipynb":
        raise ValueError(f"path must be an existing .ipynb file, got {str(path)!r}")
    env = variant_env(seed_base, kernel)
    # the whole run: a chapter's own minutes plus one stalled cell must fit (see the module's docstring)
    limit = max(3 * timeout, timeout + 120)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "rlkit.robustness", "--_one", str(path.resolve()), str(out),
               "--timeout", str(timeout)]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            proc = None
        if proc is None:
            res = {"seconds": float(limit), "failures": [], "claims": [],
                   "error": f"runner child did not finish within {limit} s"}
        elif proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            res = {"seconds": float("nan"), "failures": [], "claims": [],
                   "error": f"runner child exited {proc.returncode}: {' | '.join(tail)}"}
        else:
            res = json.loads(out.read_text())
    res.update(notebook=str(path), seed_base=seed_base, kernel=kernel)
    return res


def run(paths, seed_bases=(0,), kernels=("native",), jobs: int = 1, timeout: int = 300,
        progress=print, retries: int = 1) -> list[dict]:
    """Run every notebook under every (seed base, kernel) variant; return the results.

    A variant whose run stopped with an error of its own (a cell that timed out, a dead kernel, a
    child that did not finish) is run again, up to ``retries`` times. A run whose cells merely fail
    is never run again: a failing check is deterministic. The result keeps the errors of the runs
    it replaced under ``"retried"``.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("paths must name at least one notebook")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, got {retries!r}")
    for k in kernels:
        if k not in KERNELS:
            raise ValueError(f"kernels: {k!r} is not one of {sorted(KERNELS)}")
    tasks = [(p, b, k) for p in paths for k in kernels for b in seed_bases]

    def one(task):
        p, b, k = task
        res = run_notebook(p, b, k, timeout)
        replaced = []
        while res.get("error") and len(replaced) < retries:
            replaced.append(res["error"])
            if progress is not None:
                progress(_line(res) + "  -> running it again")
            res = run_notebook(p, b, k, timeout)
        res["retried"] = replaced
        if progress is not None:
            progress(_line(res))
        return res

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, tasks))


def _cell_text(res: dict) -> str:
    again = f" (run {len(res['retried']) + 1} times)" if res.get("retried") else ""
    cells = ",".join(str(f["cell"]) for f in res["failures"])
    if res.get("error"):  # the run itself stopped (a timeout or a dead kernel), in the last failing cell if any
        return "ERROR" + (f" in cells {cells}" if cells else "") + again
    if not res["failures"]:
        return "ok" + again
    return "cells " + cells + again


def _line(res: dict) -> str:
    what = _cell_text(res)
    detail = "; ".join(f"cell {f['cell']}: {f['ename']}: {f['evalue'][:160]}" for f in res["failures"][:3])
    if res.get("error"):
        detail = (detail + "; " if detail else "") + res["error"]
    return (f"{Path(res['notebook']).name:40s} base {res['seed_base']:<6} {res['kernel']:9s} "
            f"{res['seconds']:7.1f} s  {what}" + (f"  ({detail})" if detail else ""))


def format_table(results: list[dict]) -> str:
    """A Markdown table: one row per notebook, one column per variant, failing cells or "ok"."""
    variants = []
    for r in results:
        v = (r["kernel"], r["seed_base"])
        if v not in variants:
            variants.append(v)
    rows = {}
    for r in results:
        rows.setdefault(Path(r["notebook"]).name, {})[(r["kernel"], r["seed_base"])] = r
    head = "| chapter | " + " | ".join(f"{k} {b}" for k, b in variants) + " |"
    lines = [head, "|" + "---|" * (len(variants) + 1)]
    for name, cells in rows.items():
        vals = []
        for v in variants:
            r = cells.get(v)
            vals.append("" if r is None else f"{_cell_text(r)} ({r['seconds']:.0f} s)")
        lines.append(f"| {name} | " + " | ".join(vals) + " |")
    failed = sum(1 for r in results if r["failures"] or r.get("error"))
    lines.append("")
    lines.append(f"{len(results) - failed} passed, {failed} failed")
    return "\n".join(lines)


def main(argv=None) -> int:
    """The command line: ``python -m rlkit.robustness NOTEBOOK... [--seed-bases N...] [--kernels K...]``.

    Returns the exit code: 0 when every variant of every notebook ran without a failing cell, 1 otherwise.
    """
    parser = argparse.ArgumentParser(prog="python -m rlkit.robustness", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="chapters to run (.ipynb)")
    parser.add_argument("--seed-bases", nargs="+", type=int, default=None, metavar="N",
                        help="values of RLKIT_SEED_BASE (default: the variable's value if set, else 0)")
    parser.add_argument("--kernels", nargs="+", default=["native"], choices=sorted(KERNELS),
                        help="kernel settings (default: native)")
    parser.add_argument("--jobs", type=int, default=1, help="variants run side by side (default 1)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    parser.add_argument("--retries", type=int, default=1,
                        help="runs again a variant that stopped on a timeout or a dead kernel (default 1)")
    parser.add_argument("--json", metavar="FILE", help="also write every result (with claims) to FILE")
    parser.add_argument("--_one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._one:
        res = _execute_here(args._one[0], args.timeout)
        Path(args._one[1]).write_text(json.dumps(res))
        return 0
    if not args.notebooks:
        parser.error("name at least one notebook")
    bases = args.seed_bases
    if bases is None:
        from .utils import seed_base
        bases = [seed_base()]
    results = run(args.notebooks, bases, args.kernels, args.jobs, args.timeout, retries=args.retries)
    print()
    print(format_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(not r["failures"] and not r.get("error") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
