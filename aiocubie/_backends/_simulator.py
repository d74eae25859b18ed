"""The simulator backend: a device modelled on the CPU, so the whole service runs without a GPU.

It models total and free memory, stream order (one worker thread per stream runs queued work
in order, each item taking ``latency`` seconds), events that complete only after the work
queued before them, the engines (a compute engine per stream, one copy engine per direction,
each with a bandwidth and a per-operation latency, logged on a timeline) and faults injected
on demand. The ``cupy`` and ``cupy_async`` allocators keep freed device blocks cached in a pool,
as CuPy's pools do: a cached block serves a request of its size or smaller (split, never merged),
so a pool can hold free bytes yet fail a larger request. Device-side kinds (device, managed, mapped)
are handed out as the chosen array type's model (``_simarrays``), host kinds as numpy arrays,
as on a GPU. It imports neither numba.cuda nor cupy (numba's simulator only for numba arrays).
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import logging
import math
import numbers
import queue
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Literal

import attrs
import numpy as np

from .._errors import (
    AllocationError,
    BackendError,
    ConfigurationError,
    InvalidRequestError,
    OutOfMemoryError,
    UnknownAllocatorError,
    shown,
)
from .._requests import MAX_NBYTES, MemoryKind, check_device
from ._base import ALLOCATORS, Advice, Backend, Event, MemoryInfo, PoolFacts, parse_array_type
from ._simarrays import host_data, sim_array

__all__ = ["Engines", "Faults", "SimEvent", "SimStream", "SimulatorBackend", "TimelineEntry"]

log = logging.getLogger("aiocubie")

FaultSite = Literal["allocate", "oom", "record_event", "copy", "prefetch"]
_FAULT_SITES = ("allocate", "oom", "record_event", "copy", "prefetch")


class Faults:
    """Faults to inject into a :class:`SimulatorBackend`.

    Examples
    --------
    >>> sim = SimulatorBackend(total=1 << 20)
    >>> sim.faults.inject("allocate", after=2)      # the 3rd allocation from now fails once
    >>> sim.faults.inject("oom", times=2)           # the next 2 allocations find no room
    >>> sim.faults.inject("copy", probability=0.1, times=None, seed=0)  # 10% of copies fail
    """

    def __init__(self) -> None:
        self._rules: dict[str, list[_Rule]] = {site: [] for site in _FAULT_SITES}
        self.fired: dict[str, int] = dict.fromkeys(_FAULT_SITES, 0)
        self._lock = threading.Lock()

    def inject(
        self,
        site: FaultSite,
        *,
        after: int = 0,
        times: int | None = 1,
        probability: float = 1.0,
        seed: int | None = None,
    ) -> None:
        """Make operations at ``site`` fail.

        Parameters
        ----------
        site : {"allocate", "oom", "record_event", "copy", "prefetch"}
            Which operation fails: ``"allocate"`` raises AllocationError (a failure the
            manager does not retry), ``"oom"`` OutOfMemoryError (no room: the manager tries
            to recover), both from ``allocate``.
        after : int
            Let this many operations at ``site`` succeed first.
        times : int or None
            How many failures to inject (None: forever, until :meth:`clear`).
        probability : float
            Chance that an eligible operation fails (1.0: always).
        seed : int, optional
            Seed for the random draws, for reproducible tests.

        Raises
        ------
        ConfigurationError
            For an unknown site or a bad count, probability or seed (nothing is injected).
        """
        if not isinstance(site, str) or site not in self._rules:
            raise ConfigurationError(
                f"unknown fault site {shown(site)}: use one of {', '.join(map(repr, _FAULT_SITES))}"
            )
        if not _count(after, 0):
            raise ConfigurationError(f"after must be an int >= 0 (operations to let through first), got {shown(after)}")
        if times is not None and not _count(times, 1):
            raise ConfigurationError(f"times must be an int >= 1 or None (forever), got {shown(times)}")
        if not 0.0 <= _real(probability) <= 1.0:
            raise ConfigurationError(f"probability must be a number in [0, 1], got {shown(probability)}")
        if seed is not None and not _count(seed, -(2**63)):
            raise ConfigurationError(f"seed must be an int or None, got {shown(seed)}")
        rng = random.Random(None if seed is None else int(seed))  # numpy ints are not seeds
        rule = _Rule(int(after), None if times is None else int(times), float(probability), rng)
        with self._lock:
            self._rules[site].append(rule)

    def clear(self) -> None:
        """Remove every rule."""
        with self._lock:
            for rules in self._rules.values():
                rules.clear()

    def check(self, site: str) -> bool:
        """Count one operation at ``site``; True if it must fail."""
        with self._lock:
            rules = self._rules[site]
            for rule in rules:
                if rule.fires():
                    if rule.times == 0:
                        rules.remove(rule)
                    self.fired[site] += 1
                    return True
            return False


def _count(value: Any, least: int) -> bool:
    """True if ``value`` is an int (not a bool) of at least ``least``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and int(value) >= least


