"""The robustness runner: variant environments, failing-cell detection on a small notebook, the table."""
import nbformat
import pytest

from rlkit import robustness as R


def test_variant_env_sets_and_removes_kernel_variables():
    base = {"PATH": "/bin", "MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    native = R.variant_env(1000, "native", base)
    assert native == {"PATH": "/bin", "RLKIT_SEED_BASE": "1000", "RLKIT_THREADS": "1"}
    emu = R.variant_env(0, "emulated", base)
    assert emu["MKL_CBWR"] == "COMPATIBLE" and emu["ATEN_CPU_CAPABILITY"] == "default"
    assert base["MKL_CBWR"] == "AVX2"  # the caller's mapping is not changed
    with pytest.raises(ValueError, match="kernel must be one of"):
        R.variant_env(0, "fast", base)
    with pytest.raises(ValueError, match="seed_base"):
        R.variant_env(-1, "native", base)


def _toy(tmp_path, name, *sources):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# toy")] + [nbformat.v4.new_code_cell(s) for s in sources]
    path = tmp_path / name
    nbformat.write(nb, str(path))
    return path


def test_runner_finds_the_cells_that_fail_under_a_variant(tmp_path):
    # a claim that holds only on seed base 0, and one that holds only on native kernels
    path = _toy(tmp_path, "toy.ipynb",
                "import os\nfrom rlkit.utils import seeds\nSEEDS = seeds(3)",
                "assert SEEDS[0] == 0, f'tuned on seed 0, got {SEEDS}'",
                "assert os.environ.get('ATEN_CPU_CAPABILITY') != 'default', 'kernel-sensitive'",
                "from rlkit import stats\nstats.claim('a beats b', [3, 4, 5, 4, 3], [0, 1, 0, 1, 0])")
    results = R.run([path], seed_bases=(0, 1000), kernels=("native", "emulated"), jobs=2, timeout=120,
                    progress=None)
    by = {(r["seed_base"], r["kernel"]): r for r in results}
    assert [f["cell"] for f in by[(0, "native")]["failures"]] == []
    assert [f["cell"] for f in by[(1000, "native")]["failures"]] == [2]
    assert by[(1000, "native")]["failures"][0]["ename"] == "AssertionError"
    assert [f["cell"] for f in by[(0, "emulated")]["failures"]] == [3]
    assert [f["cell"] for f in by[(1000, "emulated")]["failures"]] == [2, 3]
    assert by[(0, "native")]["claims"][0]["statement"] == "a beats b"
    table = R.format_table(results)
    assert "| toy.ipynb | ok" in table and "cells 2,3" in table and "1 passed, 3 failed" in table


def test_run_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="paths must name"):
        R.run([])
    with pytest.raises(ValueError, match="existing .ipynb"):
        R.run_notebook(tmp_path / "missing.ipynb")
    with pytest.raises(ValueError, match="kernels"):
        R.run([tmp_path / "x.ipynb"], kernels=("turbo",))


def test_a_run_that_hangs_is_run_again_and_a_failing_check_is_not(tmp_path):
    # the first run of `hangs` sleeps past the per-cell timeout (a run that stops on a timeout); the second
    # finds the marker and passes. `fails` counts its runs: a failing check is
    # deterministic and must be reported after one run.
    marker, count = tmp_path / "ran-once", tmp_path / "runs"
    hangs = _toy(tmp_path, "hangs.ipynb", "import pathlib, time\n"
                 f"m = pathlib.Path({str(marker)!r})\n"
                 "if not m.exists():\n    m.write_text('x')\n    time.sleep(60)")
    fails = _toy(tmp_path, "fails.ipynb", "import pathlib\n"
                 f"c = pathlib.Path({str(count)!r})\n"
                 "c.write_text(c.read_text() + 'x' if c.exists() else 'x')",
                 "assert False, 'a claim that does not hold'")
    results = R.run([hangs, fails], timeout=5, progress=None, retries=1)
    by = {r["notebook"]: r for r in results}
    h, f = by[str(hangs)], by[str(fails)]
    assert h["failures"] == [] and not h.get("error") and len(h["retried"]) == 1, h
    assert "timed out" in h["retried"][0].lower() or "timeout" in h["retried"][0].lower(), h["retried"]
    assert [x["cell"] for x in f["failures"]] == [2] and f["retried"] == [] and count.read_text() == "x"
    assert "ok (run 2 times)" in R.format_table(results)
    # without retries the hang is reported as an error
    marker.unlink()
    (r,) = R.run([hangs], timeout=5, progress=None, retries=0)
    assert r["error"] and r["retried"] == [] and "ERROR" in R.format_table([r])
    with pytest.raises(ValueError, match="retries"):
        R.run([hangs], retries=-1)


def test_channel_polls_are_sliced_so_a_missed_wakeup_costs_one_slice():
    # a fake channel whose message is "there" from the third poll on: one poll of the whole timeout would
    # block for all of it, the sliced poll asks again every step and returns at the third slice
    import asyncio
    import time
    from queue import Empty

    calls = []

    async def get_msg(timeout=None):
        calls.append(timeout)
        if len(calls) < 3:
            raise Empty
        return {"msg": "reply"}

    sliced = R._sliced(get_msg, step=0.01)
    assert asyncio.run(sliced(timeout=60)) == {"msg": "reply"}
    assert len(calls) == 3 and all(t <= 0.01 for t in calls), calls
    calls.clear()
    assert asyncio.run(sliced(timeout=None)) == {"msg": "reply"} and calls == [0.01] * 3

    async def never(timeout=None):
        await asyncio.sleep(timeout)
        raise Empty

    t0 = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(R._sliced(never, step=0.02)(timeout=0.1))
    assert 0.09 < time.monotonic() - t0 < 1.0            # the caller's deadline, not a slice, ends the wait


def test_notebook_client_wraps_both_channels(tmp_path):
    nb = nbformat.read(str(_toy(tmp_path, "two.ipynb", "x = 1 + 1\nprint(x)")), as_version=4)
    client = R.notebook_client(nb, timeout=60, kernel_name="python3")
    seen = {}
    original = client.on_notebook_start

    def check(**kw):
        original(**kw)
        seen["names"] = [ch.get_msg.__qualname__ for ch in (client.kc.shell_channel, client.kc.iopub_channel)]

    client.on_notebook_start = check
    client.execute()
    assert seen["names"] == ["_sliced.<locals>.get"] * 2, seen
    assert nb.cells[1].outputs[0]["text"] == "2\n"
