"""The device account: the backend, the budget, the ledger and the free-memory reading, together.

It alone allocates and frees through the backend for the manager and the schedulers, keeps the
ledger in step with the device, and says how many bytes a group is offered. It knows nothing
of tickets, tasks or the event loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any

from ._backends import Backend, Event
from ._budget import Budget, group_available
from ._ledger import Allocation, Ledger
from ._options import Options
from ._planner import ChunkPlan, offered_bytes
from ._requests import ArrayResponse, RequestSet

__all__ = ["DeviceAccount"]


class DeviceAccount:
    """Memory of one device as a manager sees it.

    Parameters
    ----------
    backend : Backend
        The device.
    options : Options
        Read for the mode, the headroom and how long a free-memory reading is reused.
        Replaced by assigning :attr:`options`.
    on_release : callable
        Called with no argument after memory is released while batches may wait for it
        (active mode, policy wait).
    """

    def __init__(self, backend: Backend, options: Options, on_release: Callable[[], None]) -> None:
        self.backend = backend
        self.options = options
        self.budget = Budget(backend.memory_info().total)
        self.ledger = Ledger()
        self._on_release = on_release
        self._free_reading = 0
        self._free_at = -math.inf
        self._free_delta = 0  # VRAM we allocated (+) or released (-) since the reading

    # -- what there is -----------------------------------------------------------------------
    def free_memory(self, *, fresh: bool) -> int:
        """Free device memory: a reading at most ``free_cache_seconds`` old, or a new one.

        A cached reading is corrected by what this account allocated and freed since.
        """
        now = time.monotonic()
        if fresh or now - self._free_at > self.options.free_cache_seconds:
            self._free_reading = self.backend.memory_info().free
            self._free_at, self._free_delta = now, 0
        return self._free_reading - self._free_delta

    def available(
        self,
        members: Collection[Hashable],
        free: int,
        *,
        as_if_empty: bool = False,
        group: str = "?",
        warn: bool = False,
    ) -> int:
        """Bytes a group of ``members`` may use under the mode (see :func:`group_available`).

        ``as_if_empty``: as if its members held nothing.
        """
        if not self.options.active:  # passive: caps and holdings do not matter
            return max(0, free)
        return group_available(
            self.options.mode,
            free=free,
            group_cap=self.budget.group_cap(members),
            group_held=0 if as_if_empty else self.ledger.held(members),
            group=group,
            warn=warn,
        )

    def offered(self, members: Collection[Hashable], free: int, *, as_if_empty: bool = False) -> int:
        """Bytes the next batch of a group of ``members`` may take (see :func:`offered_bytes`).

        ``as_if_empty``: what it would be offered if its members held nothing (what a batch
        waiting for memory waits for).
        """
        options = self.options
        if not options.active:  # passive: what is free
            return offered_bytes(free, free, headroom=options.headroom, granule=self.backend.granule)
        if as_if_empty:
            free += self.ledger.held(members)  # what they hold would be free
        available = self.available(members, free, as_if_empty=as_if_empty)
        return offered_bytes(available, free, headroom=options.headroom, granule=self.backend.granule)

    # -- allocation and release --------------------------------------------------------------
    def allocate(
        self,
        entries: Sequence[tuple[Hashable, RequestSet]],
        group: str,
        plan: ChunkPlan,
        stream: Any,
    ) -> tuple[list[ArrayResponse], Event]:
        """Allocate every array of a batch with ``plan``'s shapes, then record an event.

        All or nothing: if anything fails, what was allocated is freed before the error
        propagates. Returns one response per entry (entered in the ledger) and the event
        recorded after the last allocation and zero fill.
        """
        backend = self.backend
        batch: list[list[Allocation]] = []
        totals: list[int] = []
        chunk_length = plan.chunk_length
        try:
            for key, requests in entries:
                allocs: list[Allocation] = []
                batch.append(allocs)  # before allocating: a failure frees what this entry has too
                vram = 0
                whole = chunk_length >= requests.runs
                for label, request in requests.arrays.items():
                    if whole:
                        shape, nbytes, copies = request.shape, request.nbytes, 1
                    else:
                        shape = request.chunked_shape(chunk_length)
                        nbytes = math.prod(shape) * request.dtype.itemsize
                        copies = min(request.buffers, plan.chunks)  # a walk's chunk buffers
                    if not request.uses_vram:
                        nbytes = 0
                    for _ in range(copies):
                        array = backend.allocate(shape, request.dtype, request.kind, stream)
                        allocs.append(Allocation(array, label, key, group, request.kind, nbytes))
                        vram += nbytes
                        if request.zero:
                            backend.zero(array, stream)
                totals.append(vram)
            event = backend.record_event(stream)
        except BaseException:
            for allocs in batch:
                for alloc in allocs:
                    backend.free(alloc.array)
            raise
        responses = [
            self.respond(requests, allocs, plan, stream, vram)
            for (_, requests), allocs, vram in zip(entries, batch, totals)
        ]
        return responses, event

    def respond(
        self, requests: RequestSet, allocations: list[Allocation], plan: ChunkPlan, stream: Any, vram: int = 0
    ) -> ArrayResponse:
        """The response for ``allocations`` (``vram`` bytes together), entered in the ledger."""
        arrays: dict[str, Any] = {}
        buffers: dict[str, tuple[Any, ...]] = {}
        for a in allocations:
            if a.label not in arrays:
                arrays[a.label] = a.array
            else:  # the chunk buffers of a label: arrays[label] is the first
                buffers[a.label] = (*buffers.get(a.label, (arrays[a.label],)), a.array)
        response = ArrayResponse(
            arrays=arrays,
            chunks=plan.chunks,
            chunk_length=plan.chunk_length,
            runs=plan.runs,
            chunked_shapes=requests.chunked_shapes(plan.chunk_length),
            chunk_axes=requests.chunk_axes,
            stream=stream,
            buffers=buffers,
            backend=self.backend,
        )
        if allocations:
            self.ledger.add(response, allocations, vram)
            self._free_delta += vram
        return response

    def release(self, response: ArrayResponse | None) -> None:
        """Free the arrays of ``response`` (nothing if it holds none, or was released)."""
        if response is not None:
            self.free(self.ledger.pop_owner(response))

    def release_where(self, predicate: Callable[[Allocation], bool]) -> list[Allocation]:
        """Free every allocation for which ``predicate`` is true; return them."""
        allocations = self.ledger.pop_where(predicate)
        self.free(allocations)
        return allocations

    def free(self, allocations: list[Allocation]) -> None:
        """Free ``allocations`` (already out of the ledger) on the device."""
        if not allocations:
            return
        free = self.backend.free
        for alloc in allocations:
            free(alloc.array)
            self._free_delta -= alloc.vram
        if self.options.waits:  # only a batch waiting for memory cares: spare waking every group
            self._on_release()

    def forget_all(self) -> None:
        """The context that held every array is gone: empty the ledger, read the device anew."""
        self.ledger.pop_where(lambda a: True)
        self._free_delta = 0
        self._free_at = -math.inf
