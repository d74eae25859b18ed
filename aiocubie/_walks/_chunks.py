"""Walk a response chunk by chunk: copy each chunk's inputs in and its outputs out.

It does the index arithmetic of the chunk plan for the user. A batch that fits whole and whose
host arrays go straight is copied on the group's stream itself (:class:`Transfer`); anything
else goes through the copy-stream rotation (:class:`Rotation`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np

from .._errors import InvalidRequestError, shown, warn
from .._requests import ArrayResponse
from ._checks import check_served
from ._chunk import Chunk
from ._depth import depth_of
from ._rotation import Rotation
from ._transfer import Transfer

__all__ = ["walk_chunks"]


async def walk_chunks(
    response: ArrayResponse,
    *legacy: Any,
    inputs: Mapping[str, np.ndarray[Any, Any]] | None = None,
    outputs: Mapping[str, np.ndarray[Any, Any]] | None = None,
    depth: int | None = None,
    overlap: bool | None = None,
) -> AsyncIterator[Chunk]:
    """Yield the chunks of ``response`` with their data in place.

    Before each chunk is yielded, the chunk's slice of every input host array is copied to
    its device array; after the loop body, every output device array is copied back into its
    slice of the host array. Unchunkable inputs are copied once before the first chunk and
    unchunkable outputs once after the last.

    At depth 1 (the serial walk) copies are awaited, so the body may even read the device
    arrays from the host. At depth ``d > 1`` the walk overlaps: chunk ``i`` uses chunk
    buffer ``i % d`` of each array, the inputs of the next ``d - 1`` chunks copy in and the
    outputs of earlier chunks copy out on copy streams while the body's work for chunk ``i``
    runs. The body must then queue its work on ``chunk.stream`` (the group's stream) and not
    wait for it: the walk orders the copies after it with events, and the host waits only
    where it must (an output landed, or a buffer ``d`` chunks back free again). Pinned host
    arrays are copied directly; pageable ones pass through page-locked buffers of the
    device's pinned pool.

    A batch of one chunk is copied on the group's stream itself, in order with the body's
    work. Walked with ``overlap=True`` it is not awaited before the body: a loader that walks
    batch after batch so queues each batch's copy in, work and copy out behind the last
    one's, and waits only for its outputs (see "A batch stream" in docs/concepts/walks.md). With pinned
    host arrays it needs no more than that: one event for the outputs (and one for the copy in
    of a serial walk).

    Parameters
    ----------
    response : ArrayResponse
        What ``await mgr.request(instance, ...)`` returned: it knows its arrays, its plan, its
        stream and the device it is on. (The 0.1 form ``walk_chunks(mgr, instance,
        response, ...)`` still works, with a DeprecationWarning.)
    inputs, outputs : mapping, optional
        Label -> full-size (unchunked) host array of that label's request.
    depth : int, optional
        Chunk buffers to rotate through (1: serial). Default: as many as every chunked input
        and output has in ``response`` (see :func:`walk_requests`), capped at the chunk count.
    overlap : bool, optional
        Whether the body queues its work on ``chunk.stream`` without reading the device
        arrays on the host, so the walk need not wait for a chunk's copy in (the overlapped
        walk's contract). Default: at a depth above 1. True overlaps at any depth, a batch of
        one chunk too (the host then waits only for outputs, and at depth 1 for the last
        chunk's work before its buffers take the next chunk); False is the serial walk.

    Yields
    ------
    Chunk
        Index, run range, trimmed device arrays and host slices of each chunk, in order.

    Raises
    ------
    InvalidRequestError
        Before anything is copied: if ``response`` is not an ArrayResponse, ``inputs`` or
        ``outputs`` is not a mapping, a label is not in ``response.arrays``, a host array's
        shape or dtype does not match the full array requested, or an output is not a
        writable numpy array.
        Also if ``depth`` is more than a chunked input or output has buffers, or ``overlap``
        is not a bool or None.
    BackendError
        If a copy fails (all copies in flight are waited for first).
    ReleasedError
        If the response's arrays were freed (``mgr.release``, ``free``, ``free_all``, the end
        of its ``async with``, a context reset): before the first chunk, or at the next chunk
        when that happens during the walk. On the simulator, also if a host array is one of a
        released response (pinned or pageable), as copies refuse it.

    Notes
    -----
    Leaving the loop early (``break``, an exception, a cancellation) skips the copy-out of
    that chunk and of the unchunkable outputs; an overlapped walk first waits (shielded from
    cancellation) for the copies it queued, then gives its staging buffers back. Wrap the
    walk in ``contextlib.aclosing`` when you may break out of it, so it is closed at once.

    Releasing the response while a walk over it is under way (in the body, or from another
    task) ends the walk with ReleasedError at its next chunk, and the arrays' blocks go back
    to the device only once every walk over them has ended, after the copies it queued ahead
    (the next chunks' inputs) are done: those copies never write memory handed on. The
    response's bytes leave the manager's counts at the release; the device's free memory
    shows them when the walk has ended.

    Walk one response at a time: two walks over one response at once share its chunk
    buffers, and one can overwrite the other's chunks (nothing refuses it).

    Examples
    --------
    On the simulator (on a GPU, launch a kernel on ``chunk.stream`` in the body instead):

    >>> import anyio
    >>> import numpy as np
    >>> from aiocubie import ArrayRequest, MemoryManager, walk_chunks, walk_requests
    >>> from aiocubie.simulator import SimulatorBackend
    >>> x = np.arange(4096, dtype=np.float32).reshape(64, 64)
    >>> y = np.empty_like(x)
    >>> async def main():
    ...     with SimulatorBackend(total=16 << 10) as sim:  # 16 KiB: the 32 KiB walk is chunked
    ...         async with MemoryManager(sim) as mgr:
    ...             solver = object()
    ...             mgr.register(solver)
    ...             requests = walk_requests({"x": ArrayRequest.like(x), "y": ArrayRequest.like(y)})
    ...             async with mgr.request(solver, requests) as response:
    ...                 async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}):
    ...                     chunk.device["y"][...] = 2 * chunk.device["x"]
    ...                 return response.chunks > 1
    >>> anyio.run(main), bool((y == 2 * x).all())
    (True, True)
    """
    walked = _response(response, legacy)
    served = check_served(walked, "walk_chunks")
    # spillable arrays are resident for the walk (their transfer binds the resident ones)
    async with served.use() if served.lease.spill is not None else contextlib.nullcontext():
        transfer = Transfer(served, "walk_chunks")
        transfer.live()  # before the checks read its arrays: a released one holds none
        routed = transfer.route({} if inputs is None else inputs, {} if outputs is None else outputs)
        ins, outs, copies_in, copies_out = routed
        rotation = depth_of(served, ins, outs, depth)
        if overlap is None:
            overlap = rotation > 1
        elif not isinstance(overlap, bool):
            raise InvalidRequestError(f"overlap must be True, False or None (by depth), got {shown(overlap)}")
        if copies_in is not None and copies_out is not None:  # fits whole, straight: on the group's stream
            finished, steps = False, transfer.walked
            try:
                if steps is not None:
                    steps(served, "copy in", 0)
                for label, copy, ready in copies_in:
                    copy(ready, ("in", 0, label))
                if not overlap:  # serial: the data is on the device when the body runs
                    await transfer.done()
                if steps is not None:
                    steps(served, "body", 0)
                yield transfer.chunk(0, ins, outs)
                transfer.live()
                if steps is not None:
                    steps(served, "copy out", 0)
                for label, copy, ready in copies_out:
                    copy(ready, ("out", 0, label))
                await transfer.done()
                if steps is not None:
                    steps(served, "landed", 0)
                finished = True
            finally:
                if not finished:
                    await transfer.idle()
            return
        # closed with this generator, so that its cleanup runs when this one is closed
        async with contextlib.aclosing(Rotation(transfer, ins, outs, rotation, overlap).walk()) as chunks:
            async for chunk in chunks:
                yield chunk


def _response(response: Any, legacy: tuple[Any, ...]) -> Any:
    """The response walked: ``response``, or the third of the 0.1 form ``walk_chunks(mgr, instance, response)``."""
    if len(legacy) == 2 and not isinstance(response, ArrayResponse):  # walk_chunks(mgr, instance, response)
        warn(
            "walk_chunks(mgr, instance, response, ...) is deprecated: call walk_chunks(response, ...)",
            DeprecationWarning,
        )
        return legacy[1]
    if legacy:
        raise InvalidRequestError(
            f"walk_chunks takes one response and keyword arguments, got {1 + len(legacy)} positional arguments: "
            "walk_chunks(response, inputs={...}, outputs={...})"
        )
    return response
