r"""Asynchronous actors and one learner: a simulated-lag backend, real processes, and Ray.

Chapter: 16_offpolicy_multistep (V-trace, Retrace and Tree-Backup with asynchronous actors).

An **actor** holds a copy of the policy and samples with it; the **learner** trains, and from time
to time *publishes* its weights under a version counter :math:`k`. Before every sample an actor
picks up the newest published version, and it records that version with the sample. When the
learner consumes the sample, it has moved on to some version :math:`k' \ge k`; the **lag** of the
sample is

.. math:: \ell = k_{\text{learner at consumption}} - k_{\text{sample}} \;\ge 0 \qquad\text{(the lag)}.

The behaviour log-probabilities :math:`\log\mu(y_t)` are stored in the payload *at sampling time*,
so the off-policy corrections of :mod:`rlkit.offpolicy` (V-trace, Retrace) need only
:math:`\log\pi - \log\mu`; the version is what lets the learner measure :math:`\ell`.

:class:`ActorPool` is one interface with three backends that differ only in how weights and
samples move (the *data plane*) and who runs the actors:

=============  =================================================================================
``backend``    what runs the actors
=============  =================================================================================
simulated      nothing runs concurrently: :meth:`ActorPool.get` samples in the learner's process
               with the weights ``lag`` versions old, ``lag`` drawn from a
               :class:`rlkit.staleness.LagDistribution`, old versions kept in a
               :class:`rlkit.staleness.PolicyArchive`. Deterministic: quantitative comparisons use it.
process        ``n_actors`` processes (``torch.multiprocessing``, spawn, one torch thread each). Weights
               live in shared-memory tensors under a lock; samples come back through a bounded queue.
ray            ``n_actors`` Ray actors running the same actor loop; weights go through the object
               store (one ``ray.put`` per version), samples through a ``ray.util.queue.Queue``.
=============  =================================================================================

The contract, the same for every backend:

* every :class:`Sampled` carries the ``version`` of the weights that produced it, the ``actor``
  and that actor's sequence number ``seq`` (0, 1, 2, ... per actor), the ``request`` index
  :math:`\text{seq}\cdot n_{\text{actors}} + \text{actor}` and the ``rng_seed`` it was sampled with;
  ``payload = sample_fn(model_with_those_weights, rng_seed, request)``, so any sample can be
  recomputed from its version's weights;
* nothing is lost or duplicated: per actor the consumed and dropped sequence numbers are
  0, 1, 2, ... in order;
* staleness is bounded with :func:`rlkit.staleness.version_window`: with ``max_lag`` set, a sample
  whose lag exceeds it is dropped at consumption (counted in ``pool.dropped``); the
  bounded queue (``queue_size``) makes actors block instead of running far ahead of the learner;
* :meth:`ActorPool.lag_histogram` counts the lag :math:`\ell` of every consumed sample.

A loop (the learner), with the tiny LLM's actor pieces of :mod:`rlkit.llm.actors`::

    from rlkit.llm.actors import GroupSampler, merge_batches, tiny_llm

    with ActorPool(tiny_llm, GroupSampler("addition", group_size=8), n_actors=2,
                   backend="process") as pool:
        pool.publish(model.state_dict(), version=0)
        for k in range(updates):
            batch, versions = merge_batches(pool.get(8), tok)  # 8 groups, each with its version
            ...                                           # one update with V-trace targets
            pool.publish(model.state_dict(), version=k + 1)
        print(pool.lag_histogram())

``make_model`` and ``sample_fn`` must be picklable, importable callables for the real backends
(a function in a module, a ``functools.partial`` of one, or an instance of a module-level
class such as :class:`rlkit.llm.actors.GroupSampler`): a function defined in a notebook cannot be imported by a
spawned process. Ray is an optional extra: ``pip install -e ".[ray]"``.
"""
from __future__ import annotations

