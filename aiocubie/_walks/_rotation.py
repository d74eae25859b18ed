"""The copy-stream rotation: a walk of several chunks, its copies overlapped with the body's work.

At depth 1 it copies on the response's stream and waits for each copy (the serial walk);
deeper, it overlaps: copies run on two copy streams, ordered by events against the group's
stream. A chunk's slice of a pinned host array goes straight to its buffer (a 2-D copy when the
run axis is not the first); pageable host data is packed into and out of the device's pinned
pool on host threads. It never launches kernels and never lets a copy outlive the buffers it uses.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from types import MappingProxyType
from typing import Any

import anyio
import numpy as np

from .._backends import Event, Staging, geometry, stage
from ._chunk import Chunk, runs_in, trim, view
from ._transfer import Hosts, Transfer

__all__ = ["Rotation"]


class Rotation:
    """One walk of a response through its chunk buffers: its streams, events, staging buffers and the order between them.

    At depth 1 every copy is awaited before the walk goes on (the serial walk). Deeper,
    chunk ``i`` uses buffer set ``k = i % depth``. Its copy in (on the in-stream) waits for
    the body of chunk ``i - depth`` (the last user of set ``k``) and, for arrays that are both
    input and output, for that chunk's copy out; the body of chunk ``i`` (on the group's
    stream) waits for its copy in and for the copy out of chunk ``i - depth``; its copy out
    (on the out-stream) waits for its body. Staging buffers rotate the same way. A walk of one
    chunk copies on the group's stream itself: stream order does what the events would.
    """

    def __init__(self, transfer: Transfer, ins: Hosts, outs: Hosts, depth: int, overlap: bool) -> None:
        self.transfer, self.depth, self.overlap = transfer, depth, overlap
        self.response = response = transfer.response
        self.device = device = transfer.device
        self.stream, self.loop = transfer.stream, transfer.loop
        self.ins, self.outs = ins, outs
        # one chunk: nothing of the walk's own to overlap; its copies queue on the group's stream
        self.cin, self.cout = transfer.copy_streams()
        axes = response.chunk_axes
        self.chunked_in = [label for label in ins if axes[label] is not None]
        self.chunked_out = [label for label in outs if axes[label] is not None]
        self.in_place = bool(set(self.chunked_in) & set(self.chunked_out))
        self.pinned = {label: device.is_pinned(array) for label, array in {**ins, **outs}.items()}
        self.pool = device.pinned_pool
        self.staging: list[np.ndarray[Any, Any]] = []  # pool buffers this walk holds
        self.slots_in: list[dict[str, np.ndarray[Any, Any]]] = [{} for _ in range(depth)]
        self.slots_out: list[dict[str, np.ndarray[Any, Any]]] = [{} for _ in range(depth)]
        self.in_done: dict[int, Event] = {}
        self.body_done: dict[int, Event] = {}
        self.out_done: dict[int, Event] = {}
        # by chunk: host copies of pageable inputs into staging buffers (on staging threads), and
        # what completes once the outputs are in their host arrays (the copy out, or the host
        # copies out of the staging buffers after it), in chunk order
        self.packs: dict[int, Staging] = {}
        self.landed: dict[int, Event] = {}

    async def walk(self) -> AsyncGenerator[Chunk, None]:
        """Yield the chunks in order, each with its inputs in place; copy its outputs out after the body."""
        response, walked = self.response, self.transfer.walked
        finished = False
        response.lease.walk_started()  # a release while it walks frees the blocks once it has ended
        try:
            await self._start()
            issued = 0
            for index in range(response.chunks):
                self.transfer.live()
                while issued < min(response.chunks, index + self.depth):
                    if walked is not None:
                        walked(response, "copy in", issued)
                    await self._copy_in(issued)
                    issued += 1
                await self._before_body(index)
                if walked is not None:
                    walked(response, "body", index)
                yield self._chunk(index)
                if walked is not None:
                    walked(response, "copy out", index)
                await self._after_body(index)
            await self._settle(up_to=response.chunks)
            await self._whole_out()
            finished = True
        finally:
            try:
                if not finished:
                    await self._quiesce()
                for buffer in self.staging:
                    self.pool.release(buffer)
                self.staging.clear()
            finally:
                response.lease.walk_ended()

    async def _start(self) -> None:
        """Order the copy-in stream after the allocation, and copy the unchunked inputs in."""
        response = self.response
        self.transfer.live()
        ready = response.ready  # the allocation: a copy stream waits for it (an ordered request)
        if ready is not None and self.cin is not self.stream and not ready.query():
            self.device.wait_event(self.cin, ready)
        whole_in = [label for label in self.ins if response.chunk_axes[label] is None]
        if whole_in:
            await self._copy_whole(
                [np.ascontiguousarray(self.ins[label]) for label in whole_in],
                [response.arrays[label] for label in whole_in],
            )

    async def _before_body(self, index: int) -> None:
        """Order chunk ``index``'s body after its copy in and after the last users of its buffers."""
        device, depth = self.device, self.depth
        if not self.overlap:  # serial: the data is on the device when the body runs
            await self.loop.wait(self.in_done[index])
        if self.cin is not self.stream:
            device.wait_event(self.stream, self.in_done[index])
        if index >= depth:
            if self.chunked_out:
                device.wait_event(self.stream, self.out_done[index - depth])
            # keep the host at most `depth` chunks ahead of the device
            await self.loop.wait(self.body_done[index - depth])
        else:
            await self.loop.checkpoint()
        await self._settle(ready_only=True)

    async def _after_body(self, index: int) -> None:
        """Copy chunk ``index``'s outputs out after the body's work, and forget the events no one waits for."""
        self.transfer.live()
        if self.cout is not self.stream:
            self.body_done[index] = self.device.record_event(self.stream)
        await self._copy_out(index)
        if not self.overlap:
            await self._settle(up_to=index)
        for events in (self.in_done, self.body_done, self.out_done):
            events.pop(index - self.depth - 1, None)

    async def _whole_out(self) -> None:
        """Copy the unchunked outputs out, once every chunk is done."""
        response = self.response
        whole_out = [label for label in self.outs if response.chunk_axes[label] is None]
        if whole_out:
            buffers = [np.empty_like(self.outs[label], order="C") for label in whole_out]
            await self._copy_whole([response.arrays[label] for label in whole_out], buffers)
            for label, buffer in zip(whole_out, buffers):
                self.outs[label][...] = buffer

    async def _copy_whole(self, sources: list[Any], targets: list[Any]) -> None:
        """Copy the unchunked arrays on the group's stream and wait until they are done."""
        for source, target in zip(sources, targets):
            self.device.copy(source, target, self.stream)
        await self.loop.wait(self.device.record_event(self.stream))

    def _chunk(self, index: int) -> Chunk:
        response = self.response
        start, stop = response.chunk_bounds(index)
        axes, slot = response.chunk_axes, index % self.depth
        device = {label: trim(response.buffer(label, slot), axes[label], stop - start) for label in response.arrays}
        host = {label: array[response.chunk_slices(index, label)] for label, array in {**self.ins, **self.outs}.items()}
        self.transfer.views["chunk"] = device  # emptied of the arrays on release (see Lease._drop_views)
        return Chunk(index, start, stop, MappingProxyType(device), MappingProxyType(host), self.stream)

    def _staging(
        self, slots: list[dict[str, np.ndarray[Any, Any]]], index: int, label: str, nbytes: int
    ) -> tuple[np.ndarray[Any, Any], bool]:
        """The staging buffer of ``label`` for chunk ``index``, and whether it was used before."""
        slot = slots[index % self.depth]
        buffer = slot.get(label)
        if buffer is not None:
            return buffer, True
        buffer = slot[label] = self.pool.acquire(nbytes)
        self.staging.append(buffer)
        return buffer, False

    async def _copy_in(self, index: int) -> None:
        response, device, depth, cin = self.response, self.device, self.depth, self.cin
        if index >= depth:
            device.wait_event(cin, self.body_done[index - depth])
            if self.in_place:
                device.wait_event(cin, self.out_done[index - depth])
        if not index:  # the first chunks of every staging buffer pack at once
            for first in range(min(depth, response.chunks)):
                self._pack(first)
        packed = self.packs.get(index)
        if packed is not None:
            await self.loop.wait(packed)
            del self.packs[index]  # only now: cancelled while it packs, _quiesce waits for it
            packed.result()
            self.transfer.live()  # a reset or release while it packed
        length = runs_in(response, index)
        for label in self.chunked_in:
            target, host, direct = self._ends(self.ins, label, index, length)
            source = host if direct else view(self.slots_in[index % depth][label], target)
            device.copy_strided(source, target, cin, tag=("in", index, label))
        if cin is self.stream and self.overlap:  # one chunk on the group's stream: nothing waits for its copy in
            return
        event = self.in_done[index] = device.record_event(cin)
        if index + depth < response.chunks:  # its buffers are free again once this copy is done
            self._pack(index + depth, after=event)

    def _pack(self, index: int, after: Event | None = None) -> None:
        """Start packing chunk ``index``'s pageable inputs into its staging buffers on host threads."""
        length = runs_in(self.response, index)
        copies = []
        for label in self.chunked_in:
            target, host, direct = self._ends(self.ins, label, index, length)
            if not direct:
                buffer, _ = self._staging(self.slots_in, index, label, self.response.buffer(label, 0).nbytes)
                copies.append((view(buffer, target), host))
        if copies:
            self.packs[index] = stage(copies, after)

    def _ends(
        self, hosts: dict[str, np.ndarray[Any, Any]], label: str, index: int, length: int
    ) -> tuple[Any, np.ndarray[Any, Any], bool]:
        """Both ends of chunk ``index``'s copy of ``label``: the chunk buffer trimmed to the chunk,
        the host slice, and whether the copy can go straight between them (the host side pinned,
        in rows the copy engines can follow)."""
        response = self.response
        axis = response.chunk_axes[label]
        trimmed = trim(response.buffer(label, index % self.depth), axis, length)
        host = hosts[label][response.chunk_slices(index, label)]
        direct = self.pinned[label] and geometry(host.shape, host.itemsize, host.strides, trimmed.strides) is not None
        return trimmed, host, direct

    async def _copy_out(self, index: int) -> None:
        response, device, depth, cout = self.response, self.device, self.depth, self.cout
        if cout is not self.stream:
            device.wait_event(cout, self.body_done[index])
        length = runs_in(response, index)
        unpack: list[tuple[Any, Any]] = []
        for label in self.chunked_out:
            source, host, direct = self._ends(self.outs, label, index, length)
            if direct:
                target: Any = host
            else:
                nbytes = response.buffer(label, 0).nbytes
                buffer, used = self._staging(self.slots_out, index, label, nbytes)
                if used:  # chunk index - depth's data must be in its host array first
                    await self._settle(up_to=index - depth)
                target = view(buffer, source)
                unpack.append((host, target))
            device.copy_strided(source, target, cout, tag=("out", index, label))
        event = self.out_done[index] = device.record_event(cout)
        self.landed[index] = stage(unpack, after=event) if unpack else event

    async def _settle(self, *, up_to: int = -1, ready_only: bool = False) -> None:
        """Wait until the outputs of chunks up to ``up_to`` are in their host arrays (with
        ``ready_only``: collect those that are already), raising what a host copy raised."""
        landed = self.landed
        for index in sorted(landed):
            done = landed[index]
            if index > up_to and not (ready_only and done.query()):
                break
            await self.loop.wait(done)
            del landed[index]
            if self.transfer.walked is not None:
                self.transfer.walked(self.response, "landed", index)
            if isinstance(done, Staging):
                done.result()

    async def _quiesce(self) -> None:
        """Wait, shielded from cancellation, until every stream and staging copy of the walk is idle."""
        with anyio.CancelScope(shield=True):
            for stream in (self.cin, self.cout, self.stream):
                await self.transfer.idle(stream)
            # host copies still under way write the staging buffers and the host arrays
            for staged in (*self.packs.values(), *self.landed.values()):
                await self.loop.wait(staged)
