"""What a stream is to aiocubie: the ``__cuda_stream__`` protocol (cuda.core's ``IsStreamT``).

Typing only: it must not import a device library, so the device and resource protocols can share it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["StreamLike"]


@runtime_checkable
class StreamLike(Protocol):
    """A stream: anything with ``__cuda_stream__`` (cuda.core's ``IsStreamT``), the simulator's too."""

    def __cuda_stream__(self) -> tuple[int, int]: ...
