"""Walk a response chunk by chunk: copy each chunk's inputs in and its outputs out.

It does the index arithmetic of the chunk plan for the user. At depth 1 it copies on the
response's stream and waits for each copy (the serial walk); deeper, it
overlaps: copies run on two copy streams, ordered by events against the group's stream. A
chunk's slice of a pinned host array goes straight to its buffer (a 2-D copy when the run axis
is not the first); pageable host data is packed into and out of the device's pinned pool on
host threads. It never launches kernels and never lets a copy outlive the buffers it uses.
"""

from __future__ import annotations

import collections
import contextlib
import math
import weakref
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, cast

import anyio
import anyio.to_thread
import attrs
import numpy as np

from ._backends import Copier, Device, Event, Staging, StreamLike, geometry, stage
from ._completion import Loop, running_loop
from ._errors import AiocubieError, InvalidRequestError, ReleasedError, shown, warn
from ._requests import ArrayRequest, ArrayResponse

__all__ = ["DEFAULT_DEPTH", "Chunk", "walk_batches", "walk_chunks", "walk_requests"]

#: Chunk buffers (pipeline depth) :func:`walk_requests` asks for by default: 2 overlaps the
#: next chunk's copy in and the last chunk's copy out with this chunk's work whenever inputs
#: and outputs are different arrays (benchmarks/README.md has the measurements).
DEFAULT_DEPTH = 2


#: One batch of :func:`walk_batches`: its inputs and outputs, label -> host array.
_Batch = tuple[Mapping[str, np.ndarray[Any, Any]], Mapping[str, np.ndarray[Any, Any]]]
_END = object()  # no batch left


@attrs.frozen
class Chunk:
    """One chunk of a walk (see :func:`walk_chunks`).

    Attributes
    ----------
    index : int
        Position of the chunk, from 0 to ``response.chunks - 1``.
    start, stop : int
        The runs ``[start, stop)`` of the whole batch this chunk covers.
    device : mapping
        Label -> device array, trimmed along its run axis to this chunk's length (the last
        chunk may be shorter than the arrays); unchunkable arrays are whole.
    host : mapping
        Label -> the matching slice (a view) of each full-size host array passed in (the
        output's, for a label that is both an input and an output). In an overlapped walk,
        read inputs and write outputs through ``device``, not here.
    stream : object
        The stream to launch this chunk's work on (the group's stream): the chunk's inputs
        are ready on it, and its outputs are copied out after what is queued on it when the
        body returns.
    """

    index: int
    start: int
    stop: int
    device: Mapping[str, Any]
    host: Mapping[str, np.ndarray[Any, Any]]
    stream: Any = None

    @property
    def length(self) -> int:
        """Runs in this chunk: ``stop - start``."""
        return self.stop - self.start


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
    one's, and waits only for its outputs (see "A batch stream" in the README). With pinned
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
    >>> from aiocubie import ArrayRequest, MemoryManager, SimulatorBackend, walk_chunks, walk_requests
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
    if len(legacy) == 2 and not isinstance(response, ArrayResponse):  # walk_chunks(mgr, instance, response)
        warn(
            "walk_chunks(mgr, instance, response, ...) is deprecated: call walk_chunks(response, ...)",
            DeprecationWarning,
        )
        response = legacy[1]
    elif legacy:
        raise InvalidRequestError(
            f"walk_chunks takes one response and keyword arguments, got {1 + len(legacy)} positional arguments: "
            "walk_chunks(response, inputs={...}, outputs={...})"
        )
    if not isinstance(response, ArrayResponse):
        raise InvalidRequestError(
            f"walk_chunks walks an ArrayResponse (what `await mgr.request(...)` returns), got {shown(response)}"
        )
    if response.device is None:
        raise InvalidRequestError(
            "walk_chunks walks a response a manager served (it copies with that manager's device); "
            "this one was built by hand"
        )
    _check_live(response)  # before the checks read its arrays: a released one holds none
    ins = _check(response, {} if inputs is None else inputs, "inputs")
    outs = _check(response, {} if outputs is None else outputs, "outputs")
    rotation = _depth(response, ins, outs, depth)
    if overlap is None:
        overlap = rotation > 1
    elif not isinstance(overlap, bool):
        raise InvalidRequestError(f"overlap must be True, False or None (by depth), got {shown(overlap)}")
    if response.chunks == 1 and _straight(response, ins, outs):
        # a batch stream's walk, walked here (one generator less a batch)
        one = _OneChunk(response, ins, outs)
        finished = False
        try:
            one.copy_in()
            if not overlap:  # serial: the data is on the device when the body runs
                await one.done()
            yield one.chunk()
            one.copy_out()
            await one.done()
            finished = True
        finally:
            if not finished:
                await _idle(one.device, one.loop, one.stream)
        return
    # closed with this generator, so that its cleanup runs when this one is closed
    async with contextlib.aclosing(_Walk(response, ins, outs, rotation, overlap).walk()) as chunks:
        async for chunk in chunks:
            yield chunk


