"""A manager's options and every name a user can give, parsed and validated once.

Pure: no device, no event loop. Every name a user can pass (backend, device, allocator, array
type, mode, policy, numbers, the ``AIOCUBIE_*`` variables) is checked here and nowhere else;
the rest of the package reads typed, valid fields.
"""

from __future__ import annotations

import enum
import math
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from ._backends._allocators import Allocator, allocator_or_resource, parse_allocator
from ._budget import LimitMode
from ._errors import AiocubieError, ConfigurationError, shown
from ._names import parse_array_type, parse_backend, parse_device

__all__ = [
    "ENVIRONMENT",
    "Options",
    "Policy",
    "Setup",
    "from_environment",
    "parse_history",
    "parse_mode",
    "parse_priority",
]

T = TypeVar("T")

#: The environment variables a :class:`~aiocubie.MemoryManager` reads for the arguments it is
#: not given (an explicit argument always wins).
ENVIRONMENT = {
    "AIOCUBIE_BACKEND": "backend: auto, simulator or cuda",
    "AIOCUBIE_MODE": "mode: passive or active",
    "AIOCUBIE_ALLOCATOR": "allocator of a backend the manager creates: default, driver, cupy, cupy_async, numba, rmm or a registered name",
    "AIOCUBIE_HISTORY": "record the allocation history: 1 (on), 0 (off), or FILE.json (on, written there on out-of-memory)",
}


class Policy(str, enum.Enum):
    """What a batch does when it does not fit the group's headroom (active) or the free memory (passive) now.

    ``chunk``: plan against the headroom there is (more, smaller chunks).
    ``wait``: wait, first come first served, until enough memory is released for the plan the
    batch would get if the group held nothing (active mode; the group's own queue), or if this
    manager held nothing (passive mode; one line for every group). A batch that could not fit
    even then fails at once.
    ``fail``: raise :class:`InsufficientMemoryError` unless the batch fits whole (active mode;
    in passive mode it chunks).
    """

    CHUNK = "chunk"
    WAIT = "wait"
    FAIL = "fail"


def _mode(value: Any) -> LimitMode:
    try:
        if not isinstance(value, str):  # the enum's lookup would compare an array element by element
            raise ValueError(value)
        return LimitMode(value)
    except ValueError:
        raise ConfigurationError(f"unknown limit mode {shown(value)}: use 'passive' or 'active'") from None


def _policy(value: Any) -> Policy:
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return Policy(value)
    except ValueError:
        raise ConfigurationError(f"unknown policy {shown(value)}: use 'chunk', 'wait' or 'fail'") from None