def _real(value: Any) -> float:
    """``value`` as a float; NaN for a bool or anything that is not a real number a float holds."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return math.nan
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        return math.nan


class _Rule:
    def __init__(self, after: int, times: int | None, probability: float, rng: random.Random) -> None:
        self.after, self.times, self.probability, self.rng = after, times, probability, rng

    def fires(self) -> bool:
        if self.after > 0:
            self.after -= 1
            return False
        if self.probability < 1.0 and self.rng.random() >= self.probability:
            return False
        if self.times is not None:
            self.times -= 1
        return True


@attrs.frozen
class Engines:
    """How long the simulated engines take (see :class:`SimulatorBackend`).

    Parameters
    ----------
    h2d_bandwidth, d2h_bandwidth : float
        Bytes per second of the host-to-device and device-to-host copy engines (``inf``:
        copies take no time). Each direction has one engine: copies in one direction run
        one at a time, whatever their stream; the two directions run at once.
    copy_latency : float
        Seconds each copy holds its engine before moving data.
    kernel_latency : float
        Seconds each :meth:`SimulatorBackend.launch` takes beyond its own ``duration``.
    """

    h2d_bandwidth: float = math.inf
    d2h_bandwidth: float = math.inf
    copy_latency: float = 0.0
    kernel_latency: float = 0.0

    def __attrs_post_init__(self) -> None:
        if not (
            self.h2d_bandwidth > 0 and self.d2h_bandwidth > 0 and self.copy_latency >= 0 and self.kernel_latency >= 0
        ):
            raise ConfigurationError(f"bad engine model {self}: bandwidths must be > 0 bytes/s and latencies >= 0 s")


@attrs.frozen
class TimelineEntry:
    """One operation an engine ran: ``start`` and ``end`` are ``time.perf_counter()`` readings.

    ``engine`` is ``"h2d"``, ``"d2h"`` or ``"compute:<stream id>"``; ``op`` is ``"copy"`` or
    ``"kernel"``; ``tag`` is what the caller passed (walks pass ``("in" or "out", chunk, label)``).
    """

    engine: str
    op: str
    start: float
    end: float
    tag: object

    def overlaps(self, other: TimelineEntry) -> bool:
        """True if the two operations ran at the same time for a while."""
        return self.start < other.end and other.start < self.end


#: Timeline entries a simulator keeps (the most recent ones).
TIMELINE_LENGTH = 1 << 16


class _Progress:
    """Items queued on a stream and items its worker finished: equal when the stream is idle."""

    __slots__ = ("done", "lock", "queued")

    def __init__(self) -> None:
        self.queued = self.done = 0
        self.lock = threading.Lock()


#: Device memory of a simulator made without a ``total`` (8 GiB).
DEFAULT_TOTAL = 8 << 30


class SimStream:
    """A simulated stream: a worker thread that runs queued work in order.

    ``handle`` is a stand-in for a CUstream (never 0, 1 or 2), reported by the simulator's
    arrays in their ``__cuda_array_interface__``.
    """

    _ids = itertools.count()

    def __init__(self, latency: float) -> None:
        self.id = next(self._ids)
        self.handle = 0x5100 + self.id
        self.latency = latency
        self.closed = False
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._progress = _Progress()
        # The worker holds the queue, not the stream: a stream nobody holds any more is
        # collected, and its finalizer stops the worker.
        self._worker = threading.Thread(
            target=_work,
            args=(self._queue, latency, self._progress),
            name=f"aiocubie-sim-stream-{self.id}",
            daemon=True,
        )
        self._worker.start()
        weakref.finalize(self, self._queue.put, None)

    def __repr__(self) -> str:
        return f"<SimStream {self.id}>"

    def __int__(self) -> int:
        return self.handle

    def enqueue(self, work: Callable[[], None]) -> None:
        """Queue ``work`` to run after everything queued before it, ``latency`` seconds later."""
        if self.closed:
            raise BackendError(f"{self!r} was closed by a context reset: call reinit_streams()")
        with self._progress.lock:
            self._progress.queued += 1
        self._queue.put(work)

    def synchronize(self) -> None:
        """Block until the work queued so far is done (at once when the stream is idle).

        A no-op on the stream's own worker (the work before the caller is done) and on a
        closed stream (its worker ran what it had).
        """
        progress = self._progress
        if progress.queued == progress.done or self.closed or threading.current_thread() is self._worker:
            return
        done = threading.Event()
        self.enqueue(done.set)
        done.wait()

    def close(self) -> None:
        """Stop the worker after the work queued so far."""
        if not self.closed:
            self.closed = True
            self._queue.put(None)


def _work(work_queue: queue.SimpleQueue[Callable[[], None] | None], latency: float, progress: _Progress) -> None:
    while (work := work_queue.get()) is not None:
        if latency:
            time.sleep(latency)
        try:
            work()
        except Exception:  # keep the stream alive: what is queued behind must still run
            log.exception("simulated stream work failed")
        finally:
            with progress.lock:
                progress.done += 1


def _host_memory(shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind) -> np.ndarray[Any, Any]:
    """Uninitialised numpy memory for an array; the host running out is an AllocationError."""
    try:
        return np.empty(shape, dtype)
    except MemoryError as exc:  # numpy's: the host has not that much memory
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        raise AllocationError(
            f"out of host memory: cannot hold {nbytes} bytes of {MemoryKind(kind).value} memory "
            f"({shape}, {dtype}) in this simulator's process; ask for less"
        ) from exc


class SimEvent(Event):
    """An event on a :class:`SimStream`: done once the worker reaches it."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def query(self) -> bool:
        return self._done.is_set()

    def synchronize(self) -> None:
        self._done.wait()

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def complete(self) -> None:
        """Mark the event done and call its callbacks (the stream's worker does, in order)."""
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


