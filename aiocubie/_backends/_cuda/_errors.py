"""Where CuPy's, numba's and the driver's errors become aiocubie's: one ``map_exceptions`` helper.

Every call into those libraries that can fail with their own error types runs inside it, so
users only ever catch AiocubieError subclasses; the original stays as ``__cause__``. It must
not swallow an error it does not recognise: those propagate unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

from cuda.bindings import driver as binding
from numba.cuda.cudadrv import driver as nbdriver
from numba.cuda.cudadrv.error import CudaDriverError

from ..._errors import AiocubieError, BackendError, OutOfMemoryError

__all__ = ["check", "is_oom", "map_exceptions"]

_OOM = binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
_CUDA_RT_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation, as CuPy's CUDARuntimeError.status


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error of numpy, CuPy, numba or the driver."""
    return (
        isinstance(exc, MemoryError)  # numpy, and CuPy's OutOfMemoryError
        or (isinstance(exc, nbdriver.CudaAPIError) and exc.code == _OOM)
        or getattr(exc, "status", None) == _CUDA_RT_ERROR_MEMORY_ALLOCATION  # CuPy's CUDARuntimeError
    )


def _is_device_error(exc: BaseException) -> bool:
    return isinstance(exc, CudaDriverError) or type(exc).__module__.startswith(("cupy", "cupy_backends", "cuda"))


class map_exceptions:
    """Translate CuPy/numba/driver errors raised in the block into aiocubie's.

    Out-of-memory errors become :class:`OutOfMemoryError`, other device errors
    :class:`BackendError`; the message is ``what`` plus the library's, and ``detail()`` (called
    only on failure) adds context such as free memory.

    Examples
    --------
    >>> with map_exceptions("allocating 4096 bytes"):      # doctest: +SKIP
    ...     block = pool.malloc(4096)
    """

    __slots__ = ("detail", "what")

    def __init__(self, what: str | Callable[[], str], detail: Callable[[], str] | None = None) -> None:
        self.what = what
        self.detail = detail

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if exc is None or isinstance(exc, AiocubieError) or not isinstance(exc, Exception):
            return False
        what = self.what() if callable(self.what) else self.what
        extra = ""
        if self.detail is not None:
            try:
                extra = f": {self.detail()}"
            except Exception:  # the detail is a courtesy: never hide the real error behind it
                extra = ""
        if is_oom(exc):
            raise OutOfMemoryError(f"out of memory {what}{extra} ({exc})") from exc
        if _is_device_error(exc):
            raise BackendError(f"{what} failed: {exc}{extra}") from exc
        return False


def check(result: tuple[Any, ...], what: str) -> None:
    """Raise BackendError if a raw ``cuda.bindings`` call returned an error code."""
    if result[0] != binding.CUresult.CUDA_SUCCESS:
        raise BackendError(f"{what} failed: {result[0].name}")
