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
               live in shared-memory tensors behind a seqlock (no actor holds a lock); samples come
               back through one pipe per actor, read without blocking, ``queue_size`` in flight.
ray            ``n_actors`` Ray actors running the same actor loop; weights go through the object
               store (one ``ray.put`` per version), samples through a ``ray.util.queue.Queue``.
=============  =================================================================================

The contract, the same for every backend:

* every :class:`Sampled` carries the ``version`` of the weights that produced it, the ``actor``
  and that actor's sequence number ``seq`` (0, 1, 2, ... per actor), the ``request`` index
  :math:`\text{seq}\cdot n_{\text{actors}} + \text{actor}` and the ``rng_seed`` it was sampled with;
  ``payload = sample_fn(model_with_those_weights, rng_seed, request)``, so any sample can be
  recomputed from its version's weights;
* nothing is lost or duplicated unnoticed: per actor the consumed, dropped and lost
  (``pool.lost``) sequence numbers are 0, 1, 2, ... in order;
* staleness is bounded with :func:`rlkit.staleness.version_window`: with ``max_lag`` set, a sample
  whose lag exceeds it is dropped at consumption (counted in ``pool.dropped``); the
  bound ``queue_size`` on the samples in flight makes actors block instead of running far ahead of
  the learner;
* :meth:`ActorPool.lag_histogram` counts the lag :math:`\ell` of every consumed sample;
* every wait is bounded: :meth:`ActorPool.get` returns, raises ``TimeoutError`` or raises
  :class:`ActorError` within its ``timeout`` whatever an actor does (``"process"``: it hangs, dies
  at any moment, also while it reads the weights or writes a sample, or sends garbage); an actor that
  stopped is reported by index and exit code, also while others still deliver; a sample that
  cannot be delivered is named (actor, seq) and recorded in ``pool.lost``.

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
import select
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
import weakref
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from . import _validate as V
from .staleness import LagDistribution, PolicyArchive, version_window

try:
    import fcntl
except ImportError:                 # not POSIX: the process backend's pipes keep their default size
    fcntl = None

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
    """An actor failed, or a sample was lost. Chapter: 16_offpolicy_multistep.

    The message names the actor: with its own traceback if it raised, with its exit code if it
    stopped (the pool is then broken), with the sample's sequence number if one sample was lost
    (recorded in ``ActorPool.lost``; the pool goes on).
    """


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
    """Sample forever with the newest published weights; hand every sample to ``channel.put``.

    ``channel`` is the backend's data plane: ``newest()`` -> newest published version (-1: none yet,
    None: stop), ``load(model)`` -> copies the newest weights into ``model`` and returns their
    version (None: stop), ``put(actor, seq, version, request, rng_seed, payload)`` -> False once the
    pool is stopping.
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
            if held is None:
                return
        request = seq * n_actors + actor
        rng_seed = _rng_seed(seed, request)
        with torch.no_grad():
            payload = sample_fn(model, rng_seed, request)
        if not channel.put(actor, seq, held, request, rng_seed, payload):
            return
        seq += 1


# ============================================================================================
# The process backend's data plane
# ============================================================================================
#
# No actor ever holds anything the learner waits for, so killing one at any moment cannot block the learner:
#
# * Weights: one shared-memory tensor per state_dict entry and three shared int64 words written by the learner
#   only (a seqlock): _SEQ is odd while the learner copies new weights in, _VERSION is their version, _STOP asks
#   the actors to stop, _DIGEST is a CRC-32 of the version and the weights. An actor copies the weights into a
#   private snapshot and keeps the copy only if _SEQ was even before the copy and unchanged after it, AND the
#   digest of (the version it read, its copy) equals _DIGEST. The seqlock alone would rely on the CPU's memory
#   ordering (x86-64 keeps these plain stores and loads in order; ARM need not), so a copy torn by a publish is
#   also caught by the digest, on any CPU: it costs one CRC pass over the weights per publish and per load.
# * Samples: one pipe per actor, whose write end only that actor holds (the learner closes its copy), so the
#   actor's death reads as end-of-file, also halfway through a message. The learner reads every pipe without
#   blocking (a selector with a deadline) and checks the actors' exit codes while it waits. A message is a frame:
#   a fixed header (_FRAME: magic, kind, actor, seq, version, request, rng_seed, length) and the pickled payload,
#   so the learner knows which sample it is reading even if the payload cannot be unpickled.
# * Back-pressure: a credit pipe holds one byte per free place among queue_size samples in flight; an actor takes
#   a byte before it sends a sample, the learner writes one when it takes a sample out of the pipes.

_SEQ, _VERSION, _STOP, _DIGEST = 0, 1, 2, 3


def _digest(version: int, tensors) -> int:
    """CRC-32 of ``version`` and the bytes of ``tensors`` (in order): what a consistent copy must reproduce."""
    crc = zlib.crc32(struct.pack("<q", int(version)))
    for t in tensors:
        crc = zlib.crc32(t.detach().reshape(-1).view(torch.uint8).numpy(), crc)
    return crc
_FRAME = struct.Struct("<8s7q")
_MAGIC = b"rlkit-AP"
_OK, _ERROR = 0, 1
_MAX_FRAME = 1 << 40                   # a header announcing more is garbage
_PIPE_BYTES = 1 << 20                  # F_SETPIPE_SZ of every sample pipe (the default is 64 KiB)
_READ_BUDGET = 16 << 20                # bytes read from one pipe before the learner looks at the clock again
_SPAWN_HINT = ("its stderr says why (a spawned process re-imports the main script: run it from a file, with the "
               "loop under `if __name__ == '__main__':`)")


def _unpickle(body: bytes, lost: list, actor: int, seq: int, version: int, request: int):
    """A sample's payload; one that cannot be unpickled is recorded in ``lost`` and raised as ``ActorError``."""
    try:
        return pickle.loads(body)
    except Exception as e:  # noqa: BLE001 - whatever the payload's own unpickling raises
        why = f"the learner could not unpickle its payload ({type(e).__name__}: {e})"
        lost.append((actor, seq, why))
        raise ActorError(f"actor {actor}'s sample seq {seq} (version {version}, request {request}) is lost: "
                         f"{why}. It is recorded in pool.lost; the pool goes on with the next samples") from e


