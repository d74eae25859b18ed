"""The simulator's model of numba's ``DeviceNDArray``, over numba's own simulator array (the numba extra).

The one module of the simulator that imports numba (import-linter names it): importing it
imports numba's CUDA simulator classes, which needs ``NUMBA_ENABLE_CUDASIM`` chosen first, so
it is imported only when numba arrays are asked for.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

from ._arrays import cuda_array_interface, sync
from ._memory import check_live

__all__ = ["SimNumbaArray", "numba_model"]


#: What a numba ``DeviceNDArray`` has that the model reads through to its memory.
_ALLOWED = frozenset({"dtype", "ndim", "size", "strides", "itemsize", "squeeze"})


def _refuse(self: Any, other: Any) -> Any:
    return NotImplemented  # Python then raises "unsupported operand type(s)", as on a GPU


class SimNumbaArray(FakeCUDAArray):
    """A numba ``DeviceNDArray`` model: kernels take it; no arithmetic; copy_to_host reads it."""

    __hash__ = object.__hash__
    __eq__ = object.__eq__
    __ne__ = object.__ne__
    __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __add__ = __sub__ = __mul__ = __truediv__ = __floordiv__ = __mod__ = __pow__ = __matmul__ = _refuse

    def __getattr__(self, name: str) -> Any:
        if name in _ALLOWED and not name.startswith("_"):
            return getattr(self._ary, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._ary.shape)

    @property
    def flags(self) -> dict[str, bool]:
        return {
            "C_CONTIGUOUS": bool(self._ary.flags.c_contiguous),
            "F_CONTIGUOUS": bool(self._ary.flags.f_contiguous),
        }

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return cuda_array_interface(self._ary, self.stream or None)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray[Any, Any]:
        host: np.ndarray[Any, Any] = self.copy_to_host()
        return host.astype(dtype, copy=False) if dtype is not None else host

    def _view(self, ary: np.ndarray[Any, Any]) -> Any:
        return SimNumbaArray(ary, self.stream)

    def _live(self) -> np.ndarray[Any, Any]:
        """The memory, refused once released (a view of it as much as a read)."""
        data: np.ndarray[Any, Any] = self._ary
        check_live(data)
        return data

    def _host(self) -> np.ndarray[Any, Any]:
        """The memory for a host read or write, once the array's stream has caught up."""
        data = self._live()
        sync(self.stream or None)
        return data

    def __getitem__(self, idx: Any) -> Any:
        value = self._host()[idx]
        return self._view(value) if isinstance(value, np.ndarray) else value

    def __setitem__(self, idx: Any, value: Any) -> None:
        self._host()[idx] = value

    def __repr__(self) -> str:
        return repr(self._host())

    def __str__(self) -> str:
        return str(self._host())

    def copy_to_host(self, ary: Any = None, stream: Any = 0) -> Any:
        self._host()
        return super().copy_to_host(ary, stream)

    def copy_to_device(self, ary: Any, stream: Any = 0) -> None:
        self._host()
        super().copy_to_device(ary, stream)

    def bind(self, stream: Any = 0) -> Any:
        return SimNumbaArray(self._ary, stream)

    def transpose(self, axes: Any = None) -> Any:
        return self._view(np.transpose(self._live(), axes=axes))

    def ravel(self, *args: Any, **kwargs: Any) -> Any:
        return self._view(self._live().ravel(*args, **kwargs))

    def reshape(self, *args: Any, **kwargs: Any) -> Any:
        return self._view(self._live().reshape(*args, **kwargs))

    def view(self, *args: Any, **kwargs: Any) -> Any:
        return self._view(self._live().view(*args, **kwargs))

    def split(self, section: int, stream: Any = 0) -> list[Any]:
        return [self._view(a) for a in np.split(self._live(), range(section, len(self), section))]


def numba_model() -> type[Any]:
    """numba's simulator array, made to refuse what a numba ``DeviceNDArray`` refuses."""
    return SimNumbaArray
