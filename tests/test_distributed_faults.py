"""rlkit.distributed under faults: actors killed at the worst moments, hung, dead among live ones, bad payloads.

The reliability review (issue 20, findings H3, H4, H5, R3 and section 2.7) found waits that never
return: ``publish`` after an actor died holding the weights lock, ``get(timeout=5)`` after an actor died
halfway through writing a 64 MiB sample, the simulated ``get(timeout=2)`` when every sample is dropped,
and a pool dropped without ``close`` whose actors go on sampling.

Every scenario that could hang runs in its own Python process (this file run as a script) with a
watchdog: after ``LIMIT`` seconds it kills the actor processes its pool started (by their PIDs) and
exits with ``HUNG``, so a regression fails the test instead of hanging the suite; ``subprocess.run``'s
timeout is the second guard. Actors are killed only by the PIDs of the scenario's own pool. Each
scenario reports JSON; the test asserts bounded waits (wall time), the sequence numbers delivered
(nothing lost or duplicated), that no child process is left (``/proc``, leaving out multiprocessing's
resource tracker) and that ``/dev/shm`` holds no new entry once the scenario's process has exited.
"""
from __future__ import annotations

import functools
import gc
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from pathlib import Path

import pytest
import torch

from rlkit.distributed import ActorError, ActorPool
from rlkit.staleness import LagDistribution

HERE = Path(__file__).resolve()
MARK = "FAULT-RESULT "
LIMIT = 40.0                    # seconds a scenario may run before it counts as hung
HUNG = 3                        # the exit status of a scenario the watchdog ended
POOL_PIDS: list[int] = []       # the actor processes of the scenario's pool (the watchdog kills only these)

# ---- picklable, importable toys (spawned actors import this file as their main module) ------------------------


def toy_model() -> torch.nn.Module:
    return torch.nn.Linear(3, 1)


def weights_of(version: int) -> dict:
    """Every entry equals the version, so the payload's sum of weights / 4 is the version that sampled it."""
    return {"weight": torch.full((1, 3), float(version)), "bias": torch.full((1,), float(version))}


class SlowLoad(torch.nn.Linear):
    """``load_state_dict`` leaves a marker file and sleeps 2 s, so that a kill lands inside it."""

    def __init__(self, marker: str):
        super().__init__(3, 1)
        self.marker = marker

    def load_state_dict(self, state, *args, **kwargs):
        Path(self.marker).write_text(str(os.getpid()))
        time.sleep(2.0)
        return super().load_state_dict(state, *args, **kwargs)


def slow_model(marker: str) -> torch.nn.Module:
    return SlowLoad(marker)


def _explode(msg):
    raise RuntimeError(msg)


class Bomb:
    """Pickles fine in the actor; unpickling it raises (in the learner)."""

    def __reduce__(self):
        return _explode, ("this payload refuses to be unpickled",)


def toy_sample(model, rng_seed, request, delay=0.0, big=0, hang_at=None, bomb_at=None, fail_at=None):
    if hang_at is not None and request >= hang_at:
        time.sleep(1000)
    if fail_at is not None and request == fail_at:
        raise ValueError(f"toy sampler failed on request {request}")
    if delay:
        time.sleep(delay)
    w = sum(float(p.sum()) for p in model.parameters())
    out = {"version_from_weights": w / 4.0, "request": request}
    if big:
        out["big"] = torch.ones(big)                 # float32: 4 * big bytes
    if bomb_at is not None and request == bomb_at:
        out["bomb"] = Bomb()
    return out


def garbage_sample(model, rng_seed, request):
    """On request 1, write 64 bytes of garbage straight into the actor's own sample pipe (found through gc)."""
    if request == 1:
        chan = next(o for o in gc.get_objects() if type(o).__name__ == "_ProcessChannel")
        os.write(chan.out_fd, b"garbage!" * 8)
    return toy_sample(model, rng_seed, request)


# ---- the scenario side (runs as `python test_distributed_faults.py SCENARIO TMPDIR`) -----------------------------