def _write_all(fd: int, *parts) -> None:
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            view = view[os.write(fd, view):]


class _ProcessChannel:
    """The actor's end: seqlock reads of the shared weights, credits, frames into its own pipe."""

    def __init__(self, weights, ctl, credits, out, parent: int):
        self.weights, self.ctl, self.parent = weights, ctl, parent
        self.credits, self.out = credits, out              # the Connections: keep them (and their fds) open
        self.credit_fd, self.out_fd = credits.fileno(), out.fileno()
        os.set_blocking(self.credit_fd, False)
        self.snapshot = {k: v.clone() for k, v in weights.items()}

    def stopping(self) -> bool:
        return bool(self.ctl[_STOP]) or os.getppid() != self.parent      # asked to, or the learner is gone

    def newest(self):
        return None if self.stopping() else int(self.ctl[_VERSION])

    def load(self, model):
        while not self.stopping():
            before = self.ctl[_SEQ]
            if before % 2 == 0:
                for k, t in self.snapshot.items():
                    t.copy_(self.weights[k])
                version, digest = self.ctl[_VERSION], self.ctl[_DIGEST]
                if self.ctl[_SEQ] == before and _digest(version, self.snapshot.values()) == digest:
                    # no publish overlapped the copy, and the copy is the one the learner published
                    model.load_state_dict(self.snapshot)
                    return int(version)
            time.sleep(0.0005)
        return None

    def _credit(self) -> bool:
        while not self.stopping():
            if not select.select([self.credit_fd], [], [], 0.1)[0]:
                continue
            try:
                got = os.read(self.credit_fd, 1)
            except BlockingIOError:                         # another actor took it
                continue
            return bool(got)                                # b"": the learner closed the credits
        return False

    def put(self, actor, seq, version, request, rng_seed, payload) -> bool:
        body = _dumps(payload)
        return self._credit() and self.send(_OK, actor, seq, version, request, rng_seed, body)

    def send(self, kind, actor, seq, version, request, rng_seed, body: bytes) -> bool:
        try:
            _write_all(self.out_fd, _FRAME.pack(_MAGIC, kind, actor, seq, version, request, rng_seed, len(body)),
                       body)
        except OSError:                                     # the learner closed the pipe: stopping
            return False
        return True


