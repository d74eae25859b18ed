"""The coordinated chunk planner: one plan along the run axis for a whole batch.

Pure: no numba.cuda, no event loop, no I/O. Only VRAM kinds (device, managed) count against
the bytes offered; host kinds are chunked in lockstep but cost no VRAM.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from ._errors import InsufficientMemoryError, UnchunkableTooLargeError, warn
from ._requests import ArrayRequest, run_length

__all__ = ["ChunkPlan", "offered_bytes", "plan_batch", "plan_chunks"]

# What "offered" means, for error messages (a group's cap is more than it is offered).
_OFFER = "what the group may use now, less the headroom and the allocator's granule"

#: Above this many times the free memory, a request draws a warning (as cubie does).
OVERSUBSCRIPTION_WARNING = 20


class ChunkPlan(NamedTuple):
    """The chunk plan of one batch (a named tuple: built once per batch, cheaply).

    Attributes
    ----------
    runs : int
        Length of the run axis (0 when nothing is chunkable).
    chunks : int
        Number of chunks; the minimum for the bytes offered.
    chunk_length : int
        Runs per chunk, ``ceil(runs / chunks)``.
    offered : int
        Bytes the plan had to fit in.
    planned_bytes : int
        VRAM bytes the batch takes with this plan (never more than ``offered``).
    full_bytes : int
        VRAM bytes the batch would take unchunked.
    """

    runs: int
    chunks: int
    chunk_length: int
    offered: int
    planned_bytes: int
    full_bytes: int


def offered_bytes(available: int, free: int, *, headroom: float, granule: int) -> int:
    """Bytes a batch may use: ``min((1 - headroom) * available, free - granule)``, at least 0.

    Parameters
    ----------
    available : int
        What the group may use under the budget mode (free memory in passive mode; caps
        minus holdings in active mode).
    free : int
        Free device memory as the backend reports it.
    headroom : float
        Fraction of ``available`` kept back, in [0, 1).
    granule : int
        Bytes kept free for allocator rounding and fragmentation.
    """
    return max(0, min(math.floor((1.0 - headroom) * available), free - granule))


def plan_batch(
    batch: Mapping[Any, Mapping[str, ArrayRequest]],
    offered: int,
    *,
    free: int | None = None,
) -> ChunkPlan:
    """Plan one batch of requests from several instances so that it fits ``offered`` bytes.

    If the whole batch fits, the plan has one chunk. Otherwise the chunk count is the smallest
    whose chunks fit: ``max_chunk = (offered - unchunkable) // bytes_per_run`` runs,
    ``chunks = ceil(runs / max_chunk)``, ``chunk_length = ceil(runs / chunks)``. Integer
    arithmetic throughout, so a plan is never larger than its budget. A chunked plan budgets
    every chunk buffer an array asks for (``ArrayRequest(buffers=d)``, for a walk of depth
    ``d``): ``bytes_per_run`` then counts each array ``d`` times.

    Parameters
    ----------
    batch : mapping
        Instance key -> ``{label: ArrayRequest}``.
    offered : int
        Bytes the batch may take (see :func:`offered_bytes`).
    free : int, optional
        Free device memory, only for the 20x oversubscription warning.

    Raises
    ------
    RunLengthMismatchError
        If chunkable arrays disagree on the run length.
    UnchunkableTooLargeError
        If the unchunkable arrays alone exceed ``offered``.
    InsufficientMemoryError
        If not even one run fits beside the unchunkable arrays.

    Warns
    -----
    AiocubieWarning
        If the batch asks for more than 20 times ``free``.
    """
    items = [(label, req) for requests in batch.values() for label, req in requests.items()]
    runs = run_length(items)
    vram = [req for _, req in items if req.uses_vram]
    fixed = sum(req.fixed_bytes for req in vram)
    per_run = sum(req.bytes_per_run for req in vram)
    buffered = sum(req.bytes_per_run * req.buffers for req in vram)
    return plan_chunks(runs, fixed, per_run, offered, buffered=buffered, free=free)


def warn_if_oversubscribed(full: int, free: int) -> None:
    """Warn (at the caller's line) when a batch of ``full`` bytes is over 20x the ``free`` bytes."""
    if full > OVERSUBSCRIPTION_WARNING * max(free, 1):
        warn(
            f"the batch asks for {full} bytes, more than {OVERSUBSCRIPTION_WARNING}x the "
            f"{free} bytes free: it will be walked in many small chunks, if it can be planned at all"
        )


def plan_chunks(
    runs: int, fixed: int, per_run: int, offered: int, *, buffered: int | None = None, free: int | None = None
) -> ChunkPlan:
    """Plan a batch from its totals (see :func:`plan_batch`, which computes them).

    Parameters
    ----------
    runs : int
        The run length of the batch (0 when nothing is chunkable).
    fixed : int
        VRAM bytes of the unchunkable arrays.
    per_run : int
        VRAM bytes of one run of the chunkable arrays.
    offered : int
        Bytes the batch may take.
    buffered : int, optional
        VRAM bytes of one run with every chunk buffer (default ``per_run``): what a
        chunked plan budgets per run. When every chunkable array asks for ``d`` buffers
        (``buffered = d * per_run``), a chunked plan has more than ``d`` chunks, so all
        ``d`` buffers are used, and it is the plan with the fewest chunks that fits them.
    free : int, optional
        Free device memory, only for the 20x oversubscription warning.
    """
    if offered < 0:
        raise ValueError(f"offered must be >= 0 bytes, got {offered}")
    full = fixed + per_run * runs
    if free is not None:
        warn_if_oversubscribed(full, free)
    if full <= offered:
        return ChunkPlan(runs, 1, runs, offered, full, full)
    if fixed > offered:
        raise UnchunkableTooLargeError(
            f"the unchunkable arrays of the batch need {fixed} bytes but only {offered} are "
            f"offered ({_OFFER}): free memory, raise the group's proportion, or make them chunkable"
        )
    step = per_run if buffered is None else max(buffered, per_run)
    max_chunk = (offered - fixed) // step
    if max_chunk < 1:
        extra = f" ({step // max(per_run, 1)} chunk buffers each)" if step > per_run else ""
        raise InsufficientMemoryError(
            f"not even one run fits: one run needs {step} bytes{extra} beside {fixed} unchunkable, "
            f"and {offered} are offered ({_OFFER}); free memory or raise the group's proportion"
            + (", or ask for fewer buffers (a shallower walk)" if extra else "")
        )
    chunks = -(-runs // max_chunk)
    chunk_length = -(-runs // chunks)
    return ChunkPlan(runs, chunks, chunk_length, offered, fixed + step * chunk_length, full)