def _children(pid: int) -> list[str]:
    """The live child processes of ``pid`` (from /proc), without multiprocessing's resource tracker."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == pid and "resource_tracker" not in cmd:
            found.append(f"{d} ({fields[0]}) {cmd[:120]}")
    return found


def _wchans(pid: int) -> list[str]:
    """Where each thread of ``pid`` sleeps in the kernel (``anon_pipe_write``/``pipe_write``: writing a pipe)."""
    out = []
    for t in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.append((t / "wchan").read_text())
        except OSError:
            pass
    return out


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_until(cond, limit: float) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def _track(pool) -> list[int]:
    pids = [p.pid for p in pool._procs]
    POOL_PIDS[:] = pids
    return pids


def _attempt(res: dict, key: str, fn):
    """Run ``fn``; record what it returned or raised, and how long it took, under ``key``."""
    t = time.monotonic()
    try:
        out = fn()
        res[key] = "returned"
    except Exception as e:  # noqa: BLE001 - the test asserts on the type and message
        out = None
        res[key] = f"{type(e).__name__}: {e}"
    res[key + "_s"] = time.monotonic() - t
    return out


def _keys(samples) -> list[list[int]]:
    return [[s.actor, s.seq] for s in samples]


def scenario_kill_holding_weights(tmp: str, res: dict) -> None:
    """H4: the actor is killed inside load_state_dict (where 0.2 held the weights lock)."""
    marker = os.path.join(tmp, "loading")
    with ActorPool(functools.partial(slow_model, marker), toy_sample, n_actors=1, backend="process",
                   timeout=5) as pool:
        pid = _track(pool)[0]
        pool.publish(weights_of(0), 0)
        res["inside_load"] = _wait_until(lambda: os.path.exists(marker), 30)
        os.kill(pid, signal.SIGKILL)
        res["stage"] = "publish after the kill"
        _attempt(res, "publish", lambda: pool.publish(weights_of(1), 1))
        res["stage"] = "get after the kill"
        _attempt(res, "get", lambda: pool.get(1, timeout=5))
        procs = pool._procs
    res["stage"] = "closed"
    res["alive"] = [p.is_alive() for p in procs]


def scenario_kill_mid_write(tmp: str, res: dict) -> None:
    """H5: the actor is killed while it writes a 64 MiB sample into its pipe."""
    sample = functools.partial(toy_sample, big=2 ** 24)
    with ActorPool(toy_model, sample, n_actors=1, backend="process", queue_size=2, timeout=5) as pool:
        pid = _track(pool)[0]
        pool.publish(weights_of(0), 0)
        res["writing"] = _wait_until(lambda: any("pipe_write" in w for w in _wchans(pid)), 30)
        os.kill(pid, signal.SIGKILL)
        res["stage"] = "get after the kill"
        _attempt(res, "get", lambda: pool.get(1, timeout=5))
        res["lost"] = [list(x[:2]) for x in getattr(pool, "lost", [])]
        procs = pool._procs
    res["stage"] = "closed"
    res["alive"] = [p.is_alive() for p in procs]


def scenario_stopped_mid_write(tmp: str, res: dict) -> None:
    """An actor that hangs (SIGSTOP) halfway through writing a 64 MiB sample: get's timeout still holds."""
    sample = functools.partial(toy_sample, big=2 ** 24)
    with ActorPool(toy_model, sample, n_actors=1, backend="process", queue_size=2, timeout=5) as pool:
        pid = _track(pool)[0]
        pool.publish(weights_of(0), 0)
        res["writing"] = _wait_until(lambda: any("pipe_write" in w for w in _wchans(pid)), 30)
        os.kill(pid, signal.SIGSTOP)
        res["stage"] = "get while the actor is stopped"
        _attempt(res, "get", lambda: pool.get(1, timeout=3))
        os.kill(pid, signal.SIGCONT)
        res["stage"] = "get after SIGCONT"
        got = _attempt(res, "get_again", lambda: pool.get(2, timeout=20)) or []
        res["keys"] = _keys(got)
        res["big_ok"] = all(float(s.payload["big"].sum()) == 2 ** 24 for s in got)
        procs = pool._procs
    res["stage"] = "closed"
    res["alive"] = [p.is_alive() for p in procs]


