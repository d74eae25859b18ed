"""The simulator's device: streams, events, engines with a timeline, copies, managed memory, faults.

It models the engines (a compute engine per stream, one copy engine per direction, each with a
bandwidth and a per-operation latency, logged on a timeline) and the device's memory readings;
memory itself comes from its resources (``_memory``). It imports neither numba nor CuPy.
"""

from __future__ import annotations

import collections
import importlib.util
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..._errors import (
    BackendError,
    ConfigurationError,
    InvalidRequestError,
    ReleasedError,
    UnknownAllocatorError,
    shown,
)
from ..._names import MemoryKind, check_device
from .._allocators import ResourceFactory, find_factory, register_allocator
from .._device import Advice, Device, Event, MemoryInfo
from .._resource import Block, MemoryResource
from .._strided import geometry, refusal
from ._arrays import host_data
from ._faults import Faults, count, real
from ._memory import SimFaults, SimMemory, SimPool, SimShared, SimState, check_live, host_memory, mark_spilled
from ._streams import SimEvent, SimStream, _Progress

__all__ = ["TIMELINE_LENGTH", "Engines", "SimDevice", "TimelineEntry"]


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
        for name in ("h2d_bandwidth", "d2h_bandwidth"):  # real numbers only: "fast" fails here, not on a stream
            if not real(getattr(self, name)) > 0:
                raise ConfigurationError(
                    f"Engines({name}={shown(getattr(self, name))}): a bandwidth is a number of bytes per second > 0 "
                    "(math.inf: copies take no time)"
                )
        for name in ("copy_latency", "kernel_latency"):
            if not 0 <= real(getattr(self, name)) < math.inf:
                raise ConfigurationError(
                    f"Engines({name}={shown(getattr(self, name))}): a latency is a finite number of seconds >= 0"
                )


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


def _sim(device: Device) -> SimDevice:
    if not isinstance(device, SimDevice):
        raise UnknownAllocatorError(f"a simulator allocator was asked for on {device.device_name}, not a simulator")
    return device


def _driver(device: Device) -> MemoryResource:
    """The device's stream-ordered pool, as the driver's model: every block fresh."""
    return SimMemory(_sim(device).state, "driver")


def _cupy_pool(name: str) -> ResourceFactory:
    """CuPy's pools (``cupy``, ``cupy_async``): freed device blocks stay cached."""
    return lambda device: SimPool(SimMemory(_sim(device).state, name), name)


def _numba(device: Device) -> MemoryResource:
    """numba's own memory manager: needs numba installed, as on a GPU."""
    if importlib.util.find_spec("numba") is None:  # found, not imported
        raise UnknownAllocatorError(
            "allocator 'numba' is numba's own memory manager, and numba is not installed: "
            "pip install 'aiocubie[numba]', or use another allocator"
        )
    return SimMemory(_sim(device).state, "numba")


def _rmm(device: Device) -> MemoryResource:
    """RMM's current device resource: the last one made is what other libraries use."""
    sim = _sim(device)
    previous, sim.shared = sim.shared, SimShared(SimMemory(sim.state, "rmm"))
    if previous is not None:  # as on a GPU, the cap on other libraries stays installed (set once)
        sim.shared.limit = previous.limit
    return sim.shared