import copyreg
import io
import math
import numbers
import os
import pickle
import queue as _queue
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import _validate as V
from .staleness import LagDistribution, PolicyArchive, version_window

Tensor = torch.Tensor

__all__ = ["BACKENDS", "Sampled", "ActorError", "ActorPool", "loopback_only"]

#: The values of ``ActorPool(backend=...)``.
BACKENDS = ("simulated", "process", "ray")

_RAY_HINT = 'the "ray" backend needs Ray, an optional extra: pip install -e ".[ray]" (or pip install "ray==2.60.0")'


@dataclass(frozen=True)
class Sampled:
    r"""One sample as the learner receives it from :meth:`ActorPool.get`.

    * ``payload``: what ``sample_fn`` returned (for :class:`rlkit.llm.actors.GroupSampler`, an
      :class:`rlkit.llm.rl.Batch` whose ``rollout.model_logprobs`` are the behaviour log-probs).
    * ``version``: the version of the weights that produced it.
    * ``actor``: the actor (``0 .. n_actors-1``); ``seq``: that actor's sequence number (0, 1, ...).
    * ``lag``: :math:`\ell` = the learner's version when :meth:`ActorPool.get` returned it minus
      ``version`` (the lag of the module docstring).
    * ``request``: :math:`\text{seq}\cdot n_{\text{actors}} + \text{actor}`, the index passed to ``sample_fn``.
    * ``rng_seed``: the seed passed to ``sample_fn``, a function of ``(seed, request)`` only.

    Chapter: 16_offpolicy_multistep.
    """

    payload: Any
    version: int
    actor: int
    seq: int
    lag: int = 0
    request: int = 0
    rng_seed: int = 0


class ActorError(RuntimeError):
    """An actor failed; the message carries the actor's own traceback. Chapter: 16_offpolicy_multistep."""


def _tensor_from_numpy(a: np.ndarray) -> Tensor:
    return torch.from_numpy(a)


def _reduce_tensor(t: Tensor):
    """Pickle a CPU tensor as its numpy array (one memory copy), not through torch.save's per-tensor archive."""
    if t.device.type != "cpu" or t.requires_grad or t.layout != torch.strided or t.dtype in (
            torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2) or t.is_quantized or t.is_conj() or t.is_neg():
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    return _tensor_from_numpy, (t.numpy(),)


def _dumps(obj) -> bytes:
    """``pickle.dumps`` with CPU tensors as numpy arrays: about 10x faster to load for small tensors."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    p.dispatch_table = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor}
    p.dump(obj)
    return buf.getvalue()


def _rng_seed(seed: int, request: int) -> int:
    """The seed of request ``request``: 63 bits of ``numpy.random.SeedSequence([seed, request])``."""
    hi, lo = np.random.SeedSequence([seed, request]).generate_state(2, dtype=np.uint32)
    return ((int(hi) << 32) | int(lo)) >> 1


# ============================================================================================
# The actor loop: the same code for the process and the Ray backends
# ============================================================================================

def _actor_loop(actor: int, n_actors: int, seed: int, make_model, sample_fn, channel) -> None:
    """Sample forever with the newest published weights; put ``(actor, seq, version, ...)`` items.

    ``channel`` is the backend's data plane: ``newest()`` -> newest published version (-1: none yet,
    None: stop), ``load(model)`` -> copies the newest weights into ``model`` and returns their
    version, ``put(item)`` -> False once the pool is stopping.
    """
    torch.set_num_threads(1)
    model = make_model()
    model.eval()
    held, seq = -1, 0
    while True:
        newest = channel.newest()
        if newest is None:
            return
        if newest < 0:
            time.sleep(0.002)
            continue
        if newest != held:
            held = channel.load(model)
        request = seq * n_actors + actor
        rng_seed = _rng_seed(seed, request)
        with torch.no_grad():
            payload = sample_fn(model, rng_seed, request)
        if not channel.put(("ok", actor, seq, held, request, rng_seed, payload)):
            return
        seq += 1


class _ProcessChannel:
    """Shared-memory weights under a lock (the version is read and the weights copied together)."""

    def __init__(self, weights, version, lock, stop, out):
        self.weights, self.version, self.lock, self.stop, self.out = weights, version, lock, stop, out

    def newest(self):
        return None if self.stop.is_set() else self.version.value

    def load(self, model) -> int:
        with self.lock:
            model.load_state_dict(self.weights)
            return int(self.version.value)

    def put(self, item) -> bool:
        blob = _dumps(item)             # bytes: no shared-memory handles in flight
        while not self.stop.is_set():
            try:
                self.out.put(blob, timeout=0.05)
                return True
            except _queue.Full:
                continue
        return False


def _process_main(actor, n_actors, seed, make_model, sample_fn, weights, version, lock, stop, out):
    """Entry point of an actor process (spawn): run the loop, report an exception with its traceback."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        _actor_loop(actor, n_actors, seed, make_model, sample_fn, _ProcessChannel(weights, version, lock, stop, out))
        out.cancel_join_thread()        # stopping: undelivered samples are not waited for
    except BaseException:               # noqa: BLE001 - everything goes back to the learner
        msg = pickle.dumps(("error", actor, traceback.format_exc()))
        try:
            out.put(msg, timeout=5.0)
        except Exception:               # noqa: BLE001 - the learner is gone or the queue is full
            out.cancel_join_thread()