def scenario_dead_among_live(tmp: str, res: dict) -> None:
    """One of two actors is killed; the other keeps the queue full: the next gets must report the dead one."""
    with ActorPool(toy_model, toy_sample, n_actors=2, backend="process", queue_size=16, timeout=10) as pool:
        pids = _track(pool)
        pool.publish(weights_of(0), 0)
        got, version = [], 0
        while {s.actor for s in got} != {0, 1} and len(got) < 400:        # both actors deliver
            got += pool.get(1, timeout=20)
        os.kill(pids[1], signal.SIGKILL)
        res["stage"] = "gets after the kill"
        t0, err = time.monotonic(), None
        while time.monotonic() - t0 < 10:       # a slow learner: the survivor never lets the queue run dry
            time.sleep(0.05)
            try:
                got += pool.get(1, timeout=10)
            except ActorError as e:
                err = str(e)
                break
            version += 1
            pool.publish(weights_of(version), version)
        res["error"], res["error_s"] = err, time.monotonic() - t0
        res["again"] = "returned"
        for _ in range(17):             # the failure is not forgotten (after at most queue_size whole samples)
            try:
                got += pool.get(1, timeout=2)
            except Exception as e:  # noqa: BLE001
                res["again"] = f"{type(e).__name__}: {e}"
                break
        res["keys"] = _keys(got)
        res["tags_ok"] = all(s.payload["version_from_weights"] == s.version for s in got)
        procs = pool._procs
    res["stage"] = "closed"
    res["alive"] = [p.is_alive() for p in procs]


def scenario_unpickling_raises(tmp: str, res: dict) -> None:
    """Actor 0's sample seq 1 cannot be unpickled in the learner: a clear ActorError, recorded, the pool goes on."""
    sample = functools.partial(toy_sample, bomb_at=1)
    with ActorPool(toy_model, sample, n_actors=1, backend="process", queue_size=2, timeout=20) as pool:
        _track(pool)
        pool.publish(weights_of(0), 0)
        got = pool.get(1)
        _attempt(res, "bad", lambda: pool.get(1))
        got += _attempt(res, "after", lambda: pool.get(2)) or []
        res["keys"] = _keys(got)
        res["lost"] = [list(x[:2]) for x in getattr(pool, "lost", [])]
        procs = pool._procs
    res["stage"] = "closed"
    res["alive"] = [p.is_alive() for p in procs]


def scenario_garbage_on_the_pipe(tmp: str, res: dict) -> None:
    """An actor sends bytes that are not a sample: a clear ActorError, not a hang or a huge allocation."""
    with ActorPool(toy_model, garbage_sample, n_actors=1, backend="process", queue_size=2, timeout=20) as pool:
        _track(pool)
        pool.publish(weights_of(0), 0)
        got = pool.get(1)
        _attempt(res, "bad", lambda: pool.get(1, timeout=5))
        res["keys"] = _keys(got)
        procs = pool._procs
    res["alive"] = [p.is_alive() for p in procs]


def scenario_hung_actor(tmp: str, res: dict) -> None:
    """An actor hangs in sample_fn: get raises TimeoutError in time, close terminates the actor."""
    sample = functools.partial(toy_sample, hang_at=1)
    with ActorPool(toy_model, sample, n_actors=1, backend="process", timeout=3) as pool:
        _track(pool)
        pool.publish(weights_of(0), 0)
        got = pool.get(1, timeout=20)
        _attempt(res, "get", lambda: pool.get(1, timeout=2))
        res["keys"] = _keys(got)
        procs = pool._procs
        t = time.monotonic()
    res["close_s"] = time.monotonic() - t
    res["alive"] = [p.is_alive() for p in procs]


def scenario_garbage_collected(tmp: str, res: dict) -> None:
    """R3: a pool started without `with` and dropped: its actors stop, and no reference cycle keeps it alive."""
    gc.disable()                                        # only reference counting may free the pool
    pool = ActorPool(toy_model, toy_sample, n_actors=2, backend="process", timeout=5).start()
    pids = _track(pool)
    pool.publish(weights_of(0), 0)
    pool.get(2, timeout=30)
    ref = weakref.ref(pool)
    del pool
    res["freed_without_gc"] = ref() is None
    gc.enable()
    gc.collect()
    res["stage"] = "waiting for the actors to stop"
    res["stopped"] = _wait_until(lambda: not any(map(_running, pids)), 15)


