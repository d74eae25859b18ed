"""Walk a response chunk by chunk: copy each chunk's inputs in and its outputs out.

It does the index arithmetic of the chunk plan for the user and moves data only through
``mgr.to_device`` / ``mgr.from_device`` (so any backend works); it never launches kernels.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from ._errors import InvalidRequestError, shown
from ._requests import ArrayResponse

if TYPE_CHECKING:
    from ._manager import MemoryManager

__all__ = ["Chunk", "walk_chunks"]


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
        output's, for a label that is both an input and an output).
    """

    index: int
    start: int
    stop: int
    device: Mapping[str, Any]
    host: Mapping[str, np.ndarray[Any, Any]]

    @property
    def length(self) -> int:
        """Runs in this chunk: ``stop - start``."""
        return self.stop - self.start


async def walk_chunks(
    mgr: MemoryManager,
    instance: object,
    response: ArrayResponse,
    *,
    inputs: Mapping[str, np.ndarray[Any, Any]] | None = None,
    outputs: Mapping[str, np.ndarray[Any, Any]] | None = None,
) -> AsyncIterator[Chunk]:
    """Yield the chunks of ``response`` with their data in place.

    Before each chunk is yielded, the chunk's slice of every input host array is copied to
    its device array; after the loop body, every output device array is copied back into its
    slice of the host array. Unchunkable inputs are copied once before the first chunk and
    unchunkable outputs once after the last. Copies run on ``instance``'s stream and are
    awaited, so the body can launch kernels on the same stream at once.

    Parameters
    ----------
    mgr : MemoryManager
        The running manager that served ``response``.
    instance : object
        The registered instance that owns ``response`` (its stream is used).
    response : ArrayResponse
        What ``await mgr.request(instance, ...)`` returned.
    inputs, outputs : mapping, optional
        Label -> full-size (unchunked) host array of that label's request.

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

    Notes
    -----
    Leaving the loop early (``break``, an exception) skips the copy-out of that chunk and of
    the unchunkable outputs. Wrap the walk in ``contextlib.aclosing`` when you may break out
    of it, so it is closed at once.

    Examples
    --------
    >>> async with mgr.request(solver, requests) as response:      # doctest: +SKIP
    ...     async for chunk in walk_chunks(mgr, solver, response, inputs={"x": x}, outputs={"y": y}):
    ...         kernel[blocks, threads, response.stream](chunk.device["x"], chunk.device["y"])
    """
    if not isinstance(response, ArrayResponse):
        raise InvalidRequestError(
            f"walk_chunks walks an ArrayResponse (what `await mgr.request(...)` returns), got {shown(response)}"
        )
    ins = _check(response, {} if inputs is None else inputs, "inputs")
    outs = _check(response, {} if outputs is None else outputs, "outputs")
    axes = response.chunk_axes
    whole_in = [label for label in ins if axes[label] is None]
    if whole_in:
        await mgr.to_device(
            instance, [np.ascontiguousarray(ins[label]) for label in whole_in], [response.arrays[label] for label in whole_in]
        )
    for index in range(response.chunks):
        start, stop = response.chunk_bounds(index)
        length = stop - start
        device = {label: _trim(array, axes[label], length) for label, array in response.arrays.items()}
        host = {label: array[response.chunk_slices(index, label)] for label, array in {**ins, **outs}.items()}
        sources, targets = [], []
        for label in ins:
            axis = axes[label]
            if axis is not None:  # from the input's own slice: an output may share its label
                source, target = _copy_in_pair(ins[label][response.chunk_slices(index, label)], response.arrays[label], device[label], axis)
                sources.append(source)
                targets.append(target)
        if sources:
            await mgr.to_device(instance, sources, targets)
        yield Chunk(index, start, stop, MappingProxyType(device), MappingProxyType(host))
        chunked_out = [label for label in outs if axes[label] is not None]
        if chunked_out:
            staged = [_staging(response.arrays[label], device[label]) for label in chunked_out]
            await mgr.from_device(instance, [source for source, _ in staged], [buffer for _, buffer in staged])
            for label, (_, buffer) in zip(chunked_out, staged):
                host[label][...] = _trim(buffer, axes[label], length)
    whole_out = [label for label in outs if axes[label] is None]
    if whole_out:
        buffers = [np.empty_like(outs[label], order="C") for label in whole_out]
        await mgr.from_device(instance, [response.arrays[label] for label in whole_out], buffers)
        for label, buffer in zip(whole_out, buffers):
            outs[label][...] = buffer


