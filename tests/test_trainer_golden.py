"""Every LLM trainer reproduces its recorded history to the last bit (tests/golden_histories.py says how).

The recorded numbers come from the trainers as they were before rlkit 0.3 replaced seven copies of the
training loop by one loop with hooks; a case that differs is a change of numbers, which must be
deliberate, listed in CHANGELOG.md, and re-recorded. The cases run in a subprocess with one thread,
ATen's default kernels and MKL's compatible path. On another CPU model the kernels may still round
differently, so there a mismatch is reported as a skip that names both CPUs, not as a failure.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import golden_histories as G  # noqa: E402

pytestmark = pytest.mark.slow


def _diff(want, got, path=""):
    if isinstance(want, dict) and isinstance(got, dict):
        if set(want) != set(got):
            return f"{path}: keys {sorted(set(want) ^ set(got))} differ"
        for k in want:
            d = _diff(want[k], got[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return f"{path}: length {len(want)} != {len(got)}"
        for i, (a, b) in enumerate(zip(want, got)):
            d = _diff(a, b, f"{path}[{i}]")
            if d:
                return d
        return None
    if want != got:
        fa = float.fromhex(want) if isinstance(want, str) and want.startswith(("0x", "-0x")) else want
        fb = float.fromhex(got) if isinstance(got, str) and got.startswith(("0x", "-0x")) else got
        return f"{path}: recorded {fa!r}, now {fb!r}"
    return None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden") / "now.json"
    env = {**os.environ, **G.ENV}
    proc = subprocess.run([sys.executable, str(HERE / "golden_histories.py"), "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stderr[-3000:]
    return json.loads(G.DATA.read_text()), json.loads(out.read_text())


@pytest.mark.parametrize("case", sorted(G.CASES))
def test_trainer_reproduces_its_recorded_history(runs, case):
    want, got = runs
    assert case in want["cases"], f"{case} was never recorded: run `python tests/golden_histories.py --record`"
    assert "error" not in got["cases"][case], got["cases"][case]
    d = _diff(want["cases"][case], got["cases"][case], case)
    if d and got["cpu"] != want["cpu"]:
        pytest.skip(f"recorded on {want['cpu']!r}, run on {got['cpu']!r}, where kernels may round differently: {d}")
    assert d is None, d
