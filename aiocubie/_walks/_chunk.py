"""A chunk of a walk, and the arithmetic of cutting a chunk out of an array."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from .._protocols import StreamLike
from .._requests import ArrayResponse

__all__ = ["Chunk", "runs_in", "trim", "view"]


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
    stream: StreamLike | None = None

    @property
    def length(self) -> int:
        """Runs in this chunk: ``stop - start``."""
        return self.stop - self.start


def runs_in(response: ArrayResponse, index: int) -> int:
    """Runs in chunk ``index`` of ``response``'s plan."""
    start, stop = response.chunk_bounds(index)
    return stop - start


def trim(array: Any, axis: int | None, length: int) -> Any:
    """``array`` cut to ``length`` along ``axis`` (a view; numpy and numba device arrays both slice)."""
    if axis is None or array.shape[axis] == length:
        return array
    return array[(slice(None),) * axis + (slice(0, length),)]


def view(buffer: np.ndarray[Any, Any], like: Any) -> np.ndarray[Any, Any]:
    """The first bytes of pool ``buffer`` as a C-contiguous array shaped and typed like ``like``."""
    dtype = np.dtype(like.dtype)
    found: np.ndarray[Any, Any] = buffer[: math.prod(like.shape) * dtype.itemsize].view(dtype).reshape(like.shape)
    return found
