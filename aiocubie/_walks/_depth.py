"""How many chunk buffers a walk rotates through: asked for with the requests, checked at the walk."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .._errors import InvalidRequestError, shown
from .._requests import ArrayRequest, ArrayResponse

__all__ = ["DEFAULT_DEPTH", "depth_of", "walk_requests"]

#: Chunk buffers (pipeline depth) :func:`walk_requests` asks for by default: 2 overlaps the
#: next chunk's copy in and the last chunk's copy out with this chunk's work whenever inputs
#: and outputs are different arrays (docs/performance.md has the measurements).
DEFAULT_DEPTH = 2


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


def depth_of(
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