def scenario_simulated_drops_everything(tmp: str, res: dict) -> None:
    """H3: every sample is (almost surely) older than max_lag: get(timeout=1) must raise TimeoutError in time."""
    lags = LagDistribution(probs=(1e-12, 1.0 - 1e-12))    # lag 0 is possible, so the pool is allowed
    with ActorPool(toy_model, toy_sample, n_actors=2, backend="simulated", lags=lags, max_lag=0) as pool:
        for v in range(3):
            pool.publish(weights_of(v), v)
        res["stage"] = "get"
        _attempt(res, "get", lambda: pool.get(1, timeout=1))
        res["dropped"] = len(pool.dropped)
        seqs = {a: sorted(s.seq for s in pool.dropped if s.actor == a) for a in range(2)}
        res["dropped_contiguous"] = all(v == list(range(len(v))) for v in seqs.values())


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")}


def _bail(res: dict) -> None:
    """The watchdog: the scenario hung. Kill its pool's actors (by PID), report, exit."""
    for pid in POOL_PIDS:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    res["hung"] = True
    print(MARK + json.dumps(res, default=str), flush=True)
    os._exit(HUNG)


def _scenario_main(name: str, tmp: str) -> None:
    res: dict = {"scenario": name, "stage": "start"}
    dog = threading.Timer(LIMIT, _bail, args=(res,))
    dog.daemon = True
    dog.start()
    t0 = time.monotonic()
    try:
        SCENARIOS[name](tmp, res)
    except BaseException as e:  # noqa: BLE001 - reported to the test
        res["error_raised"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
    res["seconds"] = time.monotonic() - t0
    res["children"] = _children(os.getpid())
    dog.cancel()
    print(MARK + json.dumps(res, default=str), flush=True)


# ---- the pytest side --------------------------------------------------------------------------------------


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _kill_tree(pid: int) -> None:
    """After a timeout: SIGKILL the scenario process and its children (leaving the resource tracker, which then
    removes what they registered)."""
    todo = [pid]
    while todo:
        p = todo.pop()
        todo += [int(c.split()[0]) for c in _children(p)]
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def run_scenario(name: str, tmp_path) -> dict:
    shm_before = _shm()
    proc = subprocess.Popen([sys.executable, str(HERE), name, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(HERE.parent.parent))
    try:
        out, err = proc.communicate(timeout=LIMIT + 20)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"scenario {name} hung past its watchdog:\n{out[-3000:]}\n{err[-3000:]}")
    lines = [line for line in out.splitlines() if line.startswith(MARK)]
    assert lines, f"scenario {name} reported nothing (exit {proc.returncode}):\n{out[-3000:]}\n{err[-5000:]}"
    res = json.loads(lines[-1][len(MARK):])
    res["stderr"] = err[-5000:]
    assert not res.get("hung"), f"scenario {name} hung at stage {res.get('stage')!r}: {res}"
    assert proc.returncode == 0 and "error_raised" not in res, f"scenario {name} failed: {res}"
    assert res["children"] == [], f"child processes left: {res['children']}"
    new = set()
    for _ in range(20):                    # the resource tracker may still be cleaning up
        new = _shm() - shm_before
        if not new:
            break
        time.sleep(0.1)
    assert not new, f"/dev/shm entries left behind: {sorted(new)}"
    return res


def test_actor_killed_while_it_reads_the_weights_does_not_block_publish(tmp_path):
    """H4. 0.2: publish blocks forever on the weights lock the dead actor held."""
    res = run_scenario("kill_holding_weights", tmp_path)
    assert res["inside_load"]
    assert res["publish"] == "returned" and res["publish_s"] < 1.0
    assert res["get"].startswith("ActorError") and "actor 0 (exit code -9)" in res["get"], res["get"]
    assert res["get_s"] < 5 + 5
    assert res["alive"] == [False]


def test_actor_killed_mid_write_of_a_large_sample_is_reported_within_the_timeout(tmp_path):
    """H5. 0.2: get(timeout=5) never returns (the rest of the message never comes)."""
    res = run_scenario("kill_mid_write", tmp_path)
    assert res["writing"], "the actor never blocked inside a pipe write"
    assert res["get"].startswith("ActorError"), res["get"]
    assert "actor 0 (exit code -9)" in res["get"] and "seq 0" in res["get"]
    assert res["get_s"] < 5 + 5
    assert res["lost"] == [[0, 0]]                     # the half-written sample is recorded, not silently gone
    assert res["alive"] == [False]


def test_actor_stopped_mid_write_times_out_and_then_delivers(tmp_path):
    """A hung (SIGSTOPped) writer: TimeoutError within the timeout; after SIGCONT its samples arrive whole."""
    res = run_scenario("stopped_mid_write", tmp_path)
    assert res["writing"]
    assert res["get"].startswith("TimeoutError") and res["get_s"] < 3 + 5, (res["get"], res["get_s"])
    assert res["get_again"] == "returned" and res["keys"] == [[0, 0], [0, 1]] and res["big_ok"]
    assert res["alive"] == [False]


def test_a_dead_actor_among_live_ones_is_reported(tmp_path):
    """0.2: never reported; the survivor's samples keep coming and the throughput halves silently."""
    res = run_scenario("dead_among_live", tmp_path)
    assert res["error"] is not None, "the dead actor was never reported"
    assert "actor 1 (exit code -9)" in res["error"], res["error"]
    assert res["error_s"] < 8                          # 0.2: nothing in 10 s
    assert res["again"].startswith("ActorError") and "actor 1" in res["again"]
    keys = [tuple(k) for k in res["keys"]]
    assert len(set(keys)) == len(keys)                 # nothing duplicated
    for a in (0, 1):                                   # nothing lost among what was delivered
        seqs = [s for b, s in keys if b == a]
        assert seqs == list(range(len(seqs)))
    assert res["tags_ok"] and res["alive"] == [False, False]


def test_a_payload_that_cannot_be_unpickled_is_named_and_recorded(tmp_path):
    """0.2: a raw RuntimeError from pickle.loads, and actor 0's seq 1 vanishes without a record."""
    res = run_scenario("unpickling_raises", tmp_path)
    assert res["bad"].startswith("ActorError"), res["bad"]
    assert "actor 0's sample seq 1" in res["bad"] and "refuses to be unpickled" in res["bad"]
    assert res["lost"] == [[0, 1]]
    assert res["after"] == "returned" and res["keys"] == [[0, 0], [0, 2], [0, 3]]   # the pool goes on
    assert res["alive"] == [False]


def test_garbage_on_an_actors_pipe_is_reported(tmp_path):
    """Bytes that are not a frame: ActorError naming the actor, within the timeout; the actor is stopped."""
    res = run_scenario("garbage_on_the_pipe", tmp_path)
    assert res["bad"].startswith("ActorError") and "actor 0 sent a malformed message" in res["bad"], res["bad"]
    assert res["bad_s"] < 5 + 5 and res["keys"] == [[0, 0]] and res["alive"] == [False]


def test_a_hung_actor_times_out_and_is_terminated(tmp_path):
    """The behaviour the review found right stays: TimeoutError in time, the hung actor terminated by close."""
    res = run_scenario("hung_actor", tmp_path)
    assert res["get"].startswith("TimeoutError") and res["get_s"] < 2 + 5
    assert res["keys"] == [[0, 0]]
    assert res["close_s"] < 3 + 5 and res["alive"] == [False]


def test_a_garbage_collected_pool_stops_its_actors(tmp_path):
    """R3. 0.2: the actors of a dropped pool go on sampling (daemons end only with the interpreter)."""
    res = run_scenario("garbage_collected", tmp_path)
    assert res["freed_without_gc"], "a reference cycle keeps the dropped pool alive"
    assert res["stopped"], "the dropped pool's actors are still running"


def test_simulated_get_honours_its_timeout_while_it_drops_samples(tmp_path):
    """H3. 0.2: the deadline was checked only after a sample was kept: get never returned."""
    res = run_scenario("simulated_drops_everything", tmp_path)
    assert res["get"].startswith("TimeoutError") and res["get_s"] < 1 + 5, (res["get"], res["get_s"])
    assert res["dropped"] > 0 and res["dropped_contiguous"]


# ---- in-process checks (nothing here can hang) -----------------------------------------------------------------


def test_simulated_refuses_lags_that_max_lag_would_always_drop():
    """H3, the better half: a lag distribution whose support lies above max_lag is refused up front."""
    with pytest.raises(ValueError, match="lags.*max_lag=1"):
        ActorPool(toy_model, toy_sample, backend="simulated", lags=2, max_lag=1)
    with pytest.raises(ValueError, match="max_lag=2"):
        ActorPool(toy_model, toy_sample, backend="simulated", lags=LagDistribution.uniform(5, min_lag=3), max_lag=2)
    ActorPool(toy_model, toy_sample, backend="simulated", lags=LagDistribution.uniform(5, min_lag=2), max_lag=2)


def test_simulated_sample_fn_failure_names_the_lost_sample_and_the_pool_goes_on():
    """0.2: the raw ValueError reached the caller and actor 1's seq 1 silently never appeared."""
    sample = functools.partial(toy_sample, fail_at=3)              # request 3 = actor 1, seq 1 (2 actors)
    with ActorPool(toy_model, sample, n_actors=2, backend="simulated") as pool:
        pool.publish(weights_of(0), 0)
        first = pool.get(2)
        with pytest.raises(ActorError, match=r"actor 1 .*seq 1 \(request 3") as info:
            pool.get(3)
        assert "toy sampler failed on request 3" in str(info.value)
        assert isinstance(info.value.__cause__, ValueError)
        assert [x[:2] for x in pool.lost] == [(1, 1)]
        rest = pool.get(4)                                          # request 2 (kept), then 4, 5, 6
    got = first + rest
    assert [s.request for s in got] == [0, 1, 2, 4, 5, 6]
    for a in (0, 1):
        seqs = sorted([s.seq for s in got if s.actor == a] + [x[1] for x in pool.lost if x[0] == a])
        assert seqs == list(range(len(seqs)))                       # consumed + lost: no gap, no duplicate


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_publish_refuses_non_finite_weights(bad):
    """0.2 published NaN weights without complaint."""
    with ActorPool(toy_model, toy_sample) as pool:
        w = weights_of(0)
        w["bias"][0] = bad
        with pytest.raises(ValueError, match=r"state_dict\['bias'\] must be finite"):
            pool.publish(w, 0)
        assert pool.version == -1
        pool.publish(weights_of(0), 0)                              # the pool is still usable


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] in SCENARIOS:
    _scenario_main(sys.argv[1], sys.argv[2])


