"""The batches of a batch stream: the arguments of :func:`walk_batches` checked, and each batch read in turn."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from .._errors import InvalidRequestError, shown

__all__ = ["END", "Batch", "BatchSource", "pair_of"]

#: One batch of :func:`walk_batches`: its inputs and outputs, label -> host array.
Batch = tuple[Mapping[str, np.ndarray[Any, Any]], Mapping[str, np.ndarray[Any, Any]]]
#: What :class:`BatchSource` reads once no batch is left.
END: Any = object()


class BatchSource:
    """The batches of one :func:`walk_batches`, read lazily: ``next()`` of an iterator, or awaited from an async one.

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
        #: Whether :meth:`take` reads the next batch (else :meth:`take_async`).
        self.sync = isinstance(batches, Iterable)
        self.items: Iterator[Batch] = iter(batches) if isinstance(batches, Iterable) else iter(())
        self.pending: AsyncIterator[Batch] | None = None if isinstance(batches, Iterable) else batches.__aiter__()

    def take(self) -> Any:
        """The next batch of an iterable, or :data:`END`."""
        return next(self.items, END)

    async def take_async(self) -> Any:
        """The next batch of an async iterable (awaited), or :data:`END`."""
        assert self.pending is not None
        try:
            return await self.pending.__anext__()
        except StopAsyncIteration:
            return END


def pair_of(batch: Any, index: int) -> Batch:
    """Batch ``index`` as its (inputs, outputs) pair, refused if it is not a pair."""
    if not (isinstance(batch, tuple) and len(batch) == 2):
        raise InvalidRequestError(
            f"batch {index} of walk_batches is {shown(batch)}, not an (inputs, outputs) pair of mappings"
        )
    return batch