async def walk_batches(
    response: ArrayResponse,
    batches: Iterable[_Batch] | AsyncIterable[_Batch],
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
    >>> from aiocubie import ArrayRequest, MemoryManager, SimulatorBackend, walk_batches
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
    if not isinstance(response, ArrayResponse) or response.device is None:
        raise InvalidRequestError(
            f"walk_batches walks an ArrayResponse a manager served (what `await mgr.request(...)` returns), "
            f"got {shown(response)}"
        )
    if response.chunks != 1:
        raise InvalidRequestError(
            f"walk_batches walks batches that fit whole, but this response is planned in {response.chunks} chunks: "
            "walk each batch with walk_chunks, or ask for a smaller batch"
        )
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
        raise InvalidRequestError(f"in_flight must be a positive integer, got {shown(in_flight)}")
    if isinstance(batches, (str, bytes, Mapping)) or not isinstance(batches, (Iterable, AsyncIterable)):
        raise InvalidRequestError(
            f"batches is an iterable of (inputs, outputs) pairs of mappings (or an async iterable of them), got {shown(batches)}"
        )
    # the next batch: next() of an iterator, or awaited from an async one
    items: Iterator[_Batch] = iter(batches) if isinstance(batches, Iterable) else iter(())
    pending = batches.__aiter__() if not isinstance(batches, Iterable) else None
    _check_live(response, "walk_batches")  # before the copiers read its arrays: a released one holds none
    device, stream, loop = response.device, response.stream, running_loop()
    # the copies into and out of each array, bound once
    copy_in = {label: device.copier(array, stream, to_device=True) for label, array in response.arrays.items()}
    copy_out = {label: device.copier(array, stream, to_device=False) for label, array in response.arrays.items()}
    # a batch's outputs in place, and its host arrays (a copy knows only their addresses), oldest first
    landed: collections.deque[tuple[Event, tuple[np.ndarray[Any, Any], ...]]] = collections.deque()
    unturned = 0  # batches since the walk last gave the event loop a turn
    finished = False
    try:
        index = -1
        while True:
            if pending is None:
                batch: Any = next(items, _END)
            else:
                try:
                    batch = await pending.__anext__()
                except StopAsyncIteration:
                    batch = _END
            if batch is _END:
                break
            index += 1
            if not (isinstance(batch, tuple) and len(batch) == 2):
                raise InvalidRequestError(
                    f"batch {index} of walk_batches is {shown(batch)}, not an (inputs, outputs) pair of mappings"
                )
            ins, outs = batch
            _check_live(response, "walk_batches")  # released while the batches before it were walked
            copies_in = _straight_copies(copy_in, ins)
            copies_out = None if copies_in is None else _straight_copies(copy_out, outs)
            if copies_in is None or copies_out is None:  # checked in full
                ins, outs = _check(response, ins, "inputs"), _check(response, outs, "outputs")
                if not _straight(response, ins, outs):  # staged or repacked: alone, once the others landed
                    while landed:
                        await loop.wait(landed[0][0])
                        landed.popleft()
                    walk = cast(
                        AsyncGenerator[Chunk, None], walk_chunks(response, inputs=ins, outputs=outs, overlap=True)
                    )
                    async with contextlib.aclosing(walk) as one:
                        async for chunk in one:
                            yield attrs.evolve(chunk, index=index)
                    continue
                # straight in rows the copy engines follow (copy_strided works them out)
                copies_in = [(label, copy_in[label].__call__, host) for label, host in ins.items()]
                copies_out = [(label, copy_out[label].__call__, host) for label, host in outs.items()]
            hosts = {**ins, **outs}
            for label, copy, ready in copies_in:
                copy(ready, ("in", index, label))
            yield Chunk(index, 0, response.runs, response._device_view(), MappingProxyType(hosts), stream)
            _check_live(response, "walk_batches")
            for label, copy, ready in copies_out:
                copy(ready, ("out", index, label))
            landed.append((device.record_event(stream), (*ins.values(), *outs.values())))
            if len(landed) >= in_flight:  # before the next batch is read: it may refill the arrays that land here
                if not landed[0][0].query():  # landed already: no trip through the loop
                    await loop.wait(landed[0][0])
                    unturned = 0
                landed.popleft()
            unturned += 1
            if unturned > in_flight:  # the device keeps ahead: the loop gets a turn all the same
                await loop.checkpoint()
                unturned = 0
        while landed:
            await loop.wait(landed[0][0])
            landed.popleft()
        finished = True
    finally:
        if not finished:
            await _idle(device, loop, stream)


def _check(response: ArrayResponse, arrays: Any, role: str) -> dict[str, np.ndarray[Any, Any]]:
    """The host arrays of ``role`` checked against ``response``: every bad one is refused here,
    before anything is copied."""
    if type(arrays) is not dict and not isinstance(arrays, Mapping):
        raise InvalidRequestError(f"{role} must be a mapping of label -> full-size host array, got {shown(arrays)}")
    checked = {}
    expected = response._full_shapes()
    for label, host in arrays.items():
        if type(host) is np.ndarray:  # the common case: checked in a few comparisons
            try:
                shape, dtype = expected[label]
            except (KeyError, TypeError):  # no such label (or not a hashable one): said below
                pass
            else:
                if host.shape == shape and host.dtype == dtype and (role == "inputs" or host.flags.writeable):
                    checked[label] = host
                    continue
        if not isinstance(label, str) or label not in response.arrays:
            known = ", ".join(map(repr, response.arrays)) or "none"
            raise InvalidRequestError(
                f"{role}[{shown(label)}]: the response has no array {shown(label)} (it has {known})"
            )
        if role == "outputs" and not isinstance(host, np.ndarray):  # a copy of a list would be written, then lost
            raise InvalidRequestError(
                f"outputs[{label!r}] is a {type(host).__name__}: outputs are numpy arrays the walk writes into"
            )
        given = "" if isinstance(host, np.ndarray) else f"a {type(host).__name__}, read as "
        try:
            host = np.asarray(host)
        except (TypeError, ValueError) as exc:  # ragged lists, objects numpy cannot read
            raise InvalidRequestError(f"{role}[{label!r}] is not an array numpy can read: {exc}") from None
        full, dtype = expected[label]
        if host.shape != full or host.dtype != dtype:
            raise InvalidRequestError(
                f"{role}[{label!r}] is {given}{shown(host.shape)} {host.dtype}, but the request was for "
                f"{full} {dtype}: pass the full-size (unchunked) host array"
                + (f" as a numpy array (np.asarray(x, dtype=np.{dtype.name}))" if given else "")
            )
        if role == "outputs" and not host.flags.writeable:
            raise InvalidRequestError(
                f"outputs[{label!r}] is read-only: the walk copies each chunk's results into it; "
                "pass a writable array (np.empty_like(x), or x.copy())"
            )
        checked[label] = host
    device = response.device
    if device is not None:  # a released response's host array: packed on the host, so no copy would refuse it
        for host in checked.values():
            device.check_host(host)
    return checked


def _trim(array: Any, axis: int | None, length: int) -> Any:
    """``array`` cut to ``length`` along ``axis`` (a view; numpy and numba device arrays both slice)."""
    if axis is None or array.shape[axis] == length:
        return array
    return array[(slice(None),) * axis + (slice(0, length),)]


def walk_requests(
    requests: Mapping[str, ArrayRequest],
    depth: int = DEFAULT_DEPTH,
    *,
    labels: Iterable[str] | None = None,
) -> dict[str, ArrayRequest]:
    """``requests`` made ready for a walk of ``depth``: ``depth`` chunk buffers per chunkable array.

    The plan then budgets every buffer (a batch that fits whole still gets one of each), and
    :func:`walk_chunks` rotates through them, overlapping copies with the body's work.

    Parameters
    ----------
    requests : mapping
        Label -> :class:`ArrayRequest`, as for ``mgr.request``.
    depth : int
        Chunk buffers per array (1: the serial walk, no extra memory).
    labels : iterable of str, optional
        Only these arrays (the walk's chunked inputs and outputs); default: every chunkable
        array. Scratch arrays that only the body touches need one buffer.

    Returns
    -------
    dict
        The same requests, chunkable ones with ``buffers=depth``.

    Raises
    ------
    InvalidRequestError
        If ``requests`` is not a mapping of string labels to ArrayRequests, ``depth`` is not a
        positive integer, or ``labels`` is not a collection of labels of ``requests``.

    Examples
    --------
    >>> reqs = walk_requests({"x": ArrayRequest((8, 1000), "f4", chunk_axis=1)}, depth=3)
    >>> reqs["x"].buffers
    3
    """
    if not isinstance(requests, Mapping):
        raise InvalidRequestError(
            f"walk_requests takes a mapping of label -> ArrayRequest, got {shown(requests)}: "
            'walk_requests({"x": ArrayRequest(shape, dtype)}, depth)'
        )
    bad = {label: request for label, request in requests.items() if not isinstance(request, ArrayRequest)}
    if bad:
        label, request = next(iter(bad.items()))
        raise InvalidRequestError(
            f"request {shown(label)} is {shown(request)}, not an ArrayRequest: "
            f"use ArrayRequest(shape, dtype) or ArrayRequest.like(array)"
        )
    names = [label for label in requests if not isinstance(label, str)]
    if names:
        raise InvalidRequestError(f"labels are strings, got {', '.join(map(shown, names))}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise InvalidRequestError(f"depth must be a positive integer (1: serial), got {depth!r}")
    if labels is not None and (isinstance(labels, str) or not isinstance(labels, Iterable)):
        raise InvalidRequestError(
            f"labels is a list of labels, got {shown(labels)}"
            + (f": labels=[{labels!r}] for one" if isinstance(labels, str) else "")
        )
    if labels is not None:
        labels = list(labels)
        for label in labels:
            if not isinstance(label, str):
                raise InvalidRequestError(
                    f"labels holds {shown(label)}, which is not a label: labels is a flat list of the "
                    f"requests' labels, e.g. labels={list(requests)[:2]!r}"
                )
    chosen = set(requests) if labels is None else set(labels)
    unknown = chosen - set(requests)
    if unknown:
        raise InvalidRequestError(
            f"labels {sorted(unknown)} are not among the requests ({', '.join(map(repr, requests))})"
        )
    return {
        label: attrs.evolve(request, buffers=depth) if label in chosen and not request.unchunkable else request
        for label, request in requests.items()
    }


def _depth(
    response: ArrayResponse,
    ins: Mapping[str, Any],
    outs: Mapping[str, Any],
    depth: int | None,
) -> int:
    """The depth a walk runs at: what was asked (or what the buffers allow), at most the chunks."""
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise InvalidRequestError(f"depth must be a positive integer (1: serial), got {depth!r}")
    if response.chunks <= 1:
        return 1
    chunked = [label for label in (*ins, *outs) if response.chunk_axes[label] is not None]
    if depth is None:
        depth = min((response.buffer_count(label) for label in chunked), default=1)
    depth = min(depth, response.chunks)
    short = [label for label in chunked if response.buffer_count(label) < depth]
    if depth > 1 and short:
        raise InvalidRequestError(
            f"a walk of depth {depth} needs {depth} chunk buffers of each chunked input and output, "
            f"but {', '.join(f'{label!r} has {response.buffer_count(label)}' for label in short)}: "
            f"request them with walk_requests(requests, depth={depth}) (or ArrayRequest(buffers={depth})), "
            "or walk at a smaller depth"
        )
    return depth


#: The two copy streams (in, out) of each group stream, made on first use and kept while it lives.
_copy_streams: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()
#: The same for streams that cannot be weakly referenced (cuda.core's): id -> (the stream, held so
#: that its id names it, and its copy streams), the most recent few.
_held_copy_streams: dict[int, tuple[Any, tuple[Any, Any]]] = {}
_MAX_HELD = 16


def _copy_streams_of(device: Device, stream: StreamLike) -> tuple[StreamLike, StreamLike]:
    try:
        found = _copy_streams.get(stream)
    except TypeError:  # no weak reference to it: by identity, the stream held
        held = _held_copy_streams.get(id(stream))
        if held is not None and held[0] is stream:
            return held[1]
        found = (device.create_stream(), device.create_stream())
        if len(_held_copy_streams) >= _MAX_HELD:
            del _held_copy_streams[next(iter(_held_copy_streams))]  # the oldest
        _held_copy_streams[id(stream)] = (stream, found)
        return found
    if found is None:
        found = _copy_streams[stream] = (device.create_stream(), device.create_stream())
    return found


def _length(response: ArrayResponse, index: int) -> int:
    start, stop = response.chunk_bounds(index)
    return stop - start


def _view(buffer: np.ndarray[Any, Any], like: Any) -> np.ndarray[Any, Any]:
    """The first bytes of pool ``buffer`` as a C-contiguous array shaped and typed like ``like``."""
    dtype = np.dtype(like.dtype)
    view: np.ndarray[Any, Any] = buffer[: math.prod(like.shape) * dtype.itemsize].view(dtype).reshape(like.shape)
    return view


class _Walk:
    """One walk: its streams, events, staging buffers and the order between them.

    At depth 1 every copy is awaited before the walk goes on (the serial walk). Deeper,

    chunk ``i`` uses buffer set ``k = i % depth``. Its copy in (on the in-stream) waits for
    the body of chunk ``i - depth`` (the last user of set ``k``) and, for arrays that are both
    input and output, for that chunk's copy out; the body of chunk ``i`` (on the group's
    stream) waits for its copy in and for the copy out of chunk ``i - depth``; its copy out
    (on the out-stream) waits for its body. Staging buffers rotate the same way. A walk of one
    chunk copies on the group's stream itself: stream order does what the events would.
    """

    def __init__(
        self,
        response: ArrayResponse,
        ins: dict[str, np.ndarray[Any, Any]],
        outs: dict[str, np.ndarray[Any, Any]],
        depth: int,
        overlap: bool,
    ) -> None:
        self.response, self.depth, self.overlap = response, depth, overlap
        self.device = device = response.device
        self.ins, self.outs = ins, outs
        self.stream = stream = response.stream
        # one chunk: nothing of the walk's own to overlap; its copies queue on the group's stream
        self.cin, self.cout = (stream, stream) if response.chunks == 1 else _copy_streams_of(device, stream)
        axes = response.chunk_axes
        self.chunked_in = [label for label in ins if axes[label] is not None]
        self.chunked_out = [label for label in outs if axes[label] is not None]
        self.in_place = bool(set(self.chunked_in) & set(self.chunked_out))
        self.pinned = {label: device.is_pinned(array) for label, array in {**ins, **outs}.items()}
        self.loop = running_loop()
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
        response, device, depth = self.response, self.device, self.depth
        axes = response.chunk_axes
        whole_in = [label for label in self.ins if axes[label] is None]
        finished = False
        response.lease.walk_started()  # a release while it walks frees the blocks once it has ended
        try:
            _check_live(self.response)
            ready = response.ready  # the allocation: a copy stream waits for it (an ordered request)
            if ready is not None and self.cin is not self.stream and not ready.query():
                device.wait_event(self.cin, ready)
            if whole_in:
                await self._copy_whole(
                    [np.ascontiguousarray(self.ins[label]) for label in whole_in],
                    [response.arrays[label] for label in whole_in],
                )
            issued = 0
            for index in range(response.chunks):
                _check_live(self.response)
                while issued < min(response.chunks, index + depth):
                    await self._copy_in(issued)
                    issued += 1
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
                yield self._chunk(index)
                _check_live(self.response)
                if self.cout is not self.stream:
                    self.body_done[index] = device.record_event(self.stream)
                await self._copy_out(index)
                if not self.overlap:
                    await self._settle(up_to=index)
                for events in (self.in_done, self.body_done, self.out_done):
                    events.pop(index - depth - 1, None)
            await self._settle(up_to=response.chunks)
            whole_out = [label for label in self.outs if axes[label] is None]
            if whole_out:
                buffers = [np.empty_like(self.outs[label], order="C") for label in whole_out]
                await self._copy_whole([response.arrays[label] for label in whole_out], buffers)
                for label, buffer in zip(whole_out, buffers):
                    self.outs[label][...] = buffer
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

    async def _copy_whole(self, sources: list[Any], targets: list[Any]) -> None:
        """Copy the unchunked arrays on the group's stream and wait until they are done."""
        for source, target in zip(sources, targets):
            self.device.copy(source, target, self.stream)
        await self.loop.wait(self.device.record_event(self.stream))

    def _chunk(self, index: int) -> Chunk:
        response = self.response
        start, stop = response.chunk_bounds(index)
        axes, slot = response.chunk_axes, index % self.depth
        device = {label: _trim(response.buffer(label, slot), axes[label], stop - start) for label in response.arrays}
        host = {label: array[response.chunk_slices(index, label)] for label, array in {**self.ins, **self.outs}.items()}
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
            _check_live(self.response)  # a reset or release while it packed
        length = _length(response, index)
        for label in self.chunked_in:
            target, host, direct = self._ends(self.ins, label, index, length)
            source = host if direct else _view(self.slots_in[index % depth][label], target)
            device.copy_strided(source, target, cin, tag=("in", index, label))
        if cin is self.stream and self.overlap:  # one chunk on the group's stream: nothing waits for its copy in
            return
        event = self.in_done[index] = device.record_event(cin)
        if index + depth < response.chunks:  # its buffers are free again once this copy is done
            self._pack(index + depth, after=event)

    def _pack(self, index: int, after: Event | None = None) -> None:
        """Start packing chunk ``index``'s pageable inputs into its staging buffers on host threads."""
        length = _length(self.response, index)
        copies = []
        for label in self.chunked_in:
            target, host, direct = self._ends(self.ins, label, index, length)
            if not direct:
                buffer, _ = self._staging(self.slots_in, index, label, self.response.buffer(label, 0).nbytes)
                copies.append((_view(buffer, target), host))
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
        trimmed = _trim(response.buffer(label, index % self.depth), axis, length)
        host = hosts[label][response.chunk_slices(index, label)]
        direct = self.pinned[label] and geometry(host.shape, host.itemsize, host.strides, trimmed.strides) is not None
        return trimmed, host, direct

    async def _copy_out(self, index: int) -> None:
        response, device, depth, cout = self.response, self.device, self.depth, self.cout
        if cout is not self.stream:
            device.wait_event(cout, self.body_done[index])
        length = _length(response, index)
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
                target = _view(buffer, source)
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
            if isinstance(done, Staging):
                done.result()

    async def _quiesce(self) -> None:
        """Wait, shielded from cancellation, until every stream and staging copy of the walk is idle."""
        with anyio.CancelScope(shield=True):
            for stream in (self.cin, self.cout, self.stream):
                await _idle(self.device, self.loop, stream)
            # host copies still under way write the staging buffers and the host arrays
            for staged in (*self.packs.values(), *self.landed.values()):
                await self.loop.wait(staged)


def _check_live(response: ArrayResponse, walk: str = "walk_chunks") -> None:
    if response.lease.released:  # the set itself: a walk checks it at every chunk
        released = response.released
        raise ReleasedError(
            f"{walk}: the response's arrays {sorted(released)} were released (mgr.release, free, "
            "free_all, the end of its `async with`, its manager's exit, or a context reset): walk inside "
            "the `async with mgr.request(...)` block, or before releasing the response"
        )


async def _idle(device: Device, loop: Loop, stream: Any) -> None:
    """Wait, shielded from cancellation, until ``stream`` has done what a walk queued on it."""
    with anyio.CancelScope(shield=True):
        try:
            event = device.record_event(stream)
        except AiocubieError:  # cannot record (a closed stream): wait for it on a thread
            # the staging buffers go back to the pool after this: copies queued
            # before the error still read and write them (issue 22, item 3)
            synchronize = getattr(stream, "synchronize", None) or getattr(stream, "sync", None)
            if synchronize is not None:
                await anyio.to_thread.run_sync(synchronize)
            return
        await loop.wait(event)


def _straight(
    response: ArrayResponse, ins: dict[str, np.ndarray[Any, Any]], outs: dict[str, np.ndarray[Any, Any]]
) -> bool:
    """Whether every host array of a one-chunk walk goes straight to or from its device array:
    pinned, of the device array's shape, in rows the copy engines can follow."""
    device, arrays = response.device, response.arrays
    for hosts in (ins, outs):
        for label, host in hosts.items():
            target = arrays[label]
            if host.shape != target.shape or not device.is_pinned(host):
                return False
            if host.flags.c_contiguous and _c_contiguous(target):
                continue  # one block each side (a batch stream's arrays): no geometry to work out
            if geometry(host.shape, host.itemsize, host.strides, target.strides) is None:
                return False
    return True


def _c_contiguous(array: Any) -> bool:
    """Whether a device array (CuPy, numba, numpy) says it is C-contiguous."""
    flags = getattr(array, "flags", None)
    if flags is None:
        return False
    try:
        return bool(flags.c_contiguous)
    except AttributeError:  # numba's flags are a dict
        return bool(flags["C_CONTIGUOUS"])


def _straight_copies(copiers: dict[str, Copier], hosts: Any) -> list[tuple[str, Any, Any]] | None:
    """(label, queue, ready) for each host array of ``hosts``, if every one goes straight (see
    :meth:`Copier.straight`); None if any does not, or ``hosts`` is not a dict of known labels."""
    if type(hosts) is not dict:
        return None
    copies = []
    for label, host in hosts.items():
        copier = copiers.get(label)
        if copier is None:
            return None
        ready = copier.straight(host)
        if ready is None:
            return None
        copies.append((label, copier.queue, ready))
    return copies


class _OneChunk:
    """The walk of a one-chunk batch whose host arrays all go straight (see :func:`_straight`).

    Every copy is queued on the group's stream, in order with the body's work, so stream order
    does what the rotation's copy streams, events and staging buffers do for longer walks; the
    host waits only where the walk must (the copy in of a serial walk, the outputs landed).
    """

    def __init__(
        self, response: ArrayResponse, ins: dict[str, np.ndarray[Any, Any]], outs: dict[str, np.ndarray[Any, Any]]
    ) -> None:
        self.response, self.ins, self.outs = response, ins, outs
        self.device, self.stream = response.device, response.stream
        self.loop = running_loop()

    def copy_in(self) -> None:
        _check_live(self.response)
        arrays, device, stream = self.response.arrays, self.device, self.stream
        for label, host in self.ins.items():
            device.copy_strided(host, arrays[label], stream, tag=("in", 0, label))

    def chunk(self) -> Chunk:
        response = self.response
        return Chunk(
            0, 0, response.runs, response._device_view(), MappingProxyType({**self.ins, **self.outs}), self.stream
        )

    def copy_out(self) -> None:
        _check_live(self.response)
        arrays, device, stream = self.response.arrays, self.device, self.stream
        for label, host in self.outs.items():
            device.copy_strided(arrays[label], host, stream, tag=("out", 0, label))

    async def done(self) -> None:
        """Wait until what is queued on the group's stream so far is done."""
        await self.loop.wait(self.device.record_event(self.stream))
