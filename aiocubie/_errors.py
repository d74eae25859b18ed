"""aiocubie's exceptions and warnings: one hierarchy rooted in :class:`AiocubieError`.

Errors from CuPy and Numba are translated into these at the backend seam and keep the
original as ``__cause__``; users only ever need to catch aiocubie's own types.
"""

from __future__ import annotations

import os
import sys
import warnings

__all__ = [
    "AiocubieError",
    "AiocubieWarning",
    "AllocationError",
    "BackendError",
    "BrokerError",
    "BudgetError",
    "ConfigurationError",
    "ContextResetError",
    "InsufficientMemoryError",
    "InvalidRequestError",
    "LeaseError",
    "ManagerStateError",
    "OutOfMemoryError",
    "PlanningError",
    "RegistrationError",
    "ReleasedError",
    "RunLengthMismatchError",
    "SpilledError",
    "UnchunkableTooLargeError",
    "UnknownAllocatorError",
    "warn",
]


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` for an error message, cut short when huge (``10**400`` has 401 digits).

    A cut repr keeps its start and end and says how long it was, so the message still names the
    value without burying what to do.
    """
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__} object>"
    if len(text) <= limit:
        return text
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{text[:12]}...{text[-6:]} (an integer of {len(text.lstrip('-'))} digits)"
    return f"{text[: limit - 20]}...{text[-8:]} ({len(text)} characters)"


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


# MemoryError first: copies and pickles go through MemoryError.__new__ where tblib (which distributed
# installs) handles exceptions, and that refuses a subclass whose layout comes from another base.
class AllocationError(MemoryError, AiocubieError):
    """The backend failed to allocate (out of memory, or an injected fault)."""


class OutOfMemoryError(AllocationError):
    """The device or its pool had no room. The manager tries to recover first (frees the pool's
    cached blocks, calls reclaim hooks); the message says what each group holds and what was asked."""


class BackendError(AiocubieError):
    """A backend operation other than allocation failed (event, copy, stream, prefetch)."""


class BrokerError(AiocubieError):
    """The node broker (``broker=PATH``) cannot be reached, refused this client, or speaks another protocol
    version. Arrays held already stay valid; the next lease tries to connect again."""


class LeaseError(BrokerError):
    """The node broker could not lease the bytes a batch needs now (policy ``fail``, or ``chunk`` with no room
    for one run); the message names the broker's socket and what its other clients hold."""


class ReleasedError(AiocubieError):
    """The request's arrays were freed (``free``, ``free_all``) before it resolved."""


class SpilledError(AiocubieError):
    """A spillable array was touched while spilled to host: use it inside ``async with response.use()``."""


class ContextResetError(AiocubieError):
    """The request was withdrawn or its arrays invalidated by a context reset (set_allocator, invalidate_all)."""


class ManagerStateError(AiocubieError, RuntimeError):
    """The manager is not running (use ``async with MemoryManager() as mgr``) or has been closed."""


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def warn(message: str, category: type[Warning] = AiocubieWarning) -> None:
    """Warn, pointing at the caller's line: the first frame outside aiocubie.

    (A batch planned in its group's task has no caller left on the stack; the warning then
    points at the line that started the event loop, past the loop libraries' frames.)
    """
    level, frame = 2, sys._getframe(1)  # stacklevel 2: the frame that called warn()
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level += 1
        frame = frame.f_back  # type: ignore[assignment]
    # In a group's task the frames below aiocubie's are the event loop's: look past them for the
    # program's own line (where the loop was started), keeping the first outside aiocubie if none.
    outside, machinery = level, _loop_machinery()
    while frame is not None and frame.f_code.co_filename.startswith(machinery):
        level += 1
        frame = frame.f_back  # type: ignore[assignment]
    warnings.warn(message, category, stacklevel=level if frame is not None else outside)


def _loop_machinery() -> tuple[str, ...]:
    """Folders of the event-loop libraries loaded now (asyncio, anyio, trio, uvloop, outcome)."""
    folders = []
    for name in ("asyncio", "anyio", "trio", "uvloop", "outcome", "sniffio"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            folders.append(os.path.dirname(path) + os.sep)
    return tuple(folders)