class _RayChannel:
    """Weights through the object store: a holder actor keeps ``(version, [ref])`` of the newest."""

    def __init__(self, holder, out):
        import ray
        self.ray, self.holder, self.out = ray, holder, out
        self._ref = None
        self._version = -1

    def newest(self):
        stop, version, box = self.ray.get(self.holder.latest.remote())
        if stop:
            return None
        if version >= 0:
            self._version, self._ref = version, box[0]
        return version

    def load(self, model) -> int:
        model.load_state_dict(pickle.loads(self.ray.get(self._ref)))
        return self._version

    def put(self, item) -> bool:
        from ray.util.queue import Full
        blob = _dumps(item)
        while True:
            try:
                self.out.put(blob, block=True, timeout=0.05)
                return True
            except Full:
                if self.ray.get(self.holder.latest.remote())[0]:
                    return False


class _RayHolder:
    """The newest published weights (as an object-store reference) and the stop flag."""

    def __init__(self):
        self.version, self.box, self.stop_flag = -1, None, False

    def publish(self, version, box):
        self.version, self.box = version, box

    def latest(self):
        return self.stop_flag, self.version, self.box

    def stop(self):
        self.stop_flag = True


class _RayActor:
    """A Ray actor that runs ``_actor_loop`` (the actor code of the process backend)."""

    def run(self, actor, n_actors, seed, make_model, sample_fn, holder, out):
        try:
            _actor_loop(actor, n_actors, seed, make_model, sample_fn, _RayChannel(holder, out))
        except BaseException:           # noqa: BLE001 - everything goes back to the learner
            out.put(pickle.dumps(("error", actor, traceback.format_exc())), timeout=5.0)
        return actor


def _import_ray():
    try:
        import ray
    except ImportError as e:
        raise ImportError(_RAY_HINT) from e
    return ray


def loopback_only() -> bool:
    """True when the only network interface of this process's namespace is the loopback ``lo``.

    Ray probes external addresses to find its own IP; on the book's machines Ray is started only
    where this holds (``unshare -rn sh -c 'ip link set lo up && exec python ...'``), see
    ``tests/test_distributed_ray.py``. Chapter: 16_offpolicy_multistep.
    """
    return sorted(name for _, name in socket.if_nameindex()) == ["lo"]


# ============================================================================================
# The pool
# ============================================================================================