def _process_main(actor, n_actors, seed, make_model, sample_fn, weights, ctl, credits, out, parent):
    """Entry point of an actor process (spawn): run the loop, report an exception with its traceback."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    channel = _ProcessChannel(weights, ctl, credits, out, parent)
    try:
        _actor_loop(actor, n_actors, seed, make_model, sample_fn, channel)
    except BaseException:               # noqa: BLE001 - everything goes back to the learner
        channel.send(_ERROR, actor, -1, -1, -1, -1, traceback.format_exc().encode())


class _Inbox:
    """The learner's end of one actor's pipe, and the frame being read from it."""

    def __init__(self, conn):
        self.conn, self.fd = conn, conn.fileno()
        os.set_blocking(self.fd, False)
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        except (OSError, AttributeError):                   # not Linux, or over the user's pipe quota
            pass
        self.head = bytearray(_FRAME.size)
        self.body: bytearray | None = None
        self.meta: tuple | None = None
        self.got = 0
        self.next_seq = 0
        self.open = True

    def mid_frame(self) -> bool:
        return self.got > 0 or self.body is not None


class _ProcessBackend:
    """Actor processes, their pipes and the shared weights. Holds no reference to its pool (weakref.finalize)."""

    def __init__(self, template: dict, queue_size: int, timeout: float, lost: list):
        self.template, self.queue_size, self.timeout, self.lost = template, queue_size, timeout, lost
        self.procs: list = []
        self.inboxes: list[_Inbox] = []
        self.ready: deque = deque()     # complete frames, in the order they completed
        self.failure: list[str] = []    # why the pool is broken (sticky)
        self.reported: set[int] = set()  # actors whose error report arrived
        self.weights = self.ctl = self.credits = self.selector = None
        self.owed = 0
        self.next_check = 0.0
        self.closed = False

    def start(self, n_actors: int, seed: int, make_model, sample_fn) -> None:
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.weights = {k: v.clone().share_memory_() for k, v in self.template.items()}
        self.ctl = ctx.RawArray("q", 4)
        self.ctl[_VERSION] = -1
        self.ctl[_DIGEST] = _digest(-1, self.weights.values())
        credits_in, self.credits = ctx.Pipe(duplex=False)
        os.set_blocking(self.credits.fileno(), False)
        self.selector = selectors.DefaultSelector()
        try:
            for a in range(n_actors):
                inbox, out = ctx.Pipe(duplex=False)
                self.inboxes.append(_Inbox(inbox))
                self.selector.register(inbox.fileno(), selectors.EVENT_READ, a)
                p = ctx.Process(target=_process_main, name=f"rlkit-actor-{a}", daemon=True,
                                args=(a, n_actors, seed, make_model, sample_fn, self.weights, self.ctl, credits_in,
                                      out, os.getpid()))
                try:
                    p.start()
                finally:
                    out.close()         # the actor holds the only write end: its death reads as end-of-file
                self.procs.append(p)
        finally:
            credits_in.close()
        self._grant(self.queue_size)

    def publish(self, state: dict, version: int) -> None:
        ctl = self.ctl
        seq = ctl[_SEQ] | 1             # odd: writing (stays odd if the copy is interrupted)
        ctl[_SEQ] = seq
        for k, v in state.items():
            self.weights[k].copy_(v)
        ctl[_VERSION] = version
        ctl[_DIGEST] = _digest(version, self.weights.values())
        ctl[_SEQ] = seq + 1

    def _grant(self, k: int) -> None:
        """Give ``k`` more credits (one byte each); what the full credit pipe cannot take is given later."""
        self.owed += k
        if self.owed:
            try:
                self.owed -= os.write(self.credits.fileno(), b"\0" * self.owed)
            except OSError:             # full (BlockingIOError), or every actor is gone (reported by its pipe)
                pass

    def next(self, deadline: float) -> tuple:
        while True:
            if self.ready:                  # what arrived whole before a failure is delivered first
                return self._take()
            if self.failure:
                raise ActorError(self.failure_message())
            self._grant(0)
            events = self.selector.select(timeout=min(max(deadline - time.monotonic(), 0.0), 0.1))
            for key, _ in events:
                self._read(key.data, _READ_BUDGET)
            if not events or time.monotonic() >= self.next_check:
                self._check_exits()
            if not self.ready and not self.failure and time.monotonic() >= deadline:
                raise TimeoutError

    def failure_message(self) -> str:
        return "; ".join(self.failure) + ". The pool cannot go on: close it (the with block does) and start a new one"

    def _take(self) -> tuple:
        actor, seq, version, request, rng_seed, body = self.ready.popleft()
        self._grant(1)
        return actor, seq, version, request, rng_seed, _unpickle(body, self.lost, actor, seq, version, request)

    def _read(self, a: int, budget: float) -> None:
        """Read what actor ``a``'s pipe holds now (at most about ``budget`` bytes), without blocking."""
        box = self.inboxes[a]
        while budget > 0 and box.open:
            buf = box.head if box.body is None else box.body
            try:
                n = os.readv(box.fd, [memoryview(buf)[box.got:]])
            except BlockingIOError:
                return
            except OSError:
                n = 0
            if n == 0:
                self._eof(a)
                return
            box.got += n
            budget -= n
            if box.got == len(buf):
                self._header(a) if box.body is None else self._frame(a)

    def _header(self, a: int) -> None:
        box = self.inboxes[a]
        magic, kind, actor, seq, version, request, rng_seed, size = _FRAME.unpack(box.head)
        if magic != _MAGIC or kind not in (_OK, _ERROR) or actor != a or not 0 <= size <= _MAX_FRAME \
                or (kind == _OK and seq != box.next_seq):
            self.failure.append(f"actor {a} sent a malformed message (header {bytes(box.head)!r}; expected its "
                                f"sample seq {box.next_seq})")
            self._shut(a)
            return
        box.meta, box.body, box.got = (kind, seq, version, request, rng_seed), bytearray(size), 0
        if size == 0:
            self._frame(a)

    def _frame(self, a: int) -> None:
        box = self.inboxes[a]
        (kind, seq, version, request, rng_seed), body = box.meta, box.body
        box.meta, box.body, box.got = None, None, 0
        if kind == _ERROR:
            self.reported.add(a)
            self.failure.append(f"actor {a} raised an exception; its traceback:\n"
                                f"{body.decode('utf-8', errors='replace')}")
        else:
            box.next_seq += 1
            self.ready.append((a, seq, version, request, rng_seed, body))

    def _shut(self, a: int) -> None:
        box = self.inboxes[a]
        if box.open:
            box.open = False
            self.selector.unregister(box.fd)

    def _eof(self, a: int) -> None:
        """Actor ``a``'s pipe is closed: the actor stopped. Say how, and which sample went with it."""
        box = self.inboxes[a]
        self._shut(a)
        p = self.procs[a]
        p.join(1.0)                     # it has closed its pipe: it is exiting
        code = p.exitcode if p.exitcode is not None else "none: alive, but it closed its pipe"
        why = _SPAWN_HINT
        if isinstance(code, int) and code < 0:
            try:
                why = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                why = f"killed by signal {-code}"
        if box.mid_frame():
            seq = box.meta[1] if box.meta is not None else box.next_seq
            self.lost.append((a, seq, f"actor {a} stopped (exit code {code}) while it sent this sample"))
            self.failure.append(f"actor {a} (exit code {code}) stopped while it sent its sample seq {seq}, which "
                                f"is lost (recorded in pool.lost); {why}")
        elif a not in self.reported:
            self.failure.append(f"actor {a} (exit code {code}) stopped without reporting an error; {why}")

    def _check_exits(self) -> None:
        """An actor whose process has exited: read what it sent, then report it (its pipe may not show EOF)."""
        self.next_check = time.monotonic() + 0.25
        for a, (p, box) in enumerate(zip(self.procs, self.inboxes)):
            if box.open and p.exitcode is not None:
                self._read(a, math.inf)             # it is dead: what is in the pipe is all there is
                if box.open:
                    self._eof(a)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.ctl is not None:
            self.ctl[_STOP] = 1
        for conn in [self.credits, *(box.conn for box in self.inboxes)]:
            if conn is not None:
                conn.close()            # an actor waiting for a credit reads EOF, one writing a sample EPIPE
        if self.selector is not None:
            self.selector.close()
        deadline = time.monotonic() + min(self.timeout, 10.0)
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        self.ready.clear()
        self.weights = None


