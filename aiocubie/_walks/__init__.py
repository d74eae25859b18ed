"""Walks: a response's chunks (or a stream of batches) with their data copied in and out.

One copy path: every walk binds a :class:`~._transfer.Transfer` for its response and copies
through it, straight on the group's stream when the host arrays allow, else through the
copy-stream rotation (:mod:`._rotation`). Public names are re-exported from :mod:`aiocubie`.
"""

from ._batches import walk_batches
from ._chunk import Chunk
from ._chunks import walk_chunks
from ._depth import DEFAULT_DEPTH, walk_requests

__all__ = ["DEFAULT_DEPTH", "Chunk", "walk_batches", "walk_chunks", "walk_requests"]