def _real(value: Any) -> float:
    """``value`` as a float, NaN for anything that is not a real number a float can hold."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return math.nan
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):  # 10**400 is real, but no float holds it
        return math.nan


def _headroom(value: Any) -> float:
    number = _real(value)
    if not 0.0 <= number < 1.0:  # NaN fails too
        raise ConfigurationError(f"headroom must be a fraction in [0, 1) of the memory kept back, got {shown(value)}")
    return number


def _seconds(name: str, value: Any) -> float:
    number = _real(value)
    if not 0.0 <= number < math.inf:  # NaN fails too
        raise ConfigurationError(f"{name} must be a finite number of seconds >= 0 (e.g. 0.002), got {shown(value)}")
    return number


def _batch_window(value: Any) -> float:
    return _seconds("batch_window", value)


def _free_cache_seconds(value: Any) -> float:
    return _seconds("free_cache_seconds", value)


def _priority_aging(value: Any) -> float | None:
    if value is None:
        return None
    number = _real(value)
    if not 0.0 < number < math.inf:  # NaN fails too
        raise ConfigurationError(
            "priority_aging must be the seconds a waiting request takes to gain one priority level, a "
            f"finite number > 0 (e.g. 0.1), or None (no aging: strict priorities), got {shown(value)}"
        )
    return number


def _reclaim_timeout(value: Any) -> float:
    number = _real(value)
    if not 0.0 < number < math.inf:
        raise ConfigurationError(
            f"reclaim_timeout must be a finite number of seconds > 0 (e.g. 1.0), got {shown(value)}"
        )
    return number


def parse_priority(value: Any, error: type[AiocubieError] = ConfigurationError) -> int:
    """A request's or a member's priority: an int (numpy's too), higher first.

    Raises
    ------
    AiocubieError
        ``error`` (a ConfigurationError unless given) for anything else: a bool, a float, a string.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(
            f"priority must be an int (higher is served first among requests waiting for memory; "
            f"default 0), got {shown(value)}"
        )
    return int(value)


def _memory_limit(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0):
        raise ConfigurationError(
            f"memory_limit must be the device bytes the manager budgets, an int > 0 (e.g. 8 << 30), or None, "
            f"got {shown(value)}"
        )
    return None if value is None else int(value)


def _max_batch(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigurationError(f"max_batch must be a positive integer or None, got {shown(value)}")
    return value


@attrs.frozen
class Options:
    """The options of a :class:`~aiocubie.MemoryManager`.

    Built once, validated as it is built; change one with :meth:`replace`, which validates
    again. Every error is a :class:`ConfigurationError` naming the value and what is allowed.

    Attributes
    ----------
    mode : LimitMode
        Passive (the default): use free memory, chunk only when needed. Active: each group is
        limited to the sum of its members' caps minus what they hold.
    policy : Policy
        What a batch does when it does not fit now (see :class:`Policy`).
    headroom : float
        Fraction of the available memory a batch leaves unused, in [0, 1).
    batch_window : float
        Seconds a batch stays open after its first request (0: close at once). A batch
        closes early when every member of the group has asked, or on ``mgr.groups.flush()``.
    max_batch : int or None
        Most requests in one batch.
    free_cache_seconds : float
        How long a free-memory reading is reused (it costs tens of microseconds on a GPU);
        a batch about to be chunked always reads the device again.
    memory_limit : int or None
        The device bytes the manager budgets (None: the whole device). Caps are proportions of
        it, and the planner never offers more than it leaves: free memory is at most
        ``memory_limit`` minus what the pool has in use (every library's bytes where the pool
        says them, else the manager's own) and the manager's managed memory. For a share of a GPU, an RMM pool's maximum size,
        or dask-cuda's ``device_memory_limit`` (``aiocubie.dask.ManagerPlugin(budget=...)``).
    priority_aging : float or None
        Seconds a request waiting for memory takes to gain one priority level (None: never,
        strict priorities). A request of priority ``p`` is served before every request of a
        higher priority ``q`` that comes more than ``(q - p) * priority_aging`` seconds after it.
    reclaim_timeout : float
        Seconds the async reclaim hooks of one round may take, together, before the batch
        that waits for them goes on without them.

    Examples
    --------
    >>> Options(mode="active").replace(policy="wait").policy
    <Policy.WAIT: 'wait'>
    """

    mode: LimitMode = attrs.field(default=LimitMode.PASSIVE, converter=_mode)
    policy: Policy = attrs.field(default=Policy.CHUNK, converter=_policy)
    headroom: float = attrs.field(default=0.05, converter=_headroom)
    batch_window: float = attrs.field(default=0.002, converter=_batch_window)
    max_batch: int | None = attrs.field(default=None, converter=_max_batch)
    free_cache_seconds: float = attrs.field(default=0.05, converter=_free_cache_seconds)
    memory_limit: int | None = attrs.field(default=None, converter=_memory_limit)
    priority_aging: float | None = attrs.field(default=0.1, converter=_priority_aging)
    reclaim_timeout: float = attrs.field(default=1.0, converter=_reclaim_timeout)

    #: True in active mode.
    active: bool = attrs.field(init=False, eq=False, repr=False)
    #: True when a batch that does not fit waits for memory (policy wait).
    waits: bool = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        # read on every request: computed once
        object.__setattr__(self, "active", self.mode is LimitMode.ACTIVE)
        object.__setattr__(self, "waits", self.policy is Policy.WAIT)

    def replace(self, **changes: Any) -> Options:
        """A copy with ``changes`` applied, validated like the original."""
        return attrs.evolve(self, **changes)


def from_environment(
    environ: Mapping[str, str], variable: str, explicit: T | None, parse: Callable[[str], T]
) -> T | None:
    """``explicit`` if given, else ``variable``'s value in ``environ`` parsed, else None.

    Raises
    ------
    ConfigurationError
        If the variable is set to a value ``parse`` refuses (naming the variable).
    """
    if explicit is not None:
        return explicit
    value = environ.get(variable)
    if value is None or not value.strip():
        return None
    try:
        return parse(value.strip())
    except ConfigurationError as exc:
        raise type(exc)(f"environment variable {variable}={value!r}: {exc}") from None


def parse_mode(value: str) -> LimitMode:
    """The limit mode ``value`` names (for :data:`ENVIRONMENT`)."""
    return _mode(value)


def parse_history(value: str) -> str | bool:
    """``AIOCUBIE_HISTORY``: True for ``1``, False for ``0``, or the ``.json`` file to write on out-of-memory."""
    if value in ("0", "1"):
        return value == "1"
    if not value.endswith(".json"):
        raise ConfigurationError("use 1 (record), 0 (do not) or a FILE.json to write the history to on out-of-memory")
    return value


def _backend_or_none(value: Any) -> str | None:
    return None if value is None else parse_backend(value)


def _device_or_none(value: Any) -> int | None:
    return None if value is None else parse_device(value)


def _allocator_or_none(value: Any) -> Allocator | None:
    return None if value is None else allocator_or_resource(value)


def _array_type_or_none(value: Any) -> str | None:
    return None if value is None else parse_array_type(value)


def parse_broker(value: Any) -> str:
    """The node broker's socket (``broker=``, ``AIOCUBIE_BROKER``): a path, as a string."""
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ConfigurationError(
            f"broker must be the path of a node broker's socket (python -m aiocubie broker --socket PATH), "
            f"got {shown(value)}"
        )
    return str(os.fspath(value))


def _broker_or_none(value: Any) -> str | None:
    return None if value is None else parse_broker(value)


@attrs.frozen
class Setup:
    """What a :class:`~aiocubie.MemoryManager` is asked to build, every name parsed once.

    Read from its arguments with :meth:`read`, the ``AIOCUBIE_*`` variables filling in what
    is not given (an explicit argument always wins).
    """

    #: The backend to create (None: the caller passed a backend object).
    backend: str | None = attrs.field(converter=_backend_or_none)
    device: int | None = attrs.field(converter=_device_or_none)
    #: A registered name (parsed), a resource, or a factory of one (None: the backend's own).
    allocator: Allocator | None = attrs.field(converter=_allocator_or_none)
    array_type: str | None = attrs.field(converter=_array_type_or_none)
    #: Record the history from the start: True, or the file to write on out-of-memory.
    history: str | bool
    options: Options
    #: The node broker's socket to lease the budget from (None: no broker).
    broker: str | None = attrs.field(default=None, converter=_broker_or_none)

    @classmethod
    def read(
        cls,
        backend: object,
        *,
        given_backend: tuple[int, str] | None,
        device: Any,
        mode: Any,
        allocator: Any,
        array_type: Any,
        environ: Mapping[str, str],
        broker: Any = None,
        **options: Any,
    ) -> Setup:
        """Parse the manager's arguments; ``given_backend``: the device and array type of the
        backend object passed (None: a backend is to be made).

        Raises
        ------
        ConfigurationError
            For a value (or a variable, named) that is not one of those allowed, or a device
            or array type other than the given backend's.
        """
        if given_backend is None:
            backend = from_environment(environ, "AIOCUBIE_BACKEND", backend, parse_backend)
            backend = "auto" if backend is None else backend
            allocator = from_environment(environ, "AIOCUBIE_ALLOCATOR", allocator, parse_allocator)
        mode = from_environment(environ, "AIOCUBIE_MODE", mode, parse_mode)
        history = from_environment(environ, "AIOCUBIE_HISTORY", None, parse_history)
        setup = cls(
            None if given_backend else backend,
            device,
            allocator,
            array_type,
            False if history is None else history,
            Options(mode=LimitMode.PASSIVE if mode is None else mode, **options),
            from_environment(environ, "AIOCUBIE_BROKER", broker, parse_broker),
        )
        if given_backend is not None:
            setup.check_given(*given_backend)
        return setup

    def check_given(self, device: int, array_type: str) -> None:
        """Raise unless this device and array type (where given) are those of the backend passed."""
        if self.device is not None and self.device != device:
            raise ConfigurationError(
                f"device={self.device!r} but the backend given drives device {device}: "
                "pass device to the backend, or a backend name"
            )
        if self.array_type is not None and self.array_type != array_type:
            raise ConfigurationError(
                f"array_type={self.array_type!r} but the backend given hands out {array_type!r} arrays: "
                "pass array_type to the backend, or a backend name"
            )
