"""The copies of one walk over one response, bound once: the one copy path every walk takes.

A :class:`Transfer` knows the response's device, stream and event loop, binds a
:class:`~aiocubie._backends.Copier` per array the first time a walk copies it, and routes each
set of host arrays: straight (every copy queued on the group's stream, in order with the body's
work) or through the copy-stream rotation (:mod:`._rotation`: chunk buffers, copy streams,
staging). :func:`walk_chunks` and :func:`walk_batches` both copy through it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import anyio
import anyio.to_thread
import numpy as np

from .._backends import Copier, Device
from .._completion import Loop, running_loop
from .._errors import AiocubieError, ReleasedError
from .._protocols import StreamLike
from .._requests import ArrayResponse
from ._checks import check_hosts, straight
from ._chunk import Chunk

__all__ = ["Copies", "Hosts", "Transfer"]

#: Label -> host array.
Hosts = dict[str, np.ndarray[Any, Any]]
#: (label, queue the copy, what it takes) for each array of a set that goes straight.
Copies = list[tuple[str, Callable[[Any, object], None], Any]]


class Transfer:
    """The copies of one walk over ``response``.

    Parameters
    ----------
    response : ArrayResponse
        A served response (it has a device).
    walk : str
        The walk's name, for its errors.
    """

    __slots__ = ("copiers", "device", "loop", "response", "stream", "view", "views", "walk", "walked")

    def __init__(self, response: ArrayResponse, walk: str) -> None:
        self.response, self.walk = response, walk
        self.device: Device = response.device
        self.stream = response.stream
        self.loop: Loop = running_loop()
        #: ``walked(response, step, chunk)`` records the walk's steps in the allocation history (None: not recording)
        self.walked = response.lease.walked
        #: What every walk of a batch stream asks again (dropped on release: see Lease._drop_views)
        views = self.views = response.lease.cached_views()
        #: (label, into the device?) -> its copier, bound once a response (on first use: a walk copies
        #: its inputs in and its outputs out only), kept with the response's other views of its arrays
        self.copiers: dict[tuple[str, bool], Copier] = views.setdefault("copiers", {})
        #: The arrays as a walk that fits whole yields them (a live response's: :meth:`live` first)
        view: Mapping[str, Any] | None = views.get("device")
        if view is None:  # a read-only view of the arrays: a one-chunk walk's chunk.device
            arrays = views["arrays"] = dict(response.arrays)  # what chunks hold: emptied on release
            view = views["device"] = MappingProxyType(arrays)
        self.view = view

    def live(self) -> None:
        """Refuse to go on with a response whose arrays were released (checked at every chunk and batch)."""
        response = self.response
        if response.lease.released:  # the set itself: a walk checks it at every chunk
            raise ReleasedError(
                f"{self.walk}: the response's arrays {sorted(response.released)} were released (mgr.release, free, "
                "free_all, the end of its `async with`, its manager's exit, or a context reset): walk inside "
                "the `async with mgr.request(...)` block, or before releasing the response"
            )

    def route(self, ins: Any, outs: Any) -> tuple[Hosts, Hosts, Copies | None, Copies | None]:
        """``ins`` and ``outs`` checked, and their straight copies (None, None: the rotation walks them).

        Host arrays of a walk that fits whole and go straight as one block are recognized in a few
        comparisons (a batch stream's every batch); anything else is checked in full (every bad one
        refused before anything is copied), then goes straight if the walk fits whole and the copy
        engines follow its rows. Queue a copy with ``copy(ready, tag)`` for each ``(label, copy,
        ready)`` of the copies.
        """
        response = self.response
        if response.chunks == 1 and type(ins) is dict and type(outs) is dict:
            found = self._straight(ins, outs)
            if found is not None:
                return ins, outs, found[0], found[1]
        ins, outs = check_hosts(response, ins, "inputs"), check_hosts(response, outs, "outputs")
        if response.chunks != 1 or not straight(response, ins, outs):  # staged or repacked
            return ins, outs, None, None
        # straight in rows the copy engines follow (the copier's copy_strided works them out)
        copies_in: Copies = [(label, self._copier(label, True).__call__, host) for label, host in ins.items()]
        copies_out: Copies = [(label, self._copier(label, False).__call__, host) for label, host in outs.items()]
        return ins, outs, copies_in, copies_out

    def _straight(self, ins: Hosts, outs: Hosts) -> tuple[Copies, Copies] | None:
        """The copies in and out, if every host array goes straight as one block (see
        :meth:`Copier.straight`); None if any does not, or a label is not known."""
        copiers, arrays = self.copiers, self.response.arrays
        copies_in: Copies = []
        copies_out: Copies = []
        for hosts, copies, to_device in ((ins, copies_in, True), (outs, copies_out, False)):
            for label, host in hosts.items():
                copier = copiers.get((label, to_device))
                if copier is None:
                    if label not in arrays:
                        return None
                    copier = self._copier(label, to_device)
                ready = copier.straight(host)
                if ready is None:
                    return None
                copies.append((label, copier.queue, ready))
        return copies_in, copies_out

    def _copier(self, label: str, to_device: bool) -> Copier:
        """The copier of ``label`` into (``to_device``) or out of its array, bound on first use."""
        copier = self.copiers.get((label, to_device))
        if copier is None:
            array = self.response.arrays[label]
            copier = self.copiers[label, to_device] = self.device.copier(array, self.stream, to_device=to_device)
        return copier

    def chunk(self, index: int, ins: Mapping[str, Any], outs: Mapping[str, Any]) -> Chunk:
        """The one chunk of a walk that fits whole: every array, the whole host arrays."""
        return Chunk(index, 0, self.response.runs, self.view, MappingProxyType({**ins, **outs}), self.stream)

    def copy_streams(self) -> tuple[Any, Any]:
        """The (in, out) copy streams of the group's stream, which its group made and keeps (a walk of
        one chunk copies on the stream itself)."""
        response = self.response
        if response.chunks == 1:
            return self.stream, self.stream
        group_made = response._copy_streams
        if group_made is None:  # a response no group served (a ready hook's plan): streams of the walk's own
            return self.device.create_stream(), self.device.create_stream()
        return group_made()

    async def done(self) -> None:
        """Wait until what is queued on the group's stream so far is done."""
        await self.loop.wait(self.device.record_event(self.stream))

    async def idle(self, stream: StreamLike | None = None) -> None:
        """Wait, shielded from cancellation, until ``stream`` (default: the group's) has done what the walk queued on it."""
        stream = self.stream if stream is None else stream
        with anyio.CancelScope(shield=True):
            try:
                event = self.device.record_event(stream)
            except AiocubieError:  # cannot record (a closed stream): wait for it on a thread
                # the staging buffers go back to the pool after this: copies queued
                # before the error still read and write them (issue 22, item 3)
                synchronize = getattr(stream, "synchronize", None) or getattr(stream, "sync", None)
                if synchronize is not None:
                    await anyio.to_thread.run_sync(synchronize)
                return
            await self.loop.wait(event)