# ============================================================================================
# The Ray backend
# ============================================================================================

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

    def put(self, actor, seq, version, request, rng_seed, payload) -> bool:
        from ray.util.queue import Full
        blob = pickle.dumps(("ok", actor, seq, version, request, rng_seed, _dumps(payload)),
                            protocol=pickle.HIGHEST_PROTOCOL)   # the header unpickles even if the payload cannot
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


class _RayBackend:
    """Ray actors, the weights holder and the sample queue. Holds no reference to its pool (weakref.finalize)."""

    def __init__(self, address, ray_init: dict, queue_size: int, timeout: float, lost: list):
        self.address, self.ray_init, self.queue_size, self.timeout, self.lost = \
            address, ray_init, queue_size, timeout, lost
        self.ray = _import_ray()
        self.started_ray = False
        self.holder = self.queue = None
        self.actors: list = []
        self.runs: list = []
        self.stopped: set[int] = set()  # actors whose run returned (their error report is on its way)
        self.failure: str | None = None
        self.next_check = 0.0
        self.closed = False

    def start(self, n_actors: int, seed: int, make_model, sample_fn) -> None:
        ray = self.ray
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
                kw = dict(num_cpus=n_actors, include_dashboard=False, object_store_memory=200 * 2 ** 20,
                          log_to_driver=False)
                kw.update(self.ray_init)
                ray.init(**kw)
            self.started_ray = True
        self.holder = ray.remote(num_cpus=0)(_RayHolder).remote()
        self.queue = Queue(maxsize=self.queue_size, actor_options={"num_cpus": 0})
        actor_cls = ray.remote(num_cpus=1)(_RayActor)
        self.actors = [actor_cls.remote() for _ in range(n_actors)]
        self.runs = [h.run.remote(a, n_actors, seed, make_model, sample_fn, self.holder, self.queue)
                     for a, h in enumerate(self.actors)]

    def publish(self, state: dict, version: int) -> None:
        ref = self.ray.put(_dumps(state))             # one copy in the object store, read by every actor
        self.ray.get(self.holder.publish.remote(version, [ref]), timeout=self.timeout)

    def _check_runs(self) -> None:
        """A run that returned reported an error (it is in the queue); one that raised is a dead actor."""
        self.next_check = time.monotonic() + 0.5
        done, _ = self.ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        for ref in done:
            a = self.runs.index(ref)
            if a in self.stopped:
                continue
            self.stopped.add(a)
            try:
                self.ray.get(ref, timeout=5.0)
            except Exception as e:  # noqa: BLE001 - RayActorError, WorkerCrashedError, ...
                self.failure = f"Ray actor {a} died ({type(e).__name__}: {e})"

    def next(self, deadline: float) -> tuple:
        from ray.util.queue import Empty
        while True:
            if self.failure:
                raise ActorError(self.failure)
            if time.monotonic() >= self.next_check:
                self._check_runs()
                continue
            try:
                item = pickle.loads(self.queue.get(block=True, timeout=min(max(deadline - time.monotonic(), 0.01),
                                                                            0.2)))
            except Empty:
                if self.stopped:
                    try:                                # its error report may still be on its way
                        item = pickle.loads(self.queue.get(block=True, timeout=1.0))
                    except Empty:
                        self.failure = (f"Ray actor(s) {sorted(self.stopped)} stopped without reporting an error")
                        continue
                elif time.monotonic() >= deadline:
                    raise TimeoutError from None
                else:
                    continue
            if item[0] == "error":
                self.failure = f"actor {item[1]} raised an exception; its traceback:\n{item[2]}"
                continue
            return self._unpack(item)

    def _unpack(self, item: tuple) -> tuple:
        _, actor, seq, version, request, rng_seed, body = item
        return actor, seq, version, request, rng_seed, _unpickle(body, self.lost, actor, seq, version, request)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        ray, wait = self.ray, min(self.timeout, 10.0)
        try:
            if self.holder is not None:
                ray.get(self.holder.stop.remote(), timeout=wait)
            if self.runs:
                ray.wait(self.runs, num_returns=len(self.runs), timeout=wait)
        except Exception:  # noqa: BLE001 - shutting down regardless
            pass
        for h in [*self.actors, self.holder, None if self.queue is None else self.queue.actor]:
            if h is None:
                continue
            try:
                ray.kill(h)
            except Exception:  # noqa: BLE001
                pass
        if self.started_ray:
            ray.shutdown()