class SimDevice(Device):
    """A CPU model of one CUDA device (see :class:`~aiocubie.simulator.SimulatorBackend` for the parameters).

    Attributes
    ----------
    faults : Faults
        Allocation, event, copy and prefetch failures to inject.
    state : SimState
        The device's memory, shared by the resources it makes.
    timeline : collections.deque of TimelineEntry
        The copies and kernels the engines ran, in the order they ended (the most recent
        :data:`TIMELINE_LENGTH`).
    resets : int
        Context resets so far.
    sticky : str or None
        The first use of freed memory an engine ran into (a copy, fill or kernel that ran on a
        block released after it was queued), as a CUDA context's sticky error: every later
        stream, event, copy or launch call raises it as a BackendError, until a reset. A GPU
        would corrupt whatever the pool had handed that memory on to.
    """

    name = "simulator"
    default_resource = "driver"

    def __init__(
        self, state: SimState, *, latency: float, granule: int, engines: Engines, device: int, devices: int
    ) -> None:
        self.state = state
        self.latency = latency
        self.granule = granule
        self.engines = engines
        self.device_id, self.devices = device, devices
        self.device_name = f"aiocubie simulator device {device} of {devices} ({state.total:,} bytes)"
        self.faults = Faults()
        self.resets = 0
        self.sticky: str | None = None
        self.shared: SimShared | None = None  # RMM's current device resource, once an "rmm" resource is made
        self.timeline: collections.deque[TimelineEntry] = collections.deque(maxlen=TIMELINE_LENGTH)
        self._copy_engines = {"h2d": threading.Lock(), "d2h": threading.Lock()}
        self._streams: weakref.WeakSet[SimStream] = weakref.WeakSet()  # closed on reset; not kept alive
        self._progress: weakref.WeakSet[_Progress] = weakref.WeakSet()  # of every worker still running

    # -- memory ---------------------------------------------------------------------------
    def _create_resource(self, name: str) -> MemoryResource:
        """The registered factory's resource, under the injected allocation faults."""
        return SimFaults(find_factory(name, self.name)(self), self.faults)

    def memory_info(self) -> MemoryInfo:
        return MemoryInfo(free=self.state.free, total=self.state.total)

    def occupy(self, nbytes: int) -> None:
        """Pretend another process took (positive) or released (negative) ``nbytes``."""
        state = self.state
        if not count(nbytes, -state.reserved) or nbytes > state.free:
            raise ConfigurationError(
                f"cannot occupy {shown(nbytes)} bytes: pass an int from {-state.reserved} to {state.free} "
                f"({self.memory_info()}, {sum(state.cached)} bytes cached in the pool)"
            )
        state.reserved += nbytes

    def host_array(self, shape: tuple[int, ...], dtype: np.dtype[Any], kind: MemoryKind) -> np.ndarray[Any, Any]:
        kind = MemoryKind(kind)
        if kind not in (MemoryKind.PINNED, MemoryKind.HOST):
            raise InvalidRequestError(f"host arrays are 'pinned' or 'host', not {kind.value!r}")
        dtype = np.dtype(dtype)
        data = host_memory(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, kind)
        data.fill(0)
        if kind is MemoryKind.PINNED:
            self.state.pinned[id(data)] = data
        return data.view(dtype).reshape(shape)

    def check_host(self, array: np.ndarray[Any, Any]) -> None:
        check_live(array)

    def spilled(self, block: Block) -> None:
        mark_spilled(block)

    def is_pinned(self, array: Any) -> bool:
        """True for host arrays made ``pinned`` here, and views of them."""
        pinned = self.state.pinned
        while array is not None:  # through views, and the owners of leased pool buffers
            if isinstance(array, np.ndarray) and pinned.get(id(array)) is array:
                return True
            array = getattr(array, "base", None)
        return False

    # -- streams, events, copies ----------------------------------------------------------
    @property
    def streams(self) -> tuple[SimStream, ...]:
        """The streams made here that are still alive and not closed by a reset (tests read them)."""
        return tuple(self._streams)

    def synchronize(self) -> None:
        # every worker's queue: a stream dropped (its group retired) still runs what it had queued,
        # its stream-ordered frees among it
        for progress in list(self._progress):
            progress.wait_idle()

    def create_stream(self) -> SimStream:
        stream = SimStream(self.latency)
        self._streams.add(stream)
        self._progress.add(stream.progress)
        return stream

    def record_event(self, stream: SimStream) -> SimEvent:  # type: ignore[override]
        self._check_sticky()
        if self.faults.check("record_event"):
            raise BackendError(f"injected fault: recording an event on {stream}")
        event = SimEvent()
        stream.enqueue(event.complete)
        return event

    def wait_event(self, stream: SimStream, event: Event) -> None:  # type: ignore[override]
        self._check_sticky()
        if not event.query():
            stream.enqueue(event.synchronize)

    def zero(self, array: Any, stream: SimStream) -> None:  # type: ignore[override]
        self._check_sticky()
        data = host_data(array)
        resets = self.resets

        def fill() -> None:
            if self._on_live(resets, "a zero fill", data):
                data.fill(0)

        stream.enqueue(fill)

    def launch(
        self, stream: SimStream, work: Callable[[], None] | None = None, *, duration: float = 0.0, tag: object = None
    ) -> None:
        """Queue a kernel on ``stream``: ``work()`` runs on the stream's compute engine in order.

        The kernel takes ``duration`` seconds plus the engines' ``kernel_latency``, and is
        logged on :attr:`timeline` with ``tag``. A test's or demo's stand-in for a GPU launch.

        Raises
        ------
        InvalidRequestError
            At the call, for a ``stream`` that is not this simulator's, ``work`` that is not
            callable or None, or a ``duration`` that is not a finite number of seconds >= 0.
        """
        if not isinstance(stream, SimStream):
            raise InvalidRequestError(
                f"launch needs a simulator stream (mgr.groups.stream(instance), sim.device.create_stream()), "
                f"got {shown(stream)}"
            )
        if work is not None and not callable(work):
            raise InvalidRequestError(
                f"launch's work must be a callable taking no arguments, or None, got {shown(work)}"
            )
        if not 0 <= real(duration) < math.inf:
            raise InvalidRequestError(
                f"launch's duration must be a finite number of seconds >= 0, got {shown(duration)}"
            )
        self._check_sticky()
        cost = duration + self.engines.kernel_latency
        engine = f"compute:{stream.id}"
        timeline, resets = self.timeline, self.resets

        def run() -> None:
            start = time.perf_counter()
            if cost:
                time.sleep(cost)
            if work is not None:
                try:
                    work()
                except ReleasedError as exc:  # the kernel touched memory freed after it was queued
                    if self.resets == resets:
                        self._stick(f"a kernel (tag {tag!r}) on {stream} used released memory: {exc}")
                    raise
            timeline.append(TimelineEntry(engine, "kernel", start, time.perf_counter(), tag))

        stream.enqueue(run)

    def copy(self, src: Any, dst: Any, stream: SimStream, *, tag: object = None) -> None:  # type: ignore[override]
        source, target = src, dst
        self._check_sticky()
        src, dst = self._ends(src, dst)
        if not (src.flags.c_contiguous and dst.flags.c_contiguous):  # as on a GPU: one block each
            raise BackendError(
                f"cannot copy between a {'non-' * (not src.flags.c_contiguous)}contiguous source and a "
                f"{'non-' * (not dst.flags.c_contiguous)}contiguous target of shape {dst.shape}: "
                "copy through np.ascontiguousarray (walk_chunks does), or use copy_strided"
            )
        if self.faults.check("copy"):
            raise BackendError(f"injected fault: copying {src.nbytes} bytes on {stream}")
        self._queue_copy(source, target, stream, src.nbytes, lambda: np.copyto(dst, src), tag, (src, dst))

    def copy_strided(self, src: Any, dst: Any, stream: SimStream, *, tag: object = None) -> None:  # type: ignore[override]
        """As on a GPU: the copy moves exactly the rows of its geometry, read from and written to
        raw memory; a geometry that would step outside either array's memory, or sides that
        overlap, fail here instead of corrupting it."""
        self._check_sticky()
        source, target = src, dst
        src, dst = self._ends(src, dst)
        found = geometry(src.shape, src.itemsize, src.strides, dst.strides)
        if found is None:
            raise BackendError(refusal(src.shape))
        if not found.nbytes:
            return
        at = {}
        for data, side in ((src, "src"), (dst, "dst")):
            at[side] = start = data.ctypes.data
            low, high = _memory_bounds(data)
            if not low <= start <= start + found.extent(side) <= high:
                raise BackendError(
                    f"a strided copy's {side} ({found}) would reach outside its {high - low} bytes of memory"
                )
        if at["src"] < at["dst"] + found.extent("dst") and at["dst"] < at["src"] + found.extent("src"):
            raise BackendError(
                f"a strided copy's source and target overlap ({found.extent('src')} bytes at {at['src']:#x}, "
                f"{found.extent('dst')} at {at['dst']:#x}): the copy engines would read what they write"
            )
        if self.faults.check("copy"):
            raise BackendError(f"injected fault: copying {found.nbytes} bytes on {stream}")
        rows = (found.depth, found.height, found.width // src.itemsize)
        from_rows = as_strided(src, rows, (found.src_slice, found.src_pitch, src.itemsize))
        to_rows = as_strided(dst, rows, (found.dst_slice, found.dst_pitch, dst.itemsize))
        self._queue_copy(source, target, stream, found.nbytes, lambda: np.copyto(to_rows, from_rows), tag, (src, dst))

    @staticmethod
    def _ends(src: Any, dst: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The numpy memory of both ends of a copy, checked: same shape and dtype, live, writable target."""
        if getattr(src, "shape", None) != getattr(dst, "shape", None) or getattr(src, "dtype", None) != getattr(
            dst, "dtype", None
        ):
            raise BackendError(
                f"cannot copy {getattr(src, 'shape', '?')} {getattr(src, 'dtype', '?')} into "
                f"{getattr(dst, 'shape', '?')} {getattr(dst, 'dtype', '?')}: shapes and dtypes must match"
            )
        try:
            src, dst = host_data(src), host_data(dst)
        except TypeError as exc:
            raise BackendError(f"cannot copy: {exc}") from exc
        check_live(src)
        check_live(dst)
        if not dst.flags.writeable:
            raise BackendError(f"cannot copy into a read-only {dst.shape} array: pass a writable one")
        return src, dst

    def _check_sticky(self) -> None:
        if self.sticky is not None:
            raise BackendError(
                f"the simulated device is unusable: {self.sticky}. On a GPU that corrupts memory the pool had "
                "handed on; release a response only once the work queued on its arrays (a walk's copies "
                "included) is done. A context reset (mgr.pool.invalidate_all()) clears it"
            )

    def _stick(self, what: str) -> None:
        if self.sticky is None:
            self.sticky = what

    def _on_live(self, resets: int, what: str, *ends: np.ndarray[Any, Any]) -> bool:
        """Whether an engine may run ``what`` on ``ends`` now: not once one was released after the
        operation was queued (that sticks), nor after a context reset (its memory is gone, quietly)."""
        if self.resets != resets:
            return False
        try:
            for end in ends:
                check_live(end)
        except ReleasedError as exc:
            self._stick(f"{what} ran on memory released after it was queued ({exc})")
            raise
        return True

    def _queue_copy(
        self,
        source: Any,
        target: Any,
        stream: SimStream,
        nbytes: int,
        move: Callable[[], None],
        tag: object,
        ends: tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]],
    ) -> None:
        """Queue ``move`` on ``stream``, on the copy engine of its direction (host arrays are numpy's);
        when it runs, both ``ends`` must still be live."""
        src_host, dst_host = isinstance(source, np.ndarray), isinstance(target, np.ndarray)
        direction = "h2d" if src_host and not dst_host else "d2h" if dst_host and not src_host else None
        resets, what = self.resets, f"a copy (tag {tag!r}) on {stream}"
        if direction is None:  # device to device or host to host: the stream's own engine

            def local() -> None:
                if self._on_live(resets, what, *ends):
                    move()

            stream.enqueue(local)
            return
        engines = self.engines
        bandwidth = engines.h2d_bandwidth if direction == "h2d" else engines.d2h_bandwidth
        cost = engines.copy_latency + nbytes / bandwidth
        lock, timeline = self._copy_engines[direction], self.timeline

        def run() -> None:
            with lock:  # one engine per direction
                start = time.perf_counter()
                if cost:
                    time.sleep(cost)
                if not self._on_live(resets, what, *ends):
                    return
                move()
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

    def prefetch(self, array: Any, device: int | None, stream: SimStream) -> None:  # type: ignore[override]
        self._check_sticky()
        self._check_location(device)
        if self.faults.check("prefetch"):
            raise BackendError(f"injected fault: prefetching {getattr(array, 'nbytes', '?')} bytes on {stream}")
        stream.enqueue(lambda: None)  # ordered like real work; data never moves on a CPU

    def advise(self, array: Any, advice: Advice, device: int | None) -> None:
        if not isinstance(advice, str) or advice not in ("preferred_location", "accessed_by", "read_mostly"):
            raise BackendError(f"unknown managed-memory advice {shown(advice)}")
        self._check_location(device)

    # -- context ----------------------------------------------------------------------------
    def reset(self) -> None:
        self.resets += 1
        self.sticky = None
        self.state.clear()
        self._close_streams("by a context reset: call mgr.groups.reinit_streams()")

    def close(self) -> None:
        self._close_streams(
            "with its backend, as a MemoryManager closes the backend it made when it exits (the end of its "
            "`async with`, or close()): use a manager's streams and arrays inside its `async with` (entering "
            "it again gives new streams)"
        )

    def _close_streams(self, why: str) -> None:
        for stream in list(self._streams):
            stream.close(why)
        self._streams.clear()


def _memory_bounds(data: np.ndarray[Any, Any]) -> tuple[int, int]:
    """The addresses of the whole memory ``data`` views: its first numpy owner's bytes (a
    block, a pinned buffer, a leased pool buffer, a user's array)."""
    while True:
        base = data.base
        if base is not None and not isinstance(base, np.ndarray):  # as_strided's, a pool lease's owner
            base = getattr(base, "base", None)
        if not isinstance(base, np.ndarray):
            break
        data = base
    low = int(data.ctypes.data)
    return low, low + int(data.nbytes)


for _name, _factory in (
    ("driver", _driver),
    ("cupy", _cupy_pool("cupy")),
    ("cupy_async", _cupy_pool("cupy_async")),
    ("numba", _numba),
    ("rmm", _rmm),
):
    register_allocator(_name, _factory, backend=SimDevice.name)
