"""A batch stream: batch after batch of one shape through one response's arrays, one chunk a batch.

Its parts: the batches read in turn (:class:`BatchSource`, which checks the arguments), the copies
(:class:`Transfer`, or the rotation for a batch that cannot go straight) and the batches in
flight (:class:`InFlight`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Iterable

import attrs

from .._requests import ArrayResponse
from ._batch_source import END, Batch, BatchSource, not_a_pair
from ._checks import check_served
from ._chunk import Chunk
from ._in_flight import InFlight
from ._rotation import Rotation
from ._transfer import Transfer

__all__ = ["walk_batches"]


async def walk_batches(
    response: ArrayResponse,
    batches: Iterable[Batch] | AsyncIterable[Batch],
    *,
    in_flight: int = 4,
) -> AsyncIterator[Chunk]:
    """Walk a stream of batches of one shape through one response's arrays: one chunk a batch.

    Each batch's inputs are copied in, the body runs (it queues its work on ``chunk.stream``),
    and its outputs are copied out, all on the group's stream, in order. The host does not wait
    for a batch before the next one is queued: it waits only to keep at most ``in_flight``
    batches queued and not yet landed, and at the end for the last ones. Stream order keeps
    each batch's copy in behind the last batch's copy out, so one set of arrays serves every
    batch; with ``in_flight=1`` each batch's outputs land before the next batch starts.

    The body must not read the device arrays on the host (as in an overlapped walk). A batch
    whose host arrays cannot go straight to the device (pageable, or in rows the copy engines
    cannot follow) is walked once the batches before it have landed, as :func:`walk_chunks`
    walks it, and the stream goes on after it.

    Parameters
    ----------
    response : ArrayResponse
        What ``await mgr.request(instance, ...)`` returned, for one batch's arrays; the batch
        must fit whole (``response.chunks == 1``).
    batches : iterable or async iterable of (inputs, outputs)
        Each batch's host arrays: two mappings of label -> full-size host array, as
        :func:`walk_chunks` takes them. Read lazily: batch ``b`` is read once batch
        ``b - in_flight`` has landed (its inputs copied in, its outputs in their host arrays),
        so a loader may refill a ring of ``in_flight`` host buffers; the arrays of the batches
        still in flight must not be written (inputs) or read (outputs) before then. An async
        loader (an async generator that awaits its I/O) is awaited for each batch while the
        batches before it are on the device.
    in_flight : int
        Batches queued on the device and not yet landed, at most (default 4).

    Yields
    ------
    Chunk
        One a batch: ``index`` is the batch's position in ``batches``, ``host`` its host arrays.

    Raises
    ------
    InvalidRequestError
        If ``response`` does not fit whole or is not a served ArrayResponse, ``in_flight`` is
        not a positive integer, a batch is not a pair of mappings, or a host array does not
        match its request (before that batch is copied).
    BackendError
        If a copy fails (what was queued is waited for first).
    ReleasedError
        If the response's arrays were released, at the next batch; on the simulator, also if a
        batch's host array is one of a released response.

    Notes
    -----
    Leaving the loop early (``break``, an exception, a cancellation) skips that batch's copy
    out and waits, shielded from cancellation, for what was queued. When the loop ends, every
    batch's outputs are in their host arrays. Wrap the walk in ``contextlib.aclosing`` when you
    may break out of it: a walk left suspended waits only once it is collected, so right after
    a bare ``break`` the batches still in flight may not have landed.

    The walk gives the event loop a turn whenever it waits for the device, and at least once
    every ``in_flight + 1`` batches when the device keeps ahead of it (a trip through the loop
    costs about as much as a copy; a cancellation lands at the next turn).

    Walk one response at a time: two walks over one response at once (``walk_batches`` or
    :func:`walk_chunks`) queue their batches into the same arrays, and one overwrites the
    other's inputs (nothing refuses it). To keep batches in flight from several tasks, give
    each its own response.

    Examples
    --------
    On the simulator (on a GPU, launch a kernel on ``chunk.stream`` in the body instead):

    >>> import anyio
    >>> import numpy as np
    >>> from aiocubie import ArrayRequest, MemoryManager, walk_batches
    >>> from aiocubie.simulator import SimulatorBackend
    >>> xs = [np.full((256,), b, np.float32) for b in range(8)]
    >>> ys = [np.empty_like(x) for x in xs]
    >>> async def main():
    ...     with SimulatorBackend(total=1 << 20) as sim:
    ...         async with MemoryManager(sim) as mgr:
    ...             loader = object()
    ...             mgr.register(loader)
    ...             requests = {"x": ArrayRequest.like(xs[0]), "y": ArrayRequest.like(ys[0])}
    ...             async with mgr.request(loader, requests, ordered=True) as response:
    ...                 pairs = (({"x": x}, {"y": y}) for x, y in zip(xs, ys))
    ...                 async for chunk in walk_batches(response, pairs):
    ...                     chunk.device["y"][...] = chunk.device["x"] + 1
    >>> anyio.run(main)
    >>> [float(y[0]) for y in ys]
    [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    """
    served = check_served(response, "walk_batches", whole=True)
    # spillable arrays are resident for the walk (their transfer binds the resident ones)
    async with served.use() if served.lease.spill is not None else contextlib.nullcontext():
        transfer = Transfer(served, "walk_batches")
        source = BatchSource(batches, in_flight)
        transfer.live()  # before the copiers read its arrays: a released one holds none
        flight = InFlight(transfer, in_flight)
        items, sync = source.items, source.sync
        finished = False
        try:
            index = -1
            while True:
                batch = next(items, END) if sync else await source.take_async()
                if batch is END:
                    break
                index += 1
                if not (isinstance(batch, tuple) and len(batch) == 2):
                    raise not_a_pair(batch, index)
                ins, outs = batch
                transfer.live()  # released while the batches before it were walked
                ins, outs, copies_in, copies_out = transfer.route(ins, outs)
                if copies_in is None or copies_out is None:  # staged or repacked: alone, once the others landed
                    await flight.drain()
                    async with contextlib.aclosing(Rotation(transfer, ins, outs, 1, True).walk()) as one:
                        async for chunk in one:
                            yield attrs.evolve(chunk, index=index)
                    continue
                for label, copy, ready in copies_in:
                    copy(ready, ("in", index, label))
                yield transfer.chunk(index, ins, outs)
                transfer.live()
                for label, copy, ready in copies_out:
                    copy(ready, ("out", index, label))
                if flight.queued((*ins.values(), *outs.values())):
                    await flight.wait()
            await flight.drain()
            finished = True
        finally:
            if not finished:
                await transfer.idle()
