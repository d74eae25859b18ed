"""The simulator's arrays: numpy memory that behaves like the GPU's arrays of each type.

``SimCupyArray`` models ``cupy.ndarray`` (arithmetic, ``.get()``, no implicit conversion to
numpy); numba's ``DeviceNDArray`` model lives in ``_numba_model`` (the numba extra). Host reads
wait for work queued on the array's stream, as the GPU's legacy default stream does. It must not
import numba: a numba array is made only when asked for, by the maker that needs it.
"""

from __future__ import annotations

import importlib.util
import operator
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from ..._errors import ConfigurationError
from ..._names import MemoryKind
from .._arrays import ArrayMaker, parse_array_type
from .._resource import Block
from .._stream import StreamLike
from ._memory import check_live

__all__ = ["SimArrays", "SimCupyArray", "cuda_array_interface", "host_data", "in_simulated_kernel", "sync"]


_IMPLICIT = (
    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array "
    "explicitly."  # CuPy's own message
    " (or await mgr.host.from_device(instance, [device_array], [numpy_array]), or a walk's outputs)"
)


#: What to do when numpy meets a device array (appended to CuPy's own messages).
_TO_DEVICE = (
    ": a numpy array does not mix with a device array (on a GPU it is in host memory); copy it to the "
    "device first: device_array.set(numpy_array), await mgr.host.to_device(instance, [numpy_array], "
    "[device_array]), or a walk (walk_chunks)"
)


class _Stream(Protocol):
    handle: int

    def synchronize(self) -> None: ...


def in_simulated_kernel() -> bool:
    # numba's CUDA simulator runs each GPU thread of a kernel as a BlockThread. Inside a kernel,
    # arrays are indexed element by element, as on a GPU, and must not wait for their stream
    # (the kernel itself may be the stream's current work).
    return type(threading.current_thread()).__name__ == "BlockThread"


def sync(stream: _Stream | None) -> None:
    if stream is not None and not in_simulated_kernel():
        stream.synchronize()


def cuda_array_interface(data: np.ndarray[Any, Any], stream: _Stream | None) -> dict[str, Any]:
    """Version 3 of the CUDA array interface, with the stream the data is ordered on."""
    return {
        "shape": data.shape,
        "typestr": data.dtype.str,
        "descr": data.dtype.descr,
        "data": (data.ctypes.data, not data.flags.writeable),
        "strides": None if data.flags.c_contiguous else data.strides,
        "stream": stream.handle if stream is not None else None,
        "version": 3,
    }


class _Flags:
    """``cupy.ndarray.flags``: attributes and the numpy-style keys."""

    __slots__ = ("c_contiguous", "f_contiguous", "owndata")

    def __init__(self, data: np.ndarray[Any, Any]) -> None:
        self.c_contiguous = bool(data.flags.c_contiguous)
        self.f_contiguous = bool(data.flags.f_contiguous)
        self.owndata = bool(data.flags.owndata)

    def __getitem__(self, key: str) -> bool:
        return bool(getattr(self, key.lower()))

    def __repr__(self) -> str:
        return f"  C_CONTIGUOUS : {self.c_contiguous}\n  F_CONTIGUOUS : {self.f_contiguous}\n  OWNDATA : {self.owndata}"


def _operand(value: Any) -> Any:
    """The numpy value of a CuPy-model operand; numpy arrays are refused, as CuPy refuses them."""
    if isinstance(value, SimCupyArray):
        return value._host()
    if isinstance(value, np.ndarray):  # CuPy's message, then what to do instead
        raise TypeError(f"Unsupported type {type(value)}{_TO_DEVICE}")
    if isinstance(value, (list, tuple)):
        return type(value)(_operand(item) for item in value)
    return value


