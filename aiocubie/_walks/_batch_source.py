"""The batches of a batch stream: the arguments of :func:`walk_batches` checked, and each batch read in turn."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from .._errors import InvalidRequestError, shown

__all__ = ["END", "Batch", "BatchSource", "not_a_pair"]

#: One batch of :func:`walk_batches`: its inputs and outputs, label -> host array.
Batch = tuple[Mapping[str, np.ndarray[Any, Any]], Mapping[str, np.ndarray[Any, Any]]]
#: What :class:`BatchSource` reads once no batch is left.
END: Any = object()


class BatchSource:
    """The batches of one :func:`walk_batches`, read lazily: ``next(items, END)`` of an iterable's
    iterator (``sync``), or :meth:`take_async` from an async one.

    Parameters
    ----------
    batches : object
        An iterable or async iterable of (inputs, outputs) pairs; refused otherwise.
    in_flight : object
        The batches kept in flight: refused unless a positive integer.
    """

    __slots__ = ("items", "pending", "sync")

    def __init__(self, batches: Any, in_flight: Any) -> None:
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
            raise InvalidRequestError(f"in_flight must be a positive integer, got {shown(in_flight)}")
        if isinstance(batches, (str, bytes, Mapping)) or not isinstance(batches, (Iterable, AsyncIterable)):
            raise InvalidRequestError(
                "batches is an iterable of (inputs, outputs) pairs of mappings (or an async iterable of them), "
                f"got {shown(batches)}"
            )
        #: Whether the batches are read with ``next(items, END)`` (else :meth:`take_async`).
        self.sync = isinstance(batches, Iterable)
        self.items: Iterator[Batch] = iter(batches) if isinstance(batches, Iterable) else iter(())
        self.pending: AsyncIterator[Batch] | None = None if isinstance(batches, Iterable) else batches.__aiter__()

    async def take_async(self) -> Any:
        """The next batch of an async iterable (awaited), or :data:`END`."""
        assert self.pending is not None
        try:
            return await self.pending.__anext__()
        except StopAsyncIteration:
            return END


def not_a_pair(batch: Any, index: int) -> InvalidRequestError:
    """The error for batch ``index`` that is not an (inputs, outputs) pair."""
    return InvalidRequestError(
        f"batch {index} of walk_batches is {shown(batch)}, not an (inputs, outputs) pair of mappings"
    )
