"""What a stream is to aiocubie: the ``__cuda_stream__`` protocol (cuda.core's ``IsStreamT``).

Defined in :mod:`aiocubie._protocols` (a response names its stream with it) and re-exported here
for the backends. Typing only: it must not import a device library.
"""

from __future__ import annotations

from .._protocols import StreamLike

__all__ = ["StreamLike"]
