"""The two copy streams (in, out) a walk of several chunks overlaps its copies on."""

from __future__ import annotations

import weakref
from typing import Any

from .._backends import Device

__all__ = ["copy_streams_of"]

#: The two copy streams (in, out) of each group stream, made on first use and kept while it lives.
_copy_streams: weakref.WeakKeyDictionary[Any, tuple[Any, Any]] = weakref.WeakKeyDictionary()
#: The same for streams that cannot be weakly referenced (cuda.core's): id -> (the stream, held so
#: that its id names it, and its copy streams), the most recent few.
_held_copy_streams: dict[int, tuple[Any, tuple[Any, Any]]] = {}
_MAX_HELD = 16


def copy_streams_of(device: Device, stream: Any) -> tuple[Any, Any]:
    """The (in, out) copy streams of ``stream``, made with ``device`` on first use."""
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
