"""CUDA events and their completion callbacks: a waiter thread per stream, or a host function.

It never calls a callback while holding a lock, and never lets a callback's exception kill a
driver or helper thread.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Literal

from cuda.bindings import driver as binding

from .._base import Event
from ._errors import check

__all__ = ["EVENT_FLAGS", "EVENT_MECHANISMS", "CudaEvent", "EventMechanism", "StreamWaiter"]

log = logging.getLogger("aiocubie")

#: How :meth:`CudaEvent.add_done_callback` learns that the GPU reached the event:
#: ``"thread"`` (the default), a helper thread per stream blocked in ``cuEventSynchronize``
#: (blocking-sync events, so it sleeps instead of spinning); ``"host_func"``, a
#: ``cuLaunchHostFunc`` queued right after the event. benchmarks/NOTES-gpu.md has the
#: measurements behind the default: "thread" had the lower median and p99 in every case.
EVENT_MECHANISMS = ("thread", "host_func")
EventMechanism = Literal["thread", "host_func"]

# Blocking sync makes cuEventSynchronize sleep in the kernel rather than spin a core; no timing
# makes recording cheaper.
EVENT_FLAGS = int(binding.CUevent_flags.CU_EVENT_BLOCKING_SYNC) | int(binding.CUevent_flags.CU_EVENT_DISABLE_TIMING)


class StreamWaiter:
    """A daemon thread that waits, in order, on the events of one stream and runs their callbacks.

    Events of one stream complete in the order they were recorded, so a FIFO per stream never
    holds a completed event behind a pending one of another stream.
    """

    def __init__(self, context: Any, name: str) -> None:
        self._context = context
        self._queue: queue.SimpleQueue[tuple[Any, Callable[[], None]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, event: Any, callback: Callable[[], None]) -> None:
        """Run ``callback`` once ``event`` (anything with a CUevent ``handle``) completes."""
        self._queue.put((event, callback))

    def stop(self) -> None:
        """Finish the queued waits (their events must be able to complete), then end the thread."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        # Raw driver calls only: numba's per-thread context cache would go stale at a reset.
        binding.cuCtxSetCurrent(self._context)
        while (item := self._queue.get()) is not None:
            event, callback = item
            # cuEventSynchronize releases the GIL. On a device error the callback still runs:
            # the waiter wakes, and event.query() raises the error.
            binding.cuEventSynchronize(event.handle)
            _run_callback(callback)


def _run_callback(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # a callback's bug must not kill a driver or helper thread
        log.exception("aiocubie: an event callback raised")


_HOST_FN_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_host_callbacks: dict[int, Callable[[], None]] = {}
_host_keys = itertools.count(1)  # 0 would arrive as None


@_HOST_FN_TYPE
def _host_fn(key: int) -> None:
    # Runs on a CUDA driver thread; ctypes takes the GIL for us. dict.pop is atomic under the GIL.
    _run_callback(_host_callbacks.pop(key))


_HOST_FN = binding.CUhostFn(ctypes.cast(_host_fn, ctypes.c_void_p).value)


class CudaEvent(Event):
    """A blocking-sync CUDA event recorded on a stream.

    Parameters
    ----------
    handle : cuda.bindings.driver.CUevent
        The recorded event; handed back to the backend's spares when this object is collected.
    stream : numba stream or 0
        The stream it was recorded on.
    backend : CudaBackend
        Supplies the completion mechanism.
    """

    def __init__(self, handle: Any, stream: Any, backend: Any) -> None:
        self.handle = handle
        self.stream = stream
        self._backend = backend

    def __del__(self) -> None:
        # Back to the backend's free list for the next record (cuEventCreate and a finalizer
        # per event cost several microseconds). Whoever still waits on it holds this object.
        self._backend._spare_events.append(self.handle)

    def query(self) -> bool:
        (err,) = binding.cuEventQuery(self.handle)
        if err == binding.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check((err,), "cuEventQuery")
        return True

    def synchronize(self) -> None:
        check(binding.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the GPU reaches the event, from a helper or driver thread.

        Runs it at once on the calling thread if the event is already complete. With the
        ``"host_func"`` mechanism, work queued on the stream after the event and before this
        call delays the callback, and the stream waits for the callback (and the GIL) to return.
        """
        if self.query():
            callback()
        elif self._backend.event_mechanism == "thread":
            self._backend._waiter(self.stream).submit(self, callback)
        else:
            key = next(_host_keys)
            _host_callbacks[key] = callback
            try:
                self._backend._launch_host_func(self.stream, _HOST_FN, key)
            except BaseException:
                del _host_callbacks[key]
                raise
