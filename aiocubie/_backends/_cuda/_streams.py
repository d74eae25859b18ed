"""Streams as cuda.core sees them and as CuPy sees them; the lazy CuPy import.

It owns no stream: a view made here never keeps a stream alive or destroys it, and nothing here
imports CuPy before CuPy is asked for.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, cast

from cuda.core import Stream

from ..._errors import ConfigurationError, UnknownAllocatorError

__all__ = ["CUPY_EXTRA_HINT", "as_stream", "cupy_view", "current_cupy_stream", "import_cupy", "stream_handle"]

CUPY_EXTRA_HINT = (
    "install CuPy with the extra that matches your CUDA: pip install 'aiocubie[cuda12]' or 'aiocubie[cuda13]'"
)


def import_cupy(error: type[ConfigurationError] = UnknownAllocatorError) -> Any:
    """``cupy``, or ``error`` naming the extra to install."""
    try:
        import cupy
    except ImportError as exc:
        raise error(f"CuPy is not importable ({exc}): {CUPY_EXTRA_HINT}") from exc
    return cupy


def stream_handle(stream: Any) -> int:
    """The raw ``CUstream`` address of a cuda.core stream, any ``__cuda_stream__`` object, or 0/None (legacy default)."""
    if isinstance(stream, Stream):
        return int(stream.handle)
    if stream is None or (isinstance(stream, int) and not stream):
        return 0
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        return int(protocol()[1])
    raise TypeError(f"expected a stream (an object with __cuda_stream__, e.g. a cuda.core Stream), got {stream!r}")


def as_stream(stream: Any) -> Stream:
    """A cuda.core ``Stream`` for ``stream`` (itself when it is one; a view of a foreign one; the legacy default for None/0)."""
    if isinstance(stream, Stream):
        return stream
    return Stream.from_handle(stream_handle(stream))


class _StreamPointer:
    """A bare ``__cuda_stream__`` object: lets CuPy view a stream without keeping it alive."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


#: (stream handle, CuPy's current device) -> CuPy's view of that stream, made once: making one
#: costs about 6 us, a batch stream's every kernel launch. A view only names the handle, so one
#: kept past its stream is harmless, and a new stream at a reused address is named the same.
_views: dict[tuple[int, int], Any] = {}
_MAX_VIEWS = 256


def cupy_view(cupy: Any, stream: Any) -> Any:
    """A CuPy stream for ``stream`` (None or 0: the legacy default); it does not own the stream."""
    ptr = stream_handle(stream)
    if not ptr:
        return cupy.cuda.Stream.null
    key = (ptr, cupy.cuda.runtime.getDevice())
    view = _views.get(key)
    if view is None:
        if len(_views) >= _MAX_VIEWS:
            _views.clear()
        from_external = getattr(cupy.cuda.Stream, "from_external", None)  # CuPy 14 deprecates ExternalStream
        view = _views[key] = from_external(_StreamPointer(ptr)) if from_external else cupy.cuda.ExternalStream(ptr)
    return view


def current_cupy_stream(stream: Any) -> AbstractContextManager[Any]:
    """Make ``stream`` CuPy's current stream for the block.

    CuPy work in the block (kernels, copies, ``MemoryAsyncPool`` allocations) is then ordered on
    ``stream``, and CuPy arrays report it in their ``__cuda_array_interface__``.

    Parameters
    ----------
    stream : cuda.core Stream, any ``__cuda_stream__`` object, or 0
        The stream to bind; 0 binds the legacy default stream.

    Returns
    -------
    cupy.cuda.Stream
        CuPy's view of ``stream`` (a context manager that yields itself); it does not own the
        stream.
    """
    cupy = _cupy.get("cupy") or _cupy.setdefault("cupy", import_cupy())
    return cast(AbstractContextManager[Any], cupy_view(cupy, stream))


#: CuPy, once imported (an import statement costs a microsecond a kernel launch).
_cupy: dict[str, Any] = {}