def _check_importable(fn, name: str) -> None:
    """A spawned process or a Ray worker must be able to unpickle ``fn``: refuse what it cannot."""
    target = getattr(fn, "func", fn)            # functools.partial
    mod = getattr(target, "__module__", None) or getattr(type(target), "__module__", None)
    main = sys.modules.get("__main__")
    if mod == "__main__" and not getattr(main, "__file__", None):
        raise TypeError(f"{name} is defined in an interactive session (a notebook or the REPL), which a spawned "
                        f"actor process cannot import; define it in a module (e.g. rlkit) or use "
                        f"rlkit.llm.actors.tiny_llm / GroupSampler, or use backend='simulated'")
    try:
        pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing
        raise TypeError(f"{name} must be picklable for a real backend (a module-level function, a "
                        f"functools.partial of one, or a module-level class instance); pickling failed: {e}") from e


def _as_lags(x) -> LagDistribution:
    if x is None:
        return LagDistribution.fixed(0)
    V.instance_of(x, "lags", (LagDistribution, numbers.Integral), "LagDistribution, an int >= 0 or None")
    return x if isinstance(x, LagDistribution) else LagDistribution.fixed(V.int_in(x, "lags", 0))


class ActorPool:
    r"""``n_actors`` actors sampling with published, versioned weights; the learner consumes their samples.

    Use it as a context manager (``with ActorPool(...) as pool:``): on exit, also after an exception,
    actor processes are stopped and joined (terminated after a timeout), queues closed, Ray actors
    killed and a Ray instance the pool started shut down. Publish the first weights before the
    first :meth:`get`.

    Args:
        make_model: ``make_model() -> nn.Module``, builds the model an actor samples with (its
            weights are replaced by the published ones). For ``"process"``/``"ray"`` a picklable,
            importable callable (see the module docstring).
        sample_fn: ``sample_fn(model, rng_seed, request) -> payload``: one sample (e.g. one group of
            responses with their behaviour log-probs) drawn with ``model`` and seeded by
            ``rng_seed``; ``payload`` must be picklable. Called under ``torch.no_grad()``.
        n_actors: number of actors, ``>= 1``.
        backend: ``"simulated"``, ``"process"`` or ``"ray"`` (table in the module docstring).
        seed: ``>= 0``; request :math:`j`'s ``rng_seed`` is a function of ``(seed, j)`` only.
        lags: ``"simulated"`` only: a :class:`rlkit.staleness.LagDistribution` or an int (a fixed lag);
            ``None`` is lag 0 (the in-process loop: sample with the newest weights). The real
            backends *measure* the lag instead. A requested lag larger than the versions published
            so far is clamped to the oldest version held (early in training).
        queue_size: ``>= 1``; ``"process"``/``"ray"``: samples waiting for the learner, beyond which
            actors block (back-pressure, which bounds how far they run ahead).
        max_lag: ``None`` or an int ``>= 0``: drop (and record in ``dropped``) samples whose lag at
            consumption exceeds it (:func:`rlkit.staleness.version_window` with ``window = max_lag + 1``).
        timeout: seconds, ``> 0``: the default of :meth:`get` and the limit of start-up and shut-down steps.
        address: ``"ray"`` only: the address of an existing Ray cluster (``ray.init(address=...)``, e.g.
            ``"auto"`` on a node of the cluster, or ``"HEAD_IP:6379"``); ``None`` starts a local instance (or uses one
            already initialised in this process).
        ray_init: ``"ray"`` only: extra keyword arguments of the local ``ray.init`` (default
            ``num_cpus=n_actors``, ``include_dashboard=False``, ``object_store_memory=200 MiB``,
            ``log_to_driver=False``).

    Attributes: ``version`` (the newest published), ``consumed`` (samples returned), ``dropped``
    (the list of dropped :class:`Sampled`), ``lags`` (the lag of every consumed sample, in order).
    :attr:`mean_lag` and :meth:`lag_histogram` summarise ``lags``.

    Chapter: 16_offpolicy_multistep.
    """

    def __init__(self, make_model: Callable, sample_fn: Callable, *, n_actors: int = 2, backend: str = "simulated",
                 seed: int = 0, lags: LagDistribution | int | None = None, queue_size: int = 4,
                 max_lag: int | None = None, timeout: float = 60.0, address: str | None = None,
                 ray_init: Mapping | None = None):
        self.make_model = V.is_callable(make_model, "make_model")
        self.sample_fn = V.is_callable(sample_fn, "sample_fn")
        self.n_actors = V.int_in(n_actors, "n_actors")
        self.backend = V.choice(backend, "backend", BACKENDS)
        self.seed = V.int_in(seed, "seed", 0)
        if backend != "simulated":
            V.unused(lags, "lags", "by backend='simulated' (the real backends measure the lag)")
        self.lag_distribution = _as_lags(lags)
        self.queue_size = V.int_in(queue_size, "queue_size")
        self.max_lag = None if max_lag is None else V.int_in(max_lag, "max_lag", 0)
        self.timeout = V.real_in(timeout, "timeout", 0.0, lo_open=True)
        if backend != "ray":
            V.unused(address, "address", "by backend='ray'")
            V.unused(ray_init, "ray_init", "by backend='ray'")
        if address is not None:
            V.nonempty_str(address, "address")
        if ray_init is not None:
            V.instance_of(ray_init, "ray_init", Mapping, "dict of ray.init keyword arguments")
            if address is not None:
                raise ValueError("ray_init configures a local Ray instance; with address= (an existing cluster) "
                                 "leave it None")
        self.address, self.ray_init = address, dict(ray_init or {})
        if backend != "simulated":
            _check_importable(make_model, "make_model")
            _check_importable(sample_fn, "sample_fn")
            if backend == "ray":
                _import_ray()
        self.version: int = -1
        self.consumed: int = 0
        self.lags: list[int] = []
        self.dropped: list[Sampled] = []
        self._template: dict[str, Tensor] | None = None
        self._started = self._closed = False
        self._next_request = 0                    # simulated
        self._pending: list[tuple] = []           # samples received by a get that timed out
        self._procs: list = []
        self._ray_started = False

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> ActorPool:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> ActorPool:
        """Start the actors (``with`` does it); returns the pool."""
        if self._closed:
            raise RuntimeError("this ActorPool was closed; make a new one")
        if self._started:
            return self
        template = self.make_model()
        V.instance_of(template, "make_model()", torch.nn.Module, "torch.nn.Module")
        self._scratch = template
        self._template = {k: v.detach().clone() for k, v in template.state_dict().items()}
        self._started = True
        try:
            getattr(self, f"_start_{self.backend}")()
        except BaseException:
            self.close()
            raise
        return self

    def _start_simulated(self) -> None:
        self._archive = PolicyArchive(capacity=self.lag_distribution.max + 1)
        self._lag_gen = torch.Generator().manual_seed(self.seed)

    def _start_process(self) -> None:
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        self._weights = {k: v.clone().share_memory_() for k, v in self._template.items()}
        self._shared_version = ctx.Value("q", -1, lock=False)
        self._lock = ctx.Lock()
        self._stop = ctx.Event()
        self._queue = ctx.Queue(maxsize=self.queue_size)
        for a in range(self.n_actors):
            p = ctx.Process(target=_process_main, name=f"rlkit-actor-{a}", daemon=True,
                            args=(a, self.n_actors, self.seed, self.make_model, self.sample_fn, self._weights,
                                  self._shared_version, self._lock, self._stop, self._queue))
            p.start()
            self._procs.append(p)

    def _start_ray(self) -> None:
        ray = self._ray = _import_ray()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")      # no usage reports
        if not ray.is_initialized() and self.address is None and not loopback_only() \
                and os.environ.get("RLKIT_RAY_ANY_NETWORK") != "1":
            # a local Ray probes external addresses to find its own IP: start it only where loopback is all
            raise RuntimeError(
                "backend='ray' would start a local Ray instance in a network namespace with interfaces "
                "other than loopback, and Ray probes external addresses to find its own. Run inside a "
                "loopback-only namespace: RAY_USAGE_STATS_ENABLED=0 unshare -rn sh -c 'ip link set lo up "
                "&& exec python your_script.py' (book/setup.md), pass address= of an existing cluster, or "
                "set RLKIT_RAY_ANY_NETWORK=1 if your machine may send that traffic.")
        from ray.util.queue import Queue
        if not ray.is_initialized():
            if self.address is not None:
                ray.init(address=self.address, log_to_driver=False)
            else:
                kw = dict(num_cpus=self.n_actors, include_dashboard=False, object_store_memory=200 * 2 ** 20,
                          log_to_driver=False)
                kw.update(self.ray_init)
                ray.init(**kw)
            self._ray_started = True
        self._holder = ray.remote(num_cpus=0)(_RayHolder).remote()
        self._rqueue = Queue(maxsize=self.queue_size, actor_options={"num_cpus": 0})
        actor_cls = ray.remote(num_cpus=1)(_RayActor)
        self._ray_actors = [actor_cls.remote() for _ in range(self.n_actors)]
        self._ray_runs = [h.run.remote(a, self.n_actors, self.seed, self.make_model, self.sample_fn, self._holder,
                                       self._rqueue) for a, h in enumerate(self._ray_actors)]

    def close(self) -> None:
        """Stop every actor and release the queues (idempotent; ``with`` calls it)."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        getattr(self, f"_close_{self.backend}")()

    def _close_simulated(self) -> None:
        self._archive = None

    def _close_process(self) -> None:
        stop, q = getattr(self, "_stop", None), getattr(self, "_queue", None)
        if stop is not None:
            stop.set()
        deadline = time.monotonic() + min(self.timeout, 10.0)
        while q is not None and any(p.is_alive() for p in self._procs) and time.monotonic() < deadline:
            try:                                      # drain, so that no actor waits on a full pipe
                while True:
                    q.get_nowait()
            except (_queue.Empty, OSError, EOFError, pickle.UnpicklingError):
                pass
            for p in self._procs:
                p.join(0.02)
        for p in self._procs:
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        if q is not None:
            q.cancel_join_thread()
            q.close()

    def _close_ray(self) -> None:
        ray = self._ray
        holder, runs = getattr(self, "_holder", None), getattr(self, "_ray_runs", [])
        try:
            if holder is not None:
                ray.get(holder.stop.remote(), timeout=min(self.timeout, 10.0))
            if runs:
                ray.wait(runs, num_returns=len(runs), timeout=min(self.timeout, 10.0))
        except Exception:  # noqa: BLE001 - shutting down regardless
            pass
        rq = getattr(self, "_rqueue", None)
        for h in [*getattr(self, "_ray_actors", []), holder, None if rq is None else rq.actor]:
            if h is None:
                continue
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001
                pass
        if self._ray_started:
            ray.shutdown()

    # ---- learner side ----------------------------------------------------------------------
    def _check_running(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"{what}: this ActorPool is closed")
        if not self._started:
            raise RuntimeError(f"{what}: start the pool first (`with ActorPool(...) as pool:` or pool.start())")

    def publish(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        r"""Publish the learner's weights as ``version`` (an int, larger than every earlier version).

        ``state_dict`` must have the keys, shapes and dtypes of ``make_model().state_dict()``.
        Actors pick the newest version up before their next sample (``"process"``: copied into
        shared memory under a lock; ``"ray"``: one ``ray.put``, read by every actor; ``"simulated"``:
        a frozen copy pushed into the :class:`rlkit.staleness.PolicyArchive`).
        """
        self._check_running("publish")
        version = V.int_in(version, "version", self.version + 1)
        V.instance_of(state_dict, "state_dict", Mapping, "Mapping[str, Tensor] (model.state_dict())")
        if set(state_dict) != set(self._template):
            missing = sorted(set(self._template) - set(state_dict))
            extra = sorted(set(state_dict) - set(self._template))
            raise ValueError(f"state_dict must have the keys of make_model().state_dict(); missing {missing}, "
                             f"unexpected {extra}")
        for k, ref in self._template.items():
            x = V.instance_of(state_dict[k], f"state_dict[{k!r}]", torch.Tensor)
            if x.shape != ref.shape or x.dtype != ref.dtype:
                raise ValueError(f"state_dict[{k!r}] must be {ref.dtype} {tuple(ref.shape)} like make_model()'s, "
                                 f"got {x.dtype} {tuple(x.shape)}")
        state = {k: v.detach().to("cpu") for k, v in state_dict.items()}
        if self.backend == "simulated":
            self._scratch.load_state_dict(state)
            self._archive.push(version, self._scratch)     # a frozen deep copy
        elif self.backend == "process":
            with self._lock:
                for k, v in state.items():
                    self._weights[k].copy_(v)
                self._shared_version.value = version
        else:
            ref = self._ray.put(_dumps(state))             # one copy in the object store, read by every actor
            self._ray.get(self._holder.publish.remote(version, [ref]), timeout=self.timeout)
        self.version = version

    def get(self, n: int, timeout: float | None = None) -> list[Sampled]:
        r"""The next ``n`` samples whose lag is at most ``max_lag`` (all of them when ``max_lag`` is None).

        Each returned :class:`Sampled` has ``lag`` = ``pool.version - sample.version``
        (the lag :math:`\ell`). Raises :class:`ActorError` with the actor's traceback if an actor failed, and
        ``TimeoutError`` if ``n`` samples did not arrive within ``timeout`` seconds (default: the
        pool's ``timeout``); the samples that did arrive are not lost: the next ``get`` returns them first.
        """
        self._check_running("get")
        n = V.int_in(n, "n")
        timeout = self.timeout if timeout is None else V.real_in(timeout, "timeout", 0.0, lo_open=True)
        if self.version < 0:
            raise RuntimeError("get: publish the first weights (pool.publish(model.state_dict(), version=0)) "
                               "before asking for samples")
        deadline = time.monotonic() + timeout
        items: list[tuple] = []                   # kept, in order; back to _pending if the time runs out
        while len(items) < n:
            if self._pending:
                item = self._pending.pop(0)
            else:
                try:
                    item = self._next(deadline, n, len(items))
                except TimeoutError:
                    self._pending = items + self._pending      # nothing is lost: the next get returns them
                    raise
            version = item[3]
            if self.max_lag is not None and not bool(
                    version_window(torch.tensor([version]), self.version, self.max_lag + 1)[0]):
                self.dropped.append(self._sampled(item))
                continue
            items.append(item)
            if len(items) < n and time.monotonic() > deadline:
                self._pending = items + self._pending
                raise TimeoutError(self._timeout_message(n, len(items), timeout))
        out = [self._sampled(item) for item in items]
        self.lags += [s.lag for s in out]
        self.consumed += len(out)
        return out

    def _sampled(self, item: tuple) -> Sampled:
        _, actor, seq, version, request, rng_seed, payload = item
        return Sampled(payload, version, actor, seq, self.version - version, request, rng_seed)

    def _next(self, deadline: float, n: int, got: int) -> tuple:
        return getattr(self, f"_next_{self.backend}")(deadline, n, got)

    def _next_simulated(self, deadline, n, got) -> tuple:
        j = self._next_request
        self._next_request += 1
        actor, seq = j % self.n_actors, j // self.n_actors
        lag = int(self.lag_distribution.sample(1, self._lag_gen)[0])
        target = int(self._archive.behaviour_versions(self.version, torch.tensor([lag]))[0])
        version = max(v for v in self._archive.versions if v <= target)    # target >= the oldest held
        rng_seed = _rng_seed(self.seed, j)
        with torch.no_grad():
            payload = self.sample_fn(self._archive.get(version), rng_seed, j)
        return "ok", actor, seq, version, j, rng_seed, payload

    def _timeout_message(self, n, got, timeout=None) -> str:
        return (f"get: {got} of {n} samples arrived in time from {self.n_actors} {self.backend} actors (they are "
                f"kept for the next get; pass a larger timeout= to ActorPool or get)")

    def _next_process(self, deadline, n, got) -> tuple:
        while True:
            try:
                item = pickle.loads(self._queue.get(timeout=0.05))
            except _queue.Empty:
                dead = [(i, p.exitcode) for i, p in enumerate(self._procs) if not p.is_alive()]
                if dead:
                    try:                             # an error message may still be in the pipe
                        item = pickle.loads(self._queue.get(timeout=1.0))
                    except _queue.Empty:
                        raise ActorError(f"actor(s) {', '.join(f'{i} (exit code {c})' for i, c in dead)} "
                                         f"stopped without reporting an error; their stderr says why (a spawned "
                                         f"process re-imports the main script: run it from a file, with the "
                                         f"loop under `if __name__ == '__main__':`)") from None
                elif time.monotonic() > deadline:
                    raise TimeoutError(self._timeout_message(n, got)) from None
                else:
                    continue
            if item[0] == "error":
                raise ActorError(f"actor {item[1]} raised an exception; its traceback:\n{item[2]}")
            return item

    def _next_ray(self, deadline, n, got) -> tuple:
        from ray.util.queue import Empty
        while True:
            try:
                item = pickle.loads(self._rqueue.get(block=True, timeout=0.2))
            except Empty:
                done, _ = self._ray.wait(self._ray_runs, num_returns=1, timeout=0)
                if done:
                    try:
                        item = pickle.loads(self._rqueue.get(block=True, timeout=1.0))
                    except Empty:
                        self._ray.get(done[0])          # raises the Ray error if the actor died
                        raise ActorError("a Ray actor stopped without reporting an error") from None
                elif time.monotonic() > deadline:
                    raise TimeoutError(self._timeout_message(n, got)) from None
                else:
                    continue
            if item[0] == "error":
                raise ActorError(f"actor {item[1]} raised an exception; its traceback:\n{item[2]}")
            return item

    # ---- measurements ----------------------------------------------------------------------
    def lag_histogram(self) -> Tensor:
        r"""``counts[l]`` = number of consumed samples with lag :math:`\ell = l`, ``long[max lag + 1]``.

        Empty (``long[0]``) before anything was consumed; dropped samples are not counted
        (they are in ``dropped``).
        """
        if not self.lags:
            return torch.zeros(0, dtype=torch.long)
        return torch.bincount(torch.tensor(self.lags, dtype=torch.long))

    @property
    def mean_lag(self) -> float:
        """The mean lag of the consumed samples (NaN before any)."""
        return float(np.mean(self.lags)) if self.lags else math.nan

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._started else "not started")
        return (f"ActorPool(backend={self.backend!r}, n_actors={self.n_actors}, version={self.version}, "
                f"consumed={self.consumed}, dropped={len(self.dropped)}, {state})")


# The tiny LLM's actor pieces moved to rlkit.llm.actors (rlkit 0.3): this module knows nothing about
# language models. The old names resolve there for one release, without importing rlkit.llm here.
_MOVED_TO_LLM = ("tiny_llm", "GroupSampler", "merge_batches")


def __getattr__(name):   # TODO(0.3): remove the re-export of the moved names after one release
    if name in _MOVED_TO_LLM:
        from .llm import actors
        return getattr(actors, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
