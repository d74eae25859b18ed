"""numba streams as raw handles and as CuPy streams; the lazy CuPy import.

It owns no stream: views made here never keep a numba stream alive or destroy it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from numba.cuda.cudadrv import driver as nbdriver

from ..._errors import ConfigurationError, UnknownAllocatorError
from .._base import CUPY_EXTRA_HINT

__all__ = ["cupy_view", "current_cupy_stream", "import_cupy", "stream_ptr"]


def import_cupy(error: type[ConfigurationError] = UnknownAllocatorError) -> Any:
    """``cupy``, or ``error`` naming the extra to install."""
    try:
        import cupy
    except ImportError as exc:
        raise error(f"CuPy is not importable ({exc}): {CUPY_EXTRA_HINT}") from exc
    return cupy


def stream_ptr(stream: Any) -> int:
    """The raw CUstream of a numba stream, or 0 for the default stream."""
    return int(stream.handle) if isinstance(stream, nbdriver.Stream) else int(stream)


class _StreamPointer:
    """A bare CUDA-stream-protocol object: lets CuPy view a stream without keeping it alive."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def cupy_view(cupy: Any, stream: Any) -> Any:
    """A CuPy stream for a numba stream (or 0); it does not own the stream."""
    ptr = stream_ptr(stream)
    if not ptr:
        return cupy.cuda.Stream.null
    from_external = getattr(cupy.cuda.Stream, "from_external", None)  # CuPy 14 deprecates ExternalStream
    return from_external(_StreamPointer(ptr)) if from_external else cupy.cuda.ExternalStream(ptr)


@contextlib.contextmanager
def current_cupy_stream(stream: Any) -> Iterator[Any]:
    """Make a numba stream CuPy's current stream for the block.

    CuPy work in the block (kernels, copies, ``MemoryAsyncPool`` allocations) is then ordered
    on ``stream``, and CuPy arrays report it in their ``__cuda_array_interface__``.

    Parameters
    ----------
    stream : numba.cuda.cudadrv.driver.Stream or 0
        The stream to bind; 0 binds the default stream.

    Yields
    ------
    cupy.cuda.Stream
        The CuPy view of ``stream``; it does not own the stream.
    """
    with cupy_view(import_cupy(), stream) as cupy_stream:
        yield cupy_stream