class SimCupyArray:
    """A ``cupy.ndarray`` model over a numpy buffer.

    Arithmetic, reductions, slicing and numpy ufuncs give ``SimCupyArray``s, as CuPy gives
    ``cupy.ndarray``s; ``np.asarray`` and mixing with numpy arrays raise ``TypeError``, as on a
    GPU. ``.get()`` copies to a numpy array. numba kernels accept it under numba's simulator.

    Parameters
    ----------
    data : numpy.ndarray
        The memory (shared, not copied).
    stream : SimStream or None
        The stream its work is ordered on: host reads wait for it.
    """

    __slots__ = ("__weakref__", "_data", "_stream")
    __array_priority__ = 100.0  # numpy defers to our reflected operators
    __hash__ = None  # type: ignore[assignment]  # as cupy.ndarray

    def __init__(self, data: np.ndarray[Any, Any], stream: _Stream | None = None) -> None:
        self._data = data
        self._stream = stream

    def _host(self) -> np.ndarray[Any, Any]:
        check_live(self._data)
        sync(self._stream)
        return self._data

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return SimCupyArray(value, self._stream)
        if isinstance(value, np.generic):  # CuPy reductions give 0-d arrays, not scalars
            return SimCupyArray(np.asarray(value), self._stream)
        if isinstance(value, tuple):
            return tuple(self._wrap(item) for item in value)
        return value

    # -- what it is ----------------------------------------------------------------------
    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: self._data.size)
    nbytes = property(lambda self: self._data.nbytes)
    itemsize = property(lambda self: self._data.itemsize)
    strides = property(lambda self: self._data.strides)
    flags = property(lambda self: _Flags(self._data))
    T = property(lambda self: SimCupyArray(self._data.T, self._stream))

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return cuda_array_interface(self._data, self._stream)

    def __dlpack__(self, **kwargs: Any) -> Any:
        # On the simulator the memory is host memory: consumers (torch.from_dlpack) see a CPU tensor.
        return self._host().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._data.__dlpack_device__()

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray[Any, Any]:
        raise TypeError(_IMPLICIT)

    # -- moving data ---------------------------------------------------------------------
    def get(
        self, stream: Any = None, order: str = "C", out: np.ndarray[Any, Any] | None = None, blocking: bool = True
    ) -> np.ndarray[Any, Any]:
        """A numpy copy (into ``out`` if given), once the array's stream has caught up."""
        data = self._host()
        if out is None:
            return np.array(data, order=order)  # type: ignore[call-overload,no-any-return]
        if out.shape != data.shape or out.dtype != data.dtype:
            raise ValueError(f"Shape mismatch or dtype mismatch: {out.shape} {out.dtype} vs {data.shape} {data.dtype}")
        np.copyto(out, data)
        return out

    def set(self, arr: np.ndarray[Any, Any], stream: Any = None) -> None:
        """Copy the numpy array ``arr`` (same shape and dtype) into this array."""
        arr = np.asarray(arr)
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if arr.dtype != self.dtype:
            raise TypeError(f"{self.dtype} array cannot be set to {arr.dtype} array")
        np.copyto(self._host(), arr)

    def item(self) -> Any:
        return self._host().item()

    def tolist(self) -> Any:
        return self._host().tolist()

    def fill(self, value: Any) -> None:
        self._host().fill(_operand(value))

    # -- indexing --------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        if in_simulated_kernel():
            return self._data[_operand(key)]  # elements are scalars inside a kernel
        data = self._host()
        key = _operand(key)
        value = data[key]
        if isinstance(value, np.generic):  # CuPy gives a 0-d view, not a scalar copy
            value = data[(*key, Ellipsis) if isinstance(key, tuple) else (key, Ellipsis)]
        return self._wrap(value)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, SimCupyArray):
            value = value._host()
        elif isinstance(value, np.ndarray) and value.ndim:  # CuPy's own refusal: use .set() for host data
            raise ValueError(
                "non-scalar numpy.ndarray cannot be used for fill"  # CuPy's message, then what to do
                f"{_TO_DEVICE}"
            )
        _host = self._data if in_simulated_kernel() else self._host()
        _host[_operand(key)] = value

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[Any]:
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self)))

    # -- conversion of one element ---------------------------------------------------------
    def __bool__(self) -> bool:
        return bool(self._host())

    def __float__(self) -> float:
        return float(self._host())

    def __int__(self) -> int:
        return int(self._host())

    def __complex__(self) -> complex:
        return complex(self._host())

    def __index__(self) -> int:
        return operator.index(self._host())

    def __repr__(self) -> str:
        return repr(self._host())

    def __str__(self) -> str:
        return str(self._host())

    def __format__(self, spec: str) -> str:
        return format(self._host(), spec)

    # -- numpy's protocols: ufuncs and functions give SimCupyArrays ------------------------
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_operand(o) for o in out)
        result = getattr(ufunc, method)(*(_operand(x) for x in inputs), **kwargs)
        return out[0] if out is not None and len(out) == 1 else self._wrap(result)

    def __array_function__(self, func: Callable[..., Any], types: Any, args: Any, kwargs: Any) -> Any:
        return self._wrap(func(*(_operand(a) for a in args), **{k: _operand(v) for k, v in kwargs.items()}))