def _check(response: ArrayResponse, arrays: Any, role: str) -> dict[str, np.ndarray[Any, Any]]:
    """The host arrays of ``role`` checked against ``response``: every bad one is refused here,
    before anything is copied."""
    if not isinstance(arrays, Mapping):
        raise InvalidRequestError(
            f"{role} must be a mapping of label -> full-size host array, got {shown(arrays)}"
        )
    checked = {}
    for label, host in arrays.items():
        if not isinstance(label, str) or label not in response.arrays:
            known = ", ".join(map(repr, response.arrays)) or "none"
            raise InvalidRequestError(f"{role}[{shown(label)}]: the response has no array {shown(label)} (it has {known})")
        if role == "outputs" and not isinstance(host, np.ndarray):  # a copy of a list would be written, then lost
            raise InvalidRequestError(
                f"outputs[{label!r}] is a {type(host).__name__}: outputs are numpy arrays the walk writes into"
            )
        try:
            host = np.asarray(host)
        except (TypeError, ValueError) as exc:  # ragged lists, objects numpy cannot read
            raise InvalidRequestError(f"{role}[{label!r}] is not an array numpy can read: {exc}") from None
        device = response.arrays[label]
        axis = response.chunk_axes[label]
        full = list(response.chunked_shapes[label])
        if axis is not None and full[axis]:  # an empty run axis stays empty whatever the batch's runs
            full[axis] = response.runs
        if host.shape != tuple(full) or host.dtype != device.dtype:
            raise InvalidRequestError(
                f"{role}[{label!r}] is {shown(host.shape)} {host.dtype}, but the request was for "
                f"{tuple(full)} {device.dtype}: pass the full-size (unchunked) host array"
            )
        if role == "outputs" and not host.flags.writeable:
            raise InvalidRequestError(
                f"outputs[{label!r}] is read-only: the walk copies each chunk's results into it; "
                "pass a writable array (np.empty_like(x), or x.copy())"
            )
        checked[label] = host
    return checked


def _trim(array: Any, axis: int | None, length: int) -> Any:
    """``array`` cut to ``length`` along ``axis`` (a view; numpy and numba device arrays both slice)."""
    if axis is None or array.shape[axis] == length:
        return array
    return array[(slice(None),) * axis + (slice(0, length),)]


def _copy_in_pair(host: np.ndarray[Any, Any], full: Any, trimmed: Any, axis: int) -> tuple[Any, Any]:
    """Source and target to copy a chunk's host slice into its device array.

    Device copies need contiguous arrays on both sides. A device array trimmed along any axis
    but the first is not contiguous: the host slice is then padded to the full device shape.
    """
    if trimmed is full or _contiguous(trimmed):
        return np.ascontiguousarray(host), trimmed
    padded = np.zeros(full.shape, full.dtype)
    _trim(padded, axis, host.shape[axis])[...] = host
    return padded, full


def _staging(full: Any, trimmed: Any) -> tuple[Any, np.ndarray[Any, Any]]:
    """Device source and contiguous host buffer to copy a chunk's output out through."""
    source = trimmed if trimmed is full or _contiguous(trimmed) else full
    return source, np.empty(source.shape, source.dtype)


def _contiguous(array: Any) -> bool:
    flags = array.flags  # numpy's flagsobj and numba's dict both take this key
    return bool(flags["C_CONTIGUOUS"])