# ============================================================================================
# The simulated backend
# ============================================================================================

class _SimulatedBackend:
    """Samples in the learner's process with archived weights ``lag`` versions old."""

    def __init__(self, scratch, lag_distribution: LagDistribution, n_actors: int, seed: int, sample_fn,
                 lost: list):
        self.scratch, self.lags, self.n_actors, self.seed, self.sample_fn, self.lost = \
            scratch, lag_distribution, n_actors, seed, sample_fn, lost
        self.archive = PolicyArchive(capacity=lag_distribution.max + 1)
        self.gen = torch.Generator().manual_seed(seed)
        self.next_request = 0
        self.version = -1

    def start(self, *args) -> None:
        pass

    def publish(self, state: dict, version: int) -> None:
        self.scratch.load_state_dict(state)
        self.archive.push(version, self.scratch)     # a frozen deep copy
        self.version = version

    def next(self, deadline: float) -> tuple:
        j = self.next_request
        self.next_request += 1
        actor, seq = j % self.n_actors, j // self.n_actors
        lag = int(self.lags.sample(1, self.gen)[0])
        target = int(self.archive.behaviour_versions(self.version, torch.tensor([lag]))[0])
        version = max(v for v in self.archive.versions if v <= target)    # target >= the oldest held
        rng_seed = _rng_seed(self.seed, j)
        try:
            with torch.no_grad():
                payload = self.sample_fn(self.archive.get(version), rng_seed, j)
        except Exception as e:
            self.lost.append((actor, seq, f"sample_fn raised {type(e).__name__}: {e}"))
            raise ActorError(f"actor {actor} (simulated) raised an exception on its sample seq {seq} (request {j}, "
                             f"version {version}); that sample is lost (recorded in pool.lost) and not retried: the "
                             f"next get goes on with request {j + 1}; its traceback:\n{traceback.format_exc()}") from e
        return actor, seq, version, j, rng_seed, payload

    def close(self) -> None:
        self.archive = None


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
    actor processes are stopped and joined (terminated after a timeout), pipes closed, Ray actors
    killed and a Ray instance the pool started shut down; a pool that is garbage-collected without
    :meth:`close` is closed then. Publish the first weights before the first :meth:`get`.

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
            so far is clamped to the oldest version held (early in training). With ``max_lag`` set,
            ``lags`` must give a lag ``<= max_lag`` some probability (else every sample would be dropped).
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
    (the list of dropped :class:`Sampled`), ``lost`` (``(actor, seq, why)`` of every sample lost:
    ``sample_fn`` raised in the simulated backend, its payload could not be unpickled, or its actor
    died while sending it), ``lags`` (the lag of every consumed sample, in order).
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
        if self.max_lag is not None and self.lag_distribution.min > self.max_lag:
            raise ValueError(f"lags gives every sample a lag of at least {self.lag_distribution.min} "
                             f"(probs {self.lag_distribution.probs}) and max_lag={self.max_lag} drops every lag "
                             f"above {self.max_lag}: get would drop every sample; lower the lags or raise max_lag")
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
        self.lost: list[tuple[int, int, str]] = []
        self._template: dict[str, Tensor] | None = None
        self._started = self._closed = False
        self._backend = None                      # _SimulatedBackend, _ProcessBackend or _RayBackend
        self._finalizer = None                    # weakref.finalize(self, backend.close): real backends
        self._pending: list[tuple] = []           # samples received by a get that did not finish

    # ---- lifecycle -------------------------------------------------------------------------
    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> ActorPool:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> ActorPool:
        """Start the actors (``with`` does it); returns the pool.

        A pool that is garbage-collected (or still open when the interpreter exits) without
        :meth:`close` is closed then: a ``weakref.finalize`` holds the actors, not the pool.
        """
        if self._closed:
            raise RuntimeError("this ActorPool was closed; make a new one")
        if self._started:
            return self
        template = self.make_model()
        V.instance_of(template, "make_model()", torch.nn.Module, "torch.nn.Module")
        self._template = {k: v.detach().clone() for k, v in template.state_dict().items()}
        self._started = True
        if self.backend == "simulated":
            backend = _SimulatedBackend(template, self.lag_distribution, self.n_actors, self.seed, self.sample_fn,
                                        self.lost)
        elif self.backend == "process":
            backend = _ProcessBackend(self._template, self.queue_size, self.timeout, self.lost)
        else:
            backend = _RayBackend(self.address, self.ray_init, self.queue_size, self.timeout, self.lost)
        self._backend = backend
        # Actors to stop even if close() is never called. The backend does not refer to the pool; the simulated
        # one has nothing to stop, and it holds sample_fn, which might refer to the pool and keep it alive.
        if self.backend != "simulated":
            self._finalizer = weakref.finalize(self, backend.close)
        try:
            backend.start(self.n_actors, self.seed, self.make_model, self.sample_fn)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def _procs(self) -> list:
        """The actor processes (``"process"`` backend; empty otherwise)."""
        return getattr(self._backend, "procs", [])

    def close(self) -> None:
        """Stop every actor and release the pipes (idempotent; ``with`` calls it).

        ``"process"``: asks the actors to stop, waits at most ``min(timeout, 10)`` seconds, then
        terminates (and kills) the ones still running.
        """
        if self._closed:
            return
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()                 # runs backend.close once (also at garbage collection)
        elif self._backend is not None:
            self._backend.close()

    # ---- learner side ----------------------------------------------------------------------
    def _check_running(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"{what}: this ActorPool is closed")
        if not self._started:
            raise RuntimeError(f"{what}: start the pool first (`with ActorPool(...) as pool:` or pool.start())")

    def publish(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        r"""Publish the learner's weights as ``version`` (an int, larger than every earlier version).

        ``state_dict`` must have the keys, shapes and dtypes of ``make_model().state_dict()``, and
        finite floating-point entries (NaN or inf: ``ValueError`` naming the entry).
        Actors pick the newest version up before their next sample (``"process"``: copied into
        shared memory under a seqlock, which no actor can hold, so ``publish`` never waits for an
        actor; ``"ray"``: one ``ray.put``, read by every actor; ``"simulated"``: a frozen copy pushed
        into the :class:`rlkit.staleness.PolicyArchive`).
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
            if x.is_floating_point():
                V.tensor_in(x, f"state_dict[{k!r}]")
        self._backend.publish({k: v.detach().to("cpu") for k, v in state_dict.items()}, version)
        self.version = version

    def get(self, n: int, timeout: float | None = None) -> list[Sampled]:
        r"""The next ``n`` samples whose lag is at most ``max_lag`` (all of them when ``max_lag`` is None).

        Each returned :class:`Sampled` has ``lag`` = ``pool.version - sample.version``
        (the lag :math:`\ell`). Raises ``TimeoutError`` if ``n`` samples did not arrive within
        ``timeout`` seconds (default: the pool's ``timeout``), whatever the actors do (hang, die, drop
        every sample for its lag; ``"simulated"`` runs ``sample_fn`` in the learner's process, and the
        clock is read between calls); the samples that did arrive are not lost: the next ``get``
        returns them first. Raises :class:`ActorError`:

        * when an actor raised (with the actor's traceback) or stopped (``"process"``: naming its
          index and exit code, also while other actors still deliver); the pool is then broken and
          every later ``get`` raises it again: close it;
        * when one sample is lost (``sample_fn`` raised in the simulated backend, or its payload
          cannot be unpickled in the learner): the message names the actor and the sequence
          number, ``pool.lost`` records it, and the next ``get`` goes on with the following samples
          (the lost one is not retried).
        """
        self._check_running("get")
        n = V.int_in(n, "n")
        timeout = self.timeout if timeout is None else V.real_in(timeout, "timeout", 0.0, lo_open=True)
        if self.version < 0:
            raise RuntimeError("get: publish the first weights (pool.publish(model.state_dict(), version=0)) "
                               "before asking for samples")
        deadline = time.monotonic() + timeout
        items: list[tuple] = []                   # kept, in order; back to _pending if get cannot finish
        asked = False
        try:
            while len(items) < n:
                if self._pending:
                    item = self._pending.pop(0)
                else:
                    if asked and time.monotonic() > deadline:
                        raise TimeoutError
                    item, asked = self._backend.next(deadline), True
                if self.max_lag is not None and not bool(
                        version_window(torch.tensor([item[2]]), self.version, self.max_lag + 1)[0]):
                    self.dropped.append(self._sampled(item))
                    continue
                items.append(item)
        except TimeoutError:
            self._pending = items + self._pending      # nothing is lost: the next get returns them
            raise TimeoutError(self._timeout_message(n, len(items))) from None
        except BaseException:
            self._pending = items + self._pending
            raise
        out = [self._sampled(item) for item in items]
        self.lags += [s.lag for s in out]
        self.consumed += len(out)
        return out

    def _sampled(self, item: tuple) -> Sampled:
        actor, seq, version, request, rng_seed, payload = item
        return Sampled(payload, version, actor, seq, self.version - version, request, rng_seed)

    def _timeout_message(self, n, got, timeout=None) -> str:
        return (f"get: {got} of {n} samples arrived in time from {self.n_actors} {self.backend} actors (they are "
                f"kept for the next get; pass a larger timeout= to ActorPool or get)")

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
