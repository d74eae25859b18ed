"""The one error map of the CUDA backend: cuda.core, cuda.bindings, CuPy, numba and RMM errors become aiocubie's.

Every call into those libraries that can fail runs under :class:`map_exceptions` (or :func:`check` for
a raw ``cuda.bindings`` result), so that nothing above the backend layer sees a foreign exception. It
recognises numba's and RMM's errors by their module (and RMM's C++ errors, which arrive as builtin
``RuntimeError``, by RMM's message prefixes) and imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

from cuda.bindings import driver as binding

from ..._errors import AiocubieError, BackendError, OutOfMemoryError

__all__ = ["check", "is_oom", "map_exceptions", "translate"]

_SUCCESS = binding.CUresult.CUDA_SUCCESS
_OOM = binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY
_CUDA_RT_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation, as CuPy's CUDARuntimeError.status
_FOREIGN = ("cupy", "cupy_backends", "cuda", "numba", "rmm")
# RMM's C++ exceptions reach Python as RuntimeError (rmm::logic_error, rmm::cuda_error), their
# message starting with RMM's failure macros' text; rmm::out_of_memory arrives as MemoryError.
_RMM_MESSAGES = ("RMM failure at:", "CUDA error at:", "CUDA error encountered at:")


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory error of numpy, CuPy, numba, cuda.core or the driver."""
    if isinstance(exc, MemoryError):  # numpy, and CuPy's OutOfMemoryError
        return True
    if getattr(exc, "status", None) == _CUDA_RT_ERROR_MEMORY_ALLOCATION:  # CuPy's CUDARuntimeError
        return True
    code = getattr(exc, "code", None)  # numba's CudaAPIError
    if code is not None and int(code) == int(_OOM):
        return True
    # cuda.core raises CUDAError with the driver's name of the result in the message
    return _is_foreign(exc) and "OUT_OF_MEMORY" in str(exc)


def _is_foreign(exc: BaseException) -> bool:
    if type(exc).__module__.split(".", 1)[0] in _FOREIGN:
        return True
    return isinstance(exc, RuntimeError) and str(exc).startswith(_RMM_MESSAGES)


class map_exceptions:
    """Translate cuda.core, cuda.bindings, CuPy, numba and RMM errors raised in the block into aiocubie's.

    Out-of-memory errors become :class:`OutOfMemoryError`, other device errors :class:`BackendError`,
    with the original as ``__cause__``; the message is ``what`` plus the library's, and ``detail()``
    (called only on failure) adds context such as free memory. aiocubie's own errors and errors of
    other origin (a ``TypeError`` from a bad argument) pass through unchanged.

    Examples
    --------
    Needs a GPU (not run by the doctests):

    >>> with map_exceptions("allocating 4096 bytes"):      # doctest: +SKIP
    ...     buffer = resource.allocate(4096, stream=stream)
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
        if exc is None:
            return False
        mapped = translate(exc, self.what, self.detail)
        if mapped is None:
            return False
        raise mapped from exc


def translate(
    exc: BaseException, what: str | Callable[[], str], detail: Callable[[], str] | None = None
) -> AiocubieError | None:
    """aiocubie's error for ``exc`` raised while doing ``what``, or None to let ``exc`` pass.

    For hot paths that catch with ``try``/``except`` (free when nothing is raised) rather than
    entering :class:`map_exceptions`: ``raise translate(exc, ...) or exc``.
    """
    if isinstance(exc, AiocubieError) or not isinstance(exc, Exception):
        return None
    oom = is_oom(exc)
    if not oom and not _is_foreign(exc):
        return None
    said = what() if callable(what) else what
    extra = ""
    if detail is not None:
        try:
            extra = f": {detail()}"
        except Exception:  # the detail is a courtesy: never hide the real error behind it
            extra = ""
    if oom:
        return OutOfMemoryError(f"out of memory {said}{extra} ({exc})")
    return BackendError(f"{said} failed: {exc}{extra}")


def check(result: tuple[Any, ...], what: str | Callable[[], str]) -> None:
    """Raise :class:`OutOfMemoryError` or :class:`BackendError` if a raw ``cuda.bindings`` call failed.

    ``what`` (a string, or a callable giving one, called only on failure) says what was being done.
    """
    err = result[0]
    if err == _SUCCESS:
        return
    said = what() if callable(what) else what
    name = getattr(err, "name", str(err))
    if err == _OOM:
        raise OutOfMemoryError(f"out of memory {said} ({name})")
    raise BackendError(f"{said} failed: {name}")