def test_a_weights_copy_that_does_not_match_the_published_digest_is_never_loaded():
    """The seqlock's guard that does not depend on the CPU's memory ordering: a copy that is not what the
    learner published (here: weights changed behind the counter's back, as a torn copy on a weakly ordered
    CPU would be) is refused until the digest matches."""
    import multiprocessing as mp

    from rlkit import distributed as D

    class Recorder:
        loaded = None

        def load_state_dict(self, state):
            self.loaded = {k: v.clone() for k, v in state.items()}

    w = {"a": torch.arange(4.0), "b": torch.ones(3)}
    ctl = mp.RawArray("q", 4)
    ctl[D._VERSION], ctl[D._DIGEST] = 5, D._digest(5, w.values())
    credits_r, credits_w = mp.Pipe(duplex=False)
    out_r, out_w = mp.Pipe(duplex=False)
    chan = D._ProcessChannel(w, ctl, credits_r, out_w, os.getppid())
    w["b"][0] = 7.0                                  # not what the digest describes
    rec = Recorder()
    stopper = threading.Timer(0.5, lambda: ctl.__setitem__(D._STOP, 1))
    stopper.start()
    t0 = time.monotonic()
    assert chan.load(rec) is None and rec.loaded is None       # kept retrying until asked to stop
    assert time.monotonic() - t0 >= 0.4
    ctl[D._STOP], ctl[D._DIGEST] = 0, D._digest(5, w.values())
    assert chan.load(rec) == 5 and rec.loaded["b"][0].item() == 7.0
    for c in (credits_r, credits_w, out_r, out_w):
        c.close()