def _binary(op: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[[SimCupyArray, Any], Any]:
    def method(self: SimCupyArray, other: Any) -> Any:
        mine, theirs = self._host(), _operand(other)
        return self._wrap(op(theirs, mine) if reflected else op(mine, theirs))

    return method


def _inplace(op: Callable[[Any, Any], Any]) -> Callable[[SimCupyArray, Any], SimCupyArray]:
    def method(self: SimCupyArray, other: Any) -> SimCupyArray:
        op(self._host(), _operand(other))  # numpy's in-place operator writes the shared memory
        return self

    return method


def _unary(op: Callable[[Any], Any]) -> Callable[[SimCupyArray], Any]:
    return lambda self: self._wrap(op(self._host()))


def _method(name: str) -> Callable[..., Any]:
    def method(self: SimCupyArray, *args: Any, **kwargs: Any) -> Any:
        bound = getattr(self._host(), name)
        return self._wrap(bound(*(_operand(a) for a in args), **{k: _operand(v) for k, v in kwargs.items()}))

    method.__name__ = name
    return method


for _name in (
    "add",
    "sub",
    "mul",
    "truediv",
    "floordiv",
    "mod",
    "pow",
    "matmul",
    "and",
    "or",
    "xor",
    "lshift",
    "rshift",
):
    _op = getattr(operator, f"{_name}_" if _name in ("and", "or") else _name)
    setattr(SimCupyArray, f"__{_name}__", _binary(_op))
    setattr(SimCupyArray, f"__r{_name}__", _binary(_op, reflected=True))
    setattr(SimCupyArray, f"__i{_name}__", _inplace(getattr(operator, f"i{_name}")))
for _name in ("lt", "le", "eq", "ne", "gt", "ge"):
    setattr(SimCupyArray, f"__{_name}__", _binary(getattr(operator, _name)))
for _name in ("neg", "pos", "abs", "invert"):
    setattr(SimCupyArray, f"__{_name}__", _unary(getattr(operator, _name)))
# The cupy.ndarray methods users call most; each works on the data and wraps what comes back.
for _name in (
    "all", "any", "argmax", "argmin", "argsort", "astype", "clip", "conj", "copy", "cumprod", "cumsum",
    "diagonal", "dot", "flatten", "max", "mean", "min", "nonzero", "prod", "ravel", "repeat", "reshape",
    "round", "sort", "squeeze", "std", "sum", "swapaxes", "take", "trace", "transpose", "var", "view",
):  # fmt: skip
    setattr(SimCupyArray, _name, _method(_name))


def host_data(array: Any) -> np.ndarray[Any, Any]:
    """The numpy memory behind any simulator array (numpy arrays are their own)."""
    if isinstance(array, np.ndarray):
        return array
    if isinstance(array, SimCupyArray):
        return array._data
    data = getattr(array, "_ary", None)  # numba's simulator arrays
    if isinstance(data, np.ndarray):
        return data
    raise TypeError(f"not an array of the simulator: {type(array).__name__}")


class SimArrays(ArrayMaker):
    """The simulator's arrays over its blocks: numpy for host kinds, the array type's model otherwise.

    Parameters
    ----------
    array_type : {"cupy", "numba"}, optional
        ``"cupy"`` (None, the default): :class:`SimCupyArray`; ``"numba"``: numba's simulator
        array made to behave as a ``DeviceNDArray`` (needs numba: the numba extra).
    numba_array : callable, optional
        Returns the numba array model's class (``_numba_model.numba_model``, which imports
        numba): called only for ``"numba"``, so this module never imports numba's.

    Raises
    ------
    ConfigurationError
        For an unknown array type, or ``"numba"`` without numba installed.
    """

    def __init__(
        self, array_type: str | None = None, numba_array: Callable[[], Callable[..., Any]] | None = None
    ) -> None:
        self.name = parse_array_type(array_type)
        self._device_array: Callable[[np.ndarray[Any, Any], Any], Any] = SimCupyArray
        if self.name == "numba":
            if numba_array is None or importlib.util.find_spec("numba") is None:  # found, not imported
                raise ConfigurationError(
                    "array_type='numba' hands out numba's device arrays, and numba is not installed: "
                    "pip install 'aiocubie[numba]', or use array_type='cupy'"
                )
            self._device_array = numba_array()

    def make(self, block: Block, shape: tuple[int, ...], dtype: np.dtype[Any], stream: StreamLike | None) -> Any:
        data = np.ndarray(shape, dtype, buffer=block.handle)
        if block.kind is MemoryKind.HOST or block.kind is MemoryKind.PINNED:
            return data
        return self._device_array(data, stream)
