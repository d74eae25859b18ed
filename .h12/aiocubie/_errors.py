"""aiocubie's exceptions and warnings: one hierarchy rooted in :class:`AiocubieError`.

Errors from CuPy and Numba are translated into these at the backend seam and keep the
original as ``__cause__``; users only ever need to catch aiocubie's own types.
"""

from __future__ import annotations

__all__ = [
    "AiocubieError",
    "AiocubieWarning",
    "AllocationError",
    "BackendError",
    "BudgetError",
    "ConfigurationError",
    "ContextResetError",
    "InsufficientMemoryError",
    "InvalidRequestError",
    "ManagerStateError",
    "PlanningError",
    "RegistrationError",
    "ReleasedError",
    "RunLengthMismatchError",
    "UnchunkableTooLargeError",
    "UnknownAllocatorError",
]


class AiocubieError(Exception):
    """Base class of every error aiocubie raises."""


class AiocubieWarning(UserWarning):
    """Warnings about memory pressure and risky operations (95% use, 20x over free, resets)."""


class InvalidRequestError(AiocubieError, ValueError):
    """An :class:`ArrayRequest` (or a mapping of them) is malformed: bad shape, dtype, kind or axis."""


class RunLengthMismatchError(InvalidRequestError):
    """Chunkable arrays of one batch disagree on the length of their run axis."""


class RegistrationError(AiocubieError, ValueError):
    """An instance is registered twice, or used without being registered."""


class BudgetError(AiocubieError, ValueError):
    """A VRAM proportion is invalid or would break the budget (over 1, or the 5% auto pool)."""


class ConfigurationError(AiocubieError, ValueError):
    """A manager option is invalid (mode, policy, headroom, batch window, backend name...)."""


class UnknownAllocatorError(ConfigurationError):
    """``set_allocator`` names an allocator that does not exist or cannot be used here."""


class PlanningError(AiocubieError):
    """A batch cannot be planned within the memory offered to its stream group."""


class UnchunkableTooLargeError(PlanningError):
    """The unchunkable arrays of a batch alone exceed the memory offered."""


class InsufficientMemoryError(PlanningError):
    """Not even one run of the batch fits, or (policy "fail") the batch does not fit unchunked."""


class AllocationError(AiocubieError, MemoryError):
    """The backend failed to allocate (out of memory, or an injected fault)."""


class BackendError(AiocubieError):
    """A backend operation other than allocation failed (event, copy, stream, prefetch)."""


class ReleasedError(AiocubieError):
    """The request's arrays were freed (``free``, ``free_all``) before it resolved."""


class ContextResetError(AiocubieError):
    """The request was withdrawn or its arrays invalidated by a context reset (set_allocator, invalidate_all)."""


class ManagerStateError(AiocubieError, RuntimeError):
    """The manager is not running (use ``async with MemoryManager() as mgr``) or has been closed."""
