"""The array-maker protocol: arrays of one type (CuPy, numba, the simulator's models) over a block.

An array maker allocates nothing (a resource does) and copies nothing (a device does): it wraps
a block's memory in an array that holds the block, so the memory lives as long as the array.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from .._errors import ConfigurationError, shown
from ._device import StreamLike
from ._resource import Block

__all__ = ["ARRAY_TYPES", "DEFAULT_ARRAY_TYPE", "ArrayMaker", "parse_array_type"]

#: Array types handed out for device-side kinds (device, managed, mapped): CuPy arrays (the
#: default) or numba device arrays (the numba extra). Host kinds (host, pinned) are numpy arrays.
ARRAY_TYPES = ("cupy", "numba")
DEFAULT_ARRAY_TYPE = "cupy"


def parse_array_type(array_type: str | None) -> str:
    """The array type named by ``array_type`` (None: ``"cupy"``).

    Raises
    ------
    ConfigurationError
        For a name not in :data:`ARRAY_TYPES`.
    """
    if array_type is None:
        return DEFAULT_ARRAY_TYPE
    if not isinstance(array_type, str) or array_type not in ARRAY_TYPES:
        raise ConfigurationError(
            f"unknown array type {shown(array_type)}: use one of {', '.join(map(repr, ARRAY_TYPES))} "
            f"('cupy' needs CuPy: pip install 'aiocubie[cuda12]' or 'aiocubie[cuda13]'; 'numba' needs "
            "pip install 'aiocubie[numba]')"
        )
    return array_type


class ArrayMaker(abc.ABC):
    """Makes arrays over blocks.

    Attributes
    ----------
    name : str
        The array type of device-side kinds, one of :data:`ARRAY_TYPES`.
    """

    name: str

    @abc.abstractmethod
    def make(self, block: Block, shape: tuple[int, ...], dtype: np.dtype[Any], stream: StreamLike | None) -> Any:
        """A C-contiguous array of ``shape`` and ``dtype`` over ``block``, holding it.

        Device-side kinds (device, managed, mapped) give this maker's array type, ordered on
        ``stream``; host kinds (host, pinned) give numpy arrays. ``block.nbytes`` is exactly
        ``prod(shape) * dtype.itemsize``.
        """

    def nbytes(self, array: Any) -> int:
        """Bytes ``array`` takes."""
        return int(array.nbytes)
