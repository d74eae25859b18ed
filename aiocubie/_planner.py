"""The coordinated chunk planner: one plan along the run axis for a whole batch.

Pure: no numba.cuda, no event loop, no I/O. Only VRAM kinds (device, managed) count against
the bytes offered; host kinds are chunked in lockstep but cost no VRAM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from ._errors import InsufficientMemoryError, UnchunkableTooLargeError, warn
from ._requests import ArrayRequest, run_length

__all__ = ["ChunkPlan", "chunk_axis_hint", "offered_bytes", "plan_batch", "plan_chunks"]

# What "offered" means, for error messages (a group's cap is more than it is offered).
_OFFER = "what the group may use now, less the headroom and the allocator's granule"

#: What frees room in passive mode, where a group may use all the free memory.
_PASSIVE_REMEDY = (
    "release arrays (this manager's, or other programs' on the device) or raise memory_limit if one is set"
)

#: Above this many times the free memory, a planned batch draws a warning (as cubie does).
OVERSUBSCRIPTION_WARNING = 20
#: A chunk axis this many times shorter than another axis of its array is likely the wrong one.
AXIS_HINT_RATIO = 8


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
        If not even one run fits beside the unchunkable arrays (with a hint where a chunk axis
        looks wrong, see :func:`chunk_axis_hint`).

    Warns
    -----
    AiocubieWarning
        If the batch is planned and asks for more than 20 times ``free`` (never before an error).
    """
    items = [(label, req) for requests in batch.values() for label, req in requests.items()]
    runs = run_length(items)
    vram = [req for _, req in items if req.uses_vram]
    fixed = sum(req.fixed_bytes for req in vram)
    per_run = sum(req.bytes_per_run for req in vram)
    buffered = sum(req.bytes_per_run * req.buffers for req in vram)
    plan = plan_chunks(runs, fixed, per_run, offered, buffered=buffered, hint=lambda: chunk_axis_hint(items))
    if free is not None:
        warn_if_oversubscribed(plan, free)
    return plan


def warn_if_oversubscribed(plan: ChunkPlan, free: int) -> None:
    """Warn (at the caller's line) when a planned batch asks for over 20x the ``free`` bytes."""
    if plan.full_bytes > OVERSUBSCRIPTION_WARNING * max(free, 1):
        warn(
            f"the batch asks for {plan.full_bytes} bytes, more than {OVERSUBSCRIPTION_WARNING}x the "
            f"{free} bytes free: it is walked in {plan.chunks} chunks of {plan.chunk_length} runs"
        )


def chunk_axis_hint(items: Iterable[tuple[str, ArrayRequest]]) -> str:
    """A hint for "not even one run fits" when an array's chunk axis looks like the wrong one.

    An array whose chunk axis (0 by default) is :data:`AXIS_HINT_RATIO` times shorter than
    another of its axes probably has its runs along that other axis. Returns "" if none does.
    """
    for label, request in items:
        if request.runs is None or request.runs < 2 or not request.uses_vram:  # 0 or 1 run: not chunked
            continue
        axis, shape = request.chunk_axis, request.shape
        longest = max((a for a in range(len(shape)) if a != axis), key=lambda a: shape[a], default=None)
        if longest is not None and shape[longest] >= AXIS_HINT_RATIO * max(shape[axis], 1):
            return (
                f". {label!r} (shape {shape}) is chunked along axis {axis}, of {shape[axis]} runs, while "
                f"axis {longest} has {shape[longest]}: if its runs lie along axis {longest}, pass "
                f"chunk_axis={longest}"
            )
    return ""


def plan_chunks(
    runs: int,
    fixed: int,
    per_run: int,
    offered: int,
    *,
    buffered: int | None = None,
    hint: Callable[[], str] | None = None,
    passive: bool = False,
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
    hint : callable, optional
        Called for a sentence that ends the "not even one run fits" error (see
        :func:`chunk_axis_hint`); only then, so a plan that fits pays nothing for it.
    passive : bool
        Planned in passive mode (free memory, no proportions): the errors' remedies say so.
    """
    if offered < 0:
        raise ValueError(f"offered must be >= 0 bytes, got {offered}")
    full = fixed + per_run * runs
    if full <= offered:
        return ChunkPlan(runs, 1, runs, offered, full, full)
    remedy = _PASSIVE_REMEDY if passive else "free memory or raise the group's proportion"
    if fixed > offered:
        raise UnchunkableTooLargeError(
            f"the unchunkable arrays of the batch need {fixed} bytes but only {offered} are "
            f"offered ({_OFFER}): {remedy}, or make them chunkable"
        )
    step = per_run if buffered is None else max(buffered, per_run)
    max_chunk = (offered - fixed) // step
    if max_chunk < 1:
        extra = f" ({step // max(per_run, 1)} chunk buffers each)" if step > per_run else ""
        raise InsufficientMemoryError(
            f"not even one run fits: one run needs {step} bytes{extra} beside {fixed} unchunkable, "
            f"and {offered} are offered ({_OFFER}); {remedy}"
            + (", or ask for fewer buffers (a shallower walk)" if extra else "")
            + (hint() if hint is not None else "")
        )
    chunks = -(-runs // max_chunk)
    chunk_length = -(-runs // chunks)
    return ChunkPlan(runs, chunks, chunk_length, offered, fixed + step * chunk_length, full)