class SimulatorBackend(Backend):
    """A faithful CPU model of a CUDA device.

    Parameters
    ----------
    total : int
        Device memory in bytes (default 8 GiB).
    latency : float
        Seconds each item of stream work (allocation fill, copy, event) takes.
    granule : int
        Bytes the planner keeps free (as a GPU allocator's rounding would need).
    reserved : int
        Bytes taken by "other processes" at the start (see :meth:`occupy`).
    engines : Engines, optional
        Bandwidths and latencies of the copy engines and kernels (default: instant).
    array_type : {"cupy", "numba"}, optional
        What device-side arrays model: ``cupy.ndarray`` (the default) or numba's
        ``DeviceNDArray`` (see :data:`ARRAY_TYPES`).
    device : int
        Which device of the simulated host this backend is (default 0).
    devices : int, optional
        How many devices the simulated host has (None: ``device + 1``). Each backend models
        one device with its own memory; managed memory can be prefetched (and advised) to
        any device id below ``devices``.

    Raises
    ------
    ConfigurationError
        For a setting of the wrong type or out of range (``SimulatorBackend("1GB")``,
        ``SimulatorBackend(-1)``, ``device=2, devices=2``), or an unknown array type.

    Attributes
    ----------
    faults : Faults
        Inject allocation, event, copy and prefetch failures.
    cached : list of int
        Sizes of the free device blocks the pool keeps (allocators ``cupy`` and ``cupy_async``).
    timeline : collections.deque of TimelineEntry
        The copies and kernels the engines ran, in the order they ended (the most recent
        ``TIMELINE_LENGTH``).
    """

    name = "simulator"

    def __init__(
        self,
        total: int = DEFAULT_TOTAL,
        *,
        latency: float = 0.0,
        granule: int = 0,
        reserved: int = 0,
        array_type: str | None = None,
        engines: Engines | None = None,
        device: int = 0,
        devices: int | None = None,
    ) -> None:
        self.array_type = parse_array_type(array_type)
        if not _count(device, 0):
            raise ConfigurationError(f"device must be a device number (an int >= 0), got {shown(device)}")
        if devices is None:
            devices = int(device) + 1
        if not _count(devices, 1) or device >= devices:
            raise ConfigurationError(
                f"devices must be the simulated host's device count, an int > device ({device}), got {shown(devices)}"
            )
        self.device, self.devices = int(device), int(devices)
        self.engines = Engines() if engines is None else engines
        self.timeline: collections.deque[TimelineEntry] = collections.deque(maxlen=TIMELINE_LENGTH)
        self._copy_engines = {"h2d": threading.Lock(), "d2h": threading.Lock()}
        self._pinned: weakref.WeakValueDictionary[int, np.ndarray[Any, Any]] = weakref.WeakValueDictionary()
        if not isinstance(self.engines, Engines):
            raise ConfigurationError(f"engines must be an aiocubie.Engines, got {shown(self.engines)}")
        if self.array_type == "numba" and importlib.util.find_spec("numba") is None:  # found, not imported
            raise ConfigurationError(
                "array_type='numba' hands out numba's device arrays, and numba is not installed: "
                "pip install 'aiocubie[numba]', or use array_type='cupy'"
            )
        if not _count(total, 1) or total > MAX_NBYTES:
            raise ConfigurationError(
                f"total must be the device's memory in bytes, an int from 1 to 2**63 - 1 (e.g. 8 << 30), "
                f"got {shown(total)}"
            )
        if not _count(reserved, 0) or reserved > total:
            raise ConfigurationError(f"reserved must be an int of bytes in 0..total ({total}), got {shown(reserved)}")
        if not _count(granule, 0) or granule > total:
            raise ConfigurationError(f"granule must be an int of bytes in 0..total ({total}), got {shown(granule)}")
        if not 0.0 <= _real(latency) < math.inf:
            raise ConfigurationError(f"latency must be a finite number of seconds >= 0, got {shown(latency)}")
        total, reserved, granule = int(total), int(reserved), int(granule)
        self.total = total
        self.latency = float(latency)
        self.granule = granule
        self.allocator = "default"
        self.device_name = f"aiocubie simulator device {self.device} of {self.devices} ({total:,} bytes)"
        self.faults = Faults()
        self.resets = 0
        self._reserved = reserved
        self._used = 0
        self._live: dict[int, tuple[int, bool]] = {}  # id(array) -> (VRAM bytes, from the pool)
        self.cached: list[int] = []
        self._pool_in_use = 0
        self._streams: weakref.WeakSet[SimStream] = weakref.WeakSet()  # closed on reset; not kept alive

    # -- memory ---------------------------------------------------------------------------
    @property
    def used(self) -> int:
        """VRAM bytes held by live arrays of this backend."""
        return self._used

    def occupy(self, nbytes: int) -> None:
        """Pretend another process took (positive) or released (negative) ``nbytes``."""
        room = self.total - self._used - self._reserved - sum(self.cached)
        if not _count(nbytes, -self._reserved) or nbytes > room:
            raise ConfigurationError(
                f"cannot occupy {shown(nbytes)} bytes: pass an int from {-self._reserved} to {room} "
                f"({self.memory_info()}, {sum(self.cached)} bytes cached in the pool)"
            )
        self._reserved += nbytes

    def memory_info(self) -> MemoryInfo:
        # blocks the pool caches count as free, as CuPy's pools report them through numba
        return MemoryInfo(free=self.total - self._used - self._reserved, total=self.total)

    @property
    def _pooled(self) -> bool:
        return self.allocator != "default"

    def allocate(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind, stream: Any) -> Any:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self.faults.check("allocate"):
            raise AllocationError(f"injected fault: allocating {nbytes} bytes of {kind.value} {shape} {dtype}")
        if self.faults.check("oom"):
            raise OutOfMemoryError(f"injected out of memory: allocating {nbytes} bytes of {kind.value} {shape} {dtype}")
        pooled = kind is MemoryKind.DEVICE and self._pooled and nbytes > 0
        if kind.uses_vram and not (pooled and self._take_cached(nbytes)):
            cached = sum(self.cached)
            room = self.total - self._used - self._reserved - cached
            if nbytes > room:
                raise OutOfMemoryError(
                    f"out of memory: asked for {nbytes} bytes of {kind.value} memory ({shape}, {dtype}) with "
                    f"{room} of {self.total} free on the device and {cached} cached in the pool (largest "
                    f"block {max(self.cached, default=0)})"
                )
        data = _host_memory(shape, dtype, kind)
        array = data if kind in (MemoryKind.HOST, MemoryKind.PINNED) else sim_array(data, self.array_type, stream)
        if kind is MemoryKind.PINNED:
            self._pinned[id(data)] = data
        if kind.uses_vram:
            self._used += nbytes
            self._live[id(array)] = (nbytes, pooled)
            if pooled:
                self._pool_in_use += nbytes
        return array

    def _take_cached(self, nbytes: int) -> bool:
        """Serve ``nbytes`` from the smallest cached block that holds them (its rest stays cached)."""
        fits = [size for size in self.cached if size >= nbytes]
        if not fits:
            return False
        block = min(fits)
        self.cached.remove(block)
        if block > nbytes:
            self.cached.append(block - nbytes)
        return True

    def pool_facts(self) -> PoolFacts:
        """The pool's bytes (allocators ``cupy``, ``cupy_async``); without a pool nothing is cached."""
        if not self._pooled:
            return PoolFacts(held=self._used, in_use=self._used, largest_free=0)
        return PoolFacts(
            held=self._pool_in_use + sum(self.cached),
            in_use=self._pool_in_use,
            largest_free=max(self.cached, default=0),
        )

    def release_cached(self) -> int:
        freed = sum(self.cached)
        self.cached.clear()
        return freed

    def zero(self, array: Any, stream: SimStream) -> None:
        data = host_data(array)
        stream.enqueue(lambda: data.fill(0))

    def free(self, array: Any) -> None:
        nbytes, pooled = self._live.pop(id(array), (0, False))
        self._used -= nbytes
        if pooled:  # the pool keeps the block for reuse
            self._pool_in_use -= nbytes
            self.cached.append(nbytes)

    def nbytes(self, array: Any) -> int:
        return int(array.nbytes)

    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind) -> np.ndarray[Any, Any]:
        if MemoryKind(kind) not in (MemoryKind.PINNED, MemoryKind.HOST):
            raise InvalidRequestError(f"host arrays are 'pinned' or 'host', not {MemoryKind(kind).value!r}")
        array = _host_memory(shape, dtype, kind)
        array.fill(0)
        if MemoryKind(kind) is MemoryKind.PINNED:
            self._pinned[id(array)] = array
        return array

    def is_pinned(self, array: Any) -> bool:
        """True for host arrays made ``pinned`` here, and views of them."""
        while isinstance(array, np.ndarray):
            if self._pinned.get(id(array)) is array:
                return True
            array = array.base
        return False

    # -- streams, events, copies ----------------------------------------------------------
    def create_stream(self) -> SimStream:
        stream = SimStream(self.latency)
        self._streams.add(stream)
        return stream

    def record_event(self, stream: SimStream) -> SimEvent:
        if self.faults.check("record_event"):
            raise BackendError(f"injected fault: recording an event on {stream}")
        event = SimEvent()
        stream.enqueue(event.complete)
        return event

    def wait_event(self, stream: SimStream, event: Event) -> None:
        if not event.query():
            stream.enqueue(event.synchronize)

    def launch(
        self, stream: SimStream, work: Callable[[], None] | None = None, *, duration: float = 0.0, tag: object = None
    ) -> None:
        """Queue a kernel on ``stream``: ``work()`` runs on the stream's compute engine in order.

        The kernel takes ``duration`` seconds plus the engines' ``kernel_latency``, and is
        logged on :attr:`timeline` with ``tag``. A test's or demo's stand-in for a GPU launch.
        """
        cost = duration + self.engines.kernel_latency
        engine = f"compute:{stream.id}"
        timeline = self.timeline

        def run() -> None:
            start = time.perf_counter()
            if cost:
                time.sleep(cost)
            if work is not None:
                work()
            timeline.append(TimelineEntry(engine, "kernel", start, time.perf_counter(), tag))

        stream.enqueue(run)

    def copy(self, src: Any, dst: Any, stream: SimStream, *, tag: object = None) -> None:
        if getattr(src, "shape", None) != getattr(dst, "shape", None) or getattr(src, "dtype", None) != getattr(
            dst, "dtype", None
        ):
            raise BackendError(
                f"cannot copy {getattr(src, 'shape', '?')} {getattr(src, 'dtype', '?')} into "
                f"{getattr(dst, 'shape', '?')} {getattr(dst, 'dtype', '?')}: shapes and dtypes must match"
            )
        source, target = src, dst
        try:
            src, dst = host_data(src), host_data(dst)
        except TypeError as exc:
            raise BackendError(f"cannot copy: {exc}") from exc
        if not dst.flags.writeable:
            raise BackendError(f"cannot copy into a read-only {dst.shape} array: pass a writable one")
        if not (src.flags.c_contiguous and dst.flags.c_contiguous):  # as on a GPU: one block each
            raise BackendError(
                f"cannot copy between a {'non-' * (not src.flags.c_contiguous)}contiguous source and a "
                f"{'non-' * (not dst.flags.c_contiguous)}contiguous target of shape {dst.shape}: "
                "copy through np.ascontiguousarray (walk_chunks does)"
            )
        if self.faults.check("copy"):
            raise BackendError(f"injected fault: copying {src.nbytes} bytes on {stream}")
        src_host, dst_host = isinstance(source, np.ndarray), isinstance(target, np.ndarray)
        direction = "h2d" if src_host and not dst_host else "d2h" if dst_host and not src_host else None
        engines = self.engines
        bandwidth = engines.h2d_bandwidth if direction == "h2d" else engines.d2h_bandwidth
        cost = engines.copy_latency + src.nbytes / bandwidth if direction else 0.0
        if direction is None:  # device to device or host to host: the stream's own engine
            stream.enqueue(lambda: np.copyto(dst, src))
            return
        lock, timeline = self._copy_engines[direction], self.timeline

        def run() -> None:
            with lock:  # one engine per direction
                start = time.perf_counter()
                if cost:
                    time.sleep(cost)
                np.copyto(dst, src)
                end = time.perf_counter()
            timeline.append(TimelineEntry(direction, "copy", start, end, tag))

        stream.enqueue(run)

    def _check_location(self, device: int | None) -> None:
        """Refuse a location the simulated host does not have, as the driver does."""
        location = check_device(device)
        if location is not None and location >= self.devices:
            raise BackendError(
                f"no device {device} on this simulated host: it has {self.devices} "
                f"(ids 0 to {self.devices - 1}); pass devices= to SimulatorBackend for more"
            )

    def prefetch(self, array: Any, device: int | None, stream: SimStream) -> None:
        self._check_location(device)
        if self.faults.check("prefetch"):
            raise BackendError(f"injected fault: prefetching {array.nbytes} bytes on {stream}")
        stream.enqueue(lambda: None)  # ordered like real work; data never moves on a CPU

    def advise(self, array: Any, advice: Advice, device: int | None) -> None:
        if not isinstance(advice, str) or advice not in ("preferred_location", "accessed_by", "read_mostly"):
            raise BackendError(f"unknown managed-memory advice {shown(advice)}")
        self._check_location(device)

    # -- context ----------------------------------------------------------------------------
    def set_allocator(self, name: str) -> None:
        if not isinstance(name, str) or name not in ALLOCATORS:
            raise UnknownAllocatorError(f"unknown allocator {shown(name)}: use one of {', '.join(ALLOCATORS)}")
        self.reset()
        self.allocator = name

    def reset(self) -> None:
        self.resets += 1
        self._live.clear()
        self.cached.clear()
        self._used = self._pool_in_use = 0
        self.close()

    def close(self) -> None:
        for stream in list(self._streams):
            stream.close()
        self._streams.clear()
