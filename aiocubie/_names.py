"""The names every layer reads, backends included: memory kinds, backends, array types, device numbers.

The ground floor beside :mod:`aiocubie._errors` (it imports nothing else of aiocubie): the
backends stand on it without standing on the options or the request types above them.
"""

from __future__ import annotations

import enum
import numbers
from typing import Any

import numpy as np

from ._errors import ConfigurationError, InvalidRequestError, shown

__all__ = [
    "ARRAY_TYPES",
    "BACKENDS",
    "MAX_NBYTES",
    "MemoryKind",
    "check_device",
    "one_of",
    "parse_array_type",
    "parse_backend",
    "parse_device",
]

#: Largest byte count one array may have (a signed 64-bit size, as CUDA and numpy use).
MAX_NBYTES = 2**63 - 1
#: Backend names: ``auto`` picks ``cuda`` when a usable GPU is present, else ``simulator``.
BACKENDS = ("auto", "simulator", "cuda")
#: What device arrays are: CuPy arrays (the default) or numba device arrays.
ARRAY_TYPES = ("cupy", "numba")


class MemoryKind(str, enum.Enum):
    """Where an array lives.

    ``device`` and ``managed`` count against VRAM (and against caps in active mode);
    ``pinned``, ``mapped`` and ``host`` live in host memory and are never budgeted.
    """

    DEVICE = "device"
    PINNED = "pinned"
    MAPPED = "mapped"
    HOST = "host"
    MANAGED = "managed"

    @property
    def uses_vram(self) -> bool:
        """True for the kinds that take device memory."""
        return self in (MemoryKind.DEVICE, MemoryKind.MANAGED)

    @classmethod
    def parse(cls, value: MemoryKind | str) -> MemoryKind:
        """Return the kind named by ``value``; raise InvalidRequestError for an unknown name."""
        if isinstance(value, MemoryKind):
            return value
        names = ", ".join(k.value for k in cls)
        if not isinstance(value, str):  # before the enum's lookup, which compares an array element by element
            raise InvalidRequestError(f"unknown memory kind {shown(value)}: use one of {names}")
        try:
            return cls(value)
        except ValueError:
            raise InvalidRequestError(f"unknown memory kind {value!r}: use one of {names}") from None


def check_device(device: Any, *, what: str = "device") -> int | None:
    """Return ``device`` if it is a device ordinal (an int >= 0) or None (the CPU).

    Raises
    ------
    InvalidRequestError
        For anything else (a bool, a float, an array, a negative number).
    """
    if device is None:
        return None
    if isinstance(device, (bool, np.bool_)) or not isinstance(device, numbers.Integral) or device < 0:
        raise InvalidRequestError(
            f"{what} must be a device number (an int >= 0, e.g. 0) or None for the CPU, got {shown(device)}"
        )
    return int(device)


def one_of(value: Any, names: tuple[str, ...], what: str, error: type[ConfigurationError], hint: str = "") -> str:
    if not isinstance(value, str) or value not in names:
        raise error(f"unknown {what} {shown(value)}: use one of {', '.join(map(repr, names))}{hint}")
    return value


def parse_backend(value: Any) -> str:
    """The backend ``value`` names: one of :data:`BACKENDS` (:class:`ConfigurationError` else)."""
    return one_of(value, BACKENDS, "backend", ConfigurationError, " (or pass a Backend)")


def parse_array_type(value: Any) -> str:
    """The array type ``value`` names: one of :data:`ARRAY_TYPES` (:class:`ConfigurationError` else)."""
    hint = (
        " ('cupy' needs CuPy: pip install 'aiocubie[cuda12]' or 'aiocubie[cuda13]'; 'numba' needs "
        "pip install 'aiocubie[numba]')"
    )
    return one_of(value, ARRAY_TYPES, "array type", ConfigurationError, hint)


def parse_device(value: Any, *, what: str = "device") -> int:
    """The device id ``value`` names: an int >= 0.

    Raises
    ------
    ConfigurationError
        For anything else (a bool, a float, a negative number).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ConfigurationError(f"{what} must be a device number (an int >= 0, e.g. 0), got {shown(value)}")
    return int(value)
