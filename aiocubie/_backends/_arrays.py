"""The array-maker protocol: arrays of one type (CuPy, numba, the simulator's models) over a block.

An array maker allocates nothing (a resource does) and copies nothing (a device does): it wraps
a block's memory in an array that holds the block, so the memory lives as long as the array.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from .._names import ARRAY_TYPES
from .._names import parse_array_type as _parse
from ._resource import Block
from ._stream import StreamLike

__all__ = ["ARRAY_TYPES", "DEFAULT_ARRAY_TYPE", "ArrayMaker", "parse_array_type"]

#: The array type of device-side kinds (device, managed, mapped) when none is named: CuPy arrays
#: (numba device arrays are the numba extra). Host kinds (host, pinned) are numpy arrays.
DEFAULT_ARRAY_TYPE = "cupy"


def parse_array_type(array_type: str | None) -> str:
    """The array type named by ``array_type`` (None: ``"cupy"``); see ``_names.parse_array_type``.

    Raises
    ------
    ConfigurationError
        For a name not in :data:`ARRAY_TYPES`.
    """
    return DEFAULT_ARRAY_TYPE if array_type is None else _parse(array_type)


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
