"""Request and response value types: ArrayRequest, ArrayResponse, MemoryKind.

Pure: no numba.cuda, no event loop. A request is validated when it is built, so a bad one
never reaches the scheduler.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import attrs
import numpy as np

from ._errors import InvalidRequestError, RunLengthMismatchError, shown
from ._lease import Lease, ReleasedArray
from ._names import MAX_NBYTES, MemoryKind, check_device
from ._protocols import Event, StreamLike

__all__ = [
    "ArrayRequest",
    "ArrayResponse",
    "MemoryKind",
    "ReleasedArray",
    "RequestSet",
    "check_device",
    "check_requests",
    "run_length",
]

#: Most dimensions an array may have: numpy's limit (64 since numpy 2, 32 before).
MAX_NDIM = 64 if int(np.__version__.split(".")[0]) >= 2 else 32


def _shape(value: int | Sequence[int]) -> tuple[int, ...]:
    if type(value) is tuple and len(value) <= MAX_NDIM:  # the usual shape (an array's): checked without ABCs
        for dim in value:
            if type(dim) is not int or dim < 0:
                break
        else:
            return value
    given: Any = value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        given = (value,)
    try:
        dims = tuple(given)  # anything iterable is tried; each dim is checked
    except TypeError:
        raise InvalidRequestError(f"shape must be a tuple of non-negative integers, got {shown(given)}") from None
    for dim in dims:
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
            if isinstance(value, str) and _is_dtype(value):
                raise InvalidRequestError(
                    f"shape {shown(value)} is a dtype: the order is ArrayRequest(shape, dtype) (swapped?), "
                    f"e.g. ArrayRequest((3, 4), {value!r})"
                )
            raise InvalidRequestError(
                f"shape {shown(given)} holds {shown(dim)}, which is not an integer: pass whole numbers of elements"
            )
        if dim < 0:
            raise InvalidRequestError(f"shape {shown(given)} holds the negative size {shown(dim)}")
    if len(dims) > MAX_NDIM:
        raise InvalidRequestError(
            f"shape {shown(given)} has {len(dims)} dimensions, over the {MAX_NDIM} a numpy array may "
            "have: reshape it to fewer"
        )
    return tuple(int(d) for d in dims)


#: The scalar types GPU arrays have (CuPy's, numba's, torch's), little-endian.
_GPU_TYPES = frozenset(
    {
        np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
        np.float16, np.float32, np.float64, np.complex64, np.complex128,
    }
)  # fmt: skip


def _dtype(value: Any) -> np.dtype[Any]:
    if value is None:  # np.dtype(None) is float64: too easy to get by accident
        raise InvalidRequestError("dtype is required: pass e.g. np.float32")
    try:
        dtype: np.dtype[Any] = np.dtype(value)
    except (TypeError, ValueError, SyntaxError) as exc:  # numpy parses "f4,i4" strings as Python
        raise InvalidRequestError(f"dtype {value!r} is not a numpy dtype: {exc}") from None
    if dtype.type not in _GPU_TYPES or not dtype.isnative:
        raise InvalidRequestError(_unsupported(value, dtype))
    return dtype


def _unsupported(value: Any, dtype: np.dtype[Any]) -> str:
    """Why no GPU array has ``dtype`` (given as ``value``), and what to use instead.

    They would compute correctly on the simulator (numpy has them) and corrupt on a GPU.
    """
    named = isinstance(value, np.dtype) or str(value) == str(dtype)
    given = f"dtype {str(dtype)!r}" if named else f"dtype {shown(value)} ({dtype})"
    if dtype.type in _GPU_TYPES:
        native = dtype.newbyteorder("<")
        return (
            f"{given} is big-endian: GPU arrays are little-endian; use {native.str!r} (np.{native.name}), "
            f"and convert host data with .astype(np.{native.name})"
        )
    if dtype.type is np.longdouble or dtype.type is np.clongdouble:
        instead = "complex128" if dtype.kind == "c" else "float64"
        return f"{given} is numpy's long double, not supported on the GPU: use np.{instead}"
    if dtype.names is not None or dtype.subdtype is not None:
        return f"{given} is a structured or sub-array dtype, not supported on the GPU: request one array per field"
    return (
        f"{given} is not supported on the GPU: use a boolean, integer, float (16, 32 or 64 bits) or "
        "complex (64 or 128 bits) dtype"
    )


def _kind(value: MemoryKind | str) -> MemoryKind:
    return MemoryKind.parse(value)


def _is_dtype(value: object) -> bool:
    try:
        np.dtype(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, SyntaxError):
        return False
    return True


def _flag(value: bool) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidRequestError(f"flags unchunkable, zero and spillable take True or False, got {value!r}")
    return bool(value)


@attrs.frozen
class ArrayRequest:
    """One array a component asks for.

    Parameters
    ----------
    shape : tuple of int
        Full (unchunked) shape. A bare int means a 1-d array.
    dtype : numpy dtype or anything ``np.dtype`` accepts
        Boolean, integer, float or complex.
    kind : MemoryKind or str
        ``"device"`` (default), ``"pinned"``, ``"mapped"``, ``"host"`` or ``"managed"``.
    chunk_axis : int
        The run axis, along which a batch is chunked when it does not fit. Negative values
        count from the end.
    unchunkable : bool
        Keep the full shape whatever the plan (parameters, lookup tables).
    zero : bool
        Fill with zeros on the group's stream before the request resolves.
    buffers : int
        Chunk buffers of this array to allocate when the batch is chunked (1 by default): an
        overlapped walk of depth ``d`` needs ``d`` (see :func:`walk_requests`). The plan
        budgets every buffer; a batch that fits whole gets one.
    spillable : bool
        The manager may move the array to pinned host memory while it is not in use (a cache):
        use it inside ``async with response.use()``, which brings it back (see
        :meth:`ArrayResponse.use`). Device memory only.

    Raises
    ------
    InvalidRequestError
        For a negative or non-integer size, more than 64 dimensions, an unsupported dtype, an
        unknown kind, a chunk axis out of range, an array larger than 2**63 - 1 bytes, or one
        numpy cannot index (its non-zero sizes times the item size over 2**63 - 1, as
        ``(2**70, 0)``): a request that could never be allocated is refused here; or
        ``buffers`` that is not a positive integer (or above 1 on an unchunkable array); or
        ``spillable`` memory of a kind other than device.

    Notes
    -----
    A chunkable array whose run axis has length 0 (``ArrayRequest((0,), "f4")``) has no runs:
    there is nothing to chunk. It takes no part in the run-length agreement of its request or
    batch (like an unchunkable array), so it may be batched with requests of any run length;
    it is allocated with its empty shape, and its chunk slices are empty.

    A run axis of length 1 is planned as cubie plans it: the array is unchunkable (its bytes
    count as fixed, it keeps its shape in every chunk, its chunk slices are whole and it has
    one buffer), and it agrees with any run length, so a run's parameters batch beside arrays
    of ``N`` runs. A request or batch whose only run axes have length 1 has one run: its plan
    has ``runs`` and ``chunk_length`` 1.

    Examples
    --------
    >>> ArrayRequest(shape=(8, 1000), dtype="float32", chunk_axis=1).nbytes
    32000
    """

    shape: tuple[int, ...] = attrs.field(converter=_shape)
    dtype: np.dtype[Any] = attrs.field(converter=_dtype)
    kind: MemoryKind = attrs.field(default=MemoryKind.DEVICE, converter=_kind)
    chunk_axis: int = attrs.field(default=0)
    unchunkable: bool = attrs.field(default=False, converter=_flag)
    zero: bool = attrs.field(default=False, converter=_flag)
    buffers: int = attrs.field(default=1)
    spillable: bool = attrs.field(default=False, converter=_flag)
    #: Bytes of the full, unchunked array.
    nbytes: int = attrs.field(init=False, eq=False, repr=False)
    #: Length of the run axis, or None for an unchunkable array. 0 (an empty run axis) means
    #: the array has no runs: it is batched with requests of any run length (see Notes).
    runs: int | None = attrs.field(init=False, eq=False, repr=False)
    #: Bytes one run of the batch adds for this array (0 for an unchunkable array, or one
    #: whose run axis is empty).
    bytes_per_run: int = attrs.field(init=False, eq=False, repr=False)
    #: True when the array takes device memory (its kind is device or managed).
    uses_vram: bool = attrs.field(init=False, eq=False, repr=False)
    #: Bytes the planner counts as fixed: the whole array when it is unchunkable or its run
    #: axis has length 1 (see Notes), else 0.
    fixed_bytes: int = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        # a plain int is an integer without the ABC checks (a request per batch of a loader whose shapes vary)
        axis = self.chunk_axis
        if type(axis) is not int and (isinstance(axis, bool) or not isinstance(axis, numbers.Integral)):
            raise InvalidRequestError(f"chunk_axis must be an integer, got {axis!r}")
        ndim = len(self.shape)
        buffers = self.buffers
        if (type(buffers) is not int and (isinstance(buffers, bool) or not isinstance(buffers, numbers.Integral))) or (
            buffers < 1
        ):
            raise InvalidRequestError(f"buffers must be a positive integer, got {buffers!r}")
        if self.unchunkable and buffers != 1:
            raise InvalidRequestError(
                f"buffers={buffers} asks for chunk buffers of an unchunkable array: it is never "
                "chunked, so it has one; drop buffers or make the array chunkable"
            )
        object.__setattr__(self, "buffers", int(buffers))
        if self.spillable and self.kind is not MemoryKind.DEVICE:
            raise InvalidRequestError(
                f"spillable=True asks to spill {self.kind.value} memory: only device memory spills to the host; "
                "drop spillable or use kind='device'"
            )
        if not self.unchunkable:
            if ndim == 0:
                raise InvalidRequestError(f"shape {self.shape} is 0-d: it has no axis to chunk; pass unchunkable=True")
            if not -ndim <= axis < ndim:
                raise InvalidRequestError(
                    f"chunk_axis {axis} is out of range for shape {self.shape} (valid: {-ndim}..{ndim - 1})"
                )
            axis = int(axis) % ndim
            object.__setattr__(self, "chunk_axis", axis)
        nbytes = math.prod(self.shape) * self.dtype.itemsize
        if nbytes > MAX_NBYTES:
            raise InvalidRequestError(
                f"shape {shown(self.shape)} of {self.dtype} needs {shown(nbytes)} bytes, "
                f"over the 2**63 - 1 a single array may have"
            )
        # numpy and CuPy index an array with signed 64-bit sizes and strides even when it is
        # empty: (2**70, 0) has no bytes but cannot be made. They check the product of the
        # non-zero sizes (each one included) times the item size.
        extent = nbytes if 0 not in self.shape else math.prod(max(d, 1) for d in self.shape) * self.dtype.itemsize
        if extent > MAX_NBYTES:
            raise InvalidRequestError(
                f"shape {shown(self.shape)} of {self.dtype} cannot be indexed: its non-zero sizes "
                f"times the {self.dtype.itemsize}-byte item come to {shown(extent)}, over the 2**63 - 1 "
                "numpy allows even for an empty array; use smaller sizes"
            )
        # computed once: the planner reads them for every batch
        object.__setattr__(self, "nbytes", nbytes)
        object.__setattr__(self, "uses_vram", self.kind.uses_vram)
        if self.unchunkable:
            object.__setattr__(self, "runs", None)
            object.__setattr__(self, "bytes_per_run", 0)
            object.__setattr__(self, "fixed_bytes", nbytes)
        else:
            runs = self.shape[axis]
            # an empty run axis has no runs to chunk, and a run axis of length 1 is not chunked
            # (as cubie plans it): neither adds anything per run of its batch
            object.__setattr__(self, "runs", runs)
            object.__setattr__(self, "bytes_per_run", nbytes // runs if runs > 1 else 0)  # the other axes' bytes
            object.__setattr__(self, "fixed_bytes", nbytes if runs == 1 else 0)
            if runs == 1:  # never cut, so one buffer: a walk's extra buffers would be unbudgeted copies
                object.__setattr__(self, "buffers", 1)

    @classmethod
    def like(
        cls,
        array: Any,
        *,
        kind: MemoryKind | str = MemoryKind.DEVICE,
        chunk_axis: int = 0,
        unchunkable: bool = False,
        zero: bool = False,
    ) -> ArrayRequest:
        """A request for an array of ``array``'s shape and dtype (numpy, CuPy, numba, torch...).

        Examples
        --------
        >>> import numpy as np
        >>> ArrayRequest.like(np.zeros((8, 1000), np.float32), chunk_axis=1).nbytes
        32000

        Raises
        ------
        InvalidRequestError
            If ``array`` has no ``shape`` and ``dtype``, or they are not valid for a request.
        """
        shape, dtype = getattr(array, "shape", None), getattr(array, "dtype", None)
        if shape is None or dtype is None:
            raise InvalidRequestError(
                f"ArrayRequest.like needs an array with a shape and a dtype, got {type(array).__name__}"
            )
        return cls(shape, dtype, kind, chunk_axis, unchunkable, zero)

    def chunked_shape(self, chunk_length: int) -> tuple[int, ...]:
        """The shape this array has when the run axis is cut to ``chunk_length``."""
        if self.unchunkable or self.runs == 1:
            return self.shape
        shape = list(self.shape)
        shape[self.chunk_axis] = min(chunk_length, shape[self.chunk_axis])
        return tuple(shape)


def run_length(batch: Iterable[tuple[str, ArrayRequest]]) -> int:
    """The run length the chunkable arrays of ``batch`` (label, request pairs) share (0: none).

    Arrays with an empty run axis (0 runs) or a run axis of length 1 are not chunked and agree
    with any length; when only length-1 run axes are there, the run length is 1.

    Raises
    ------
    RunLengthMismatchError
        If two chunkable arrays disagree.
    """
    runs: int | None = None
    first = ""
    single = False
    for label, request in batch:
        if not request.runs or request.runs == 1:  # unchunkable, an empty or a length-1 run axis
            single = single or request.runs == 1
            continue
        if runs is None:
            runs, first = request.runs, label
        elif request.runs != runs:
            raise RunLengthMismatchError(
                f"arrays of one batch must agree on the run length: {first!r} has {runs} runs "
                f"along its chunk axis but {label!r} has {request.runs}; give them the same "
                "length, mark one unchunkable, or request them in different stream groups"
            )
    return runs or (1 if single else 0)


class RequestSet:
    """The arrays of one request, checked, with the totals the planner needs (read-only).

    Attributes
    ----------
    arrays : dict
        Label -> :class:`ArrayRequest`.
    runs : int
        The run length the chunkable arrays share (0 when none is chunkable, or all of them
        have an empty run axis; 1 when the only run axes have length 1: both batch with any
        run length).
    fixed : int
        VRAM bytes of the unchunkable arrays.
    per_run : int
        VRAM bytes one run of the chunkable arrays takes.
    buffered : int
        VRAM bytes one run takes with every chunk buffer (``per_run`` when no array asks
        for more than one): what a chunked plan budgets.
    chunk_axes : dict
        Label -> run axis (None for unchunkable arrays).
    shapes : dict
        Label -> full (unchunked) shape.
    spillable : tuple of str
        The labels of the arrays the manager may spill to host (empty: none).
    """

    __slots__ = ("_stand_ins", "arrays", "buffered", "chunk_axes", "fixed", "per_run", "runs", "shapes", "spillable")

    def __init__(
        self,
        arrays: dict[str, ArrayRequest],
        runs: int,
        fixed: int,
        per_run: int,
        chunk_axes: dict[str, int | None] | None = None,
        shapes: dict[str, tuple[int, ...]] | None = None,
        buffered: int | None = None,
        spillable: tuple[str, ...] = (),
    ) -> None:
        self.arrays = arrays
        self.spillable = spillable
        self.buffered = per_run if buffered is None else buffered
        self.runs = runs
        self.fixed = fixed
        self.per_run = per_run
        if chunk_axes is None:
            chunk_axes = {label: None if r.unchunkable else r.chunk_axis for label, r in arrays.items()}
        self.chunk_axes = chunk_axes
        self.shapes = {label: r.shape for label, r in arrays.items()} if shapes is None else shapes
        self._stand_ins: dict[str, ReleasedArray] | None = None

    def __repr__(self) -> str:
        return f"RequestSet({self.arrays!r}, runs={self.runs}, fixed={self.fixed}, per_run={self.per_run})"

    def stand_ins(self) -> dict[str, ReleasedArray]:
        """Label -> the :class:`ReleasedArray` a released response of these arrays, unchunked, holds
        in its place; made once (a stand-in holds no memory and never changes: responses share it)."""
        stand_ins = self._stand_ins
        if stand_ins is None:
            stand_ins = self._stand_ins = {
                label: ReleasedArray(label, r.shape, r.dtype) for label, r in self.arrays.items()
            }
        return stand_ins

    def chunked_shapes(self, chunk_length: int) -> dict[str, tuple[int, ...]]:
        """Label -> shape of each array when the run axis is cut to ``chunk_length``."""
        if chunk_length >= self.runs:
            return self.shapes
        return {label: r.chunked_shape(chunk_length) for label, r in self.arrays.items()}


def check_requests(requests: Any) -> RequestSet:
    """Validate a ``{label: ArrayRequest}`` mapping into a :class:`RequestSet`.

    Raises
    ------
    InvalidRequestError
        If ``requests`` is not a non-empty mapping of non-empty string labels to ArrayRequest.
    RunLengthMismatchError
        If its chunkable arrays disagree on the run length.
    """
    if not isinstance(requests, Mapping):
        raise InvalidRequestError(f"requests must be a mapping of label -> ArrayRequest, got {type(requests).__name__}")
    if not requests:
        raise InvalidRequestError(
            f"the requests hold no array ({shown(requests)}): ask for at least one, e.g. "
            "{'x': ArrayRequest((n,), np.float32)}; a member with nothing to ask gets its group's batch "
            "plans from its ready hook (register(instance, ready_hook=...))"
        )
    arrays: dict[str, ArrayRequest] = {}
    axes: dict[str, int | None] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    fixed = per_run = runs = buffered = 0
    first = ""
    single = False
    spillable: tuple[str, ...] = ()
    for label, request in requests.items():
        if not isinstance(label, str) or not label:
            raise InvalidRequestError(f"array labels must be non-empty strings, got {label!r}")
        if not isinstance(request, ArrayRequest):
            raise InvalidRequestError(f"requests[{label!r}] is a {type(request).__name__}, not an ArrayRequest")
        arrays[label] = request
        if request.spillable:
            spillable += (label,)
        shapes[label] = request.shape
        if request.runs is None or request.runs == 1:  # unchunkable, or a length-1 run axis (as cubie)
            axes[label] = None
            single = single or request.runs == 1
            if request.uses_vram:
                fixed += request.nbytes
        else:
            axes[label] = request.chunk_axis
            if not request.runs:  # an empty run axis: nothing to chunk, agrees with any length
                continue
            if not first:
                runs, first = request.runs, label
            elif request.runs != runs:
                run_length([(first, arrays[first]), (label, request)])  # raises, saying why
            if request.uses_vram:
                per_run += request.bytes_per_run
                buffered += request.bytes_per_run * request.buffers
    return RequestSet(arrays, runs or (1 if single else 0), fixed, per_run, axes, shapes, buffered, spillable)


# slots=False: a frozen class with a __dict__ is built with dict stores rather than one
# object.__setattr__ call a field (a response is built for every request)
@attrs.frozen(eq=False, slots=False)
class ArrayResponse:
    """What a request resolves to: the arrays and the batch's chunk plan.

    Every member of a batch gets the same ``chunks`` and ``chunk_length``, so all of them walk
    the same chunks in lockstep: chunk ``i`` covers runs ``[i * chunk_length,
    min((i + 1) * chunk_length, runs))``.

    Attributes
    ----------
    arrays : dict
        Label -> array allocated with its chunked shape (empty for a group member that had
        nothing queued in the batch).
    chunks : int
        Number of chunks the batch is walked in (1 when it fits whole).
    chunk_length : int
        Runs per chunk (the last chunk may be shorter).
    runs : int
        Length of the run axis of the whole batch (0 when no array is chunkable).
    chunked_shapes : dict
        Label -> shape of each allocated array.
    chunk_axes : dict
        Label -> run axis of each array (None for unchunkable arrays).
    stream : StreamLike
        The stream group's stream the arrays were allocated on.
    buffers : dict
        Label -> every chunk buffer of an array that got more than one (``arrays[label]`` is
        the first); see :meth:`buffer_count`.
    device : Device or None
        The device the arrays are on (what :func:`walk_chunks` copies with); None for a
        response built by hand.
    ready : Event or None
        The event recorded on ``stream`` after the arrays were allocated (and zeroed). Work
        queued on ``stream`` runs after it; work on another stream must wait for it first
        (``device.wait_event(other, response.ready)``) when the request was ``ordered``
        (see ``MemoryManager.request``). None for a response built by hand, and for the
        plan-only response a ready hook gets for a member that asked for nothing in the batch.
    lease : Lease
        What it holds of its account (released labels, walks under way); :meth:`release`
        goes through it. Nothing else writes a response.

    Examples
    --------
    >>> async def step(mgr, solver):  # doctest: +SKIP
    ...     async with await mgr.request(solver, {"x": ArrayRequest(shape=(4,), dtype="f4")}) as response:
    ...         ...  # use response.arrays["x"]; released on exit (or response.release())
    """

    arrays: dict[str, Any]
    chunks: int
    chunk_length: int
    runs: int
    chunked_shapes: dict[str, tuple[int, ...]]
    chunk_axes: dict[str, int | None]
    stream: StreamLike
    buffers: dict[str, tuple[Any, ...]] = attrs.field(factory=dict)
    device: Any = attrs.field(default=None, repr=False)
    ready: Event | None = attrs.field(default=None, repr=False, eq=False)
    # what it holds of its account (the account hands it one; a response built by hand gets one
    # that releases nothing): the released labels, the walks under way, the frees waiting for them
    lease: Lease = attrs.field(
        default=attrs.Factory(lambda self: Lease(self.arrays, self.buffers, None), takes_self=True), repr=False
    )
    # the (in, out) copy streams of ``stream``, made by its group on first use: what a walk of
    # several chunks overlaps its copies on (None: a response built by hand, the walk makes its own)
    _copy_streams: Callable[[], tuple[StreamLike, StreamLike]] | None = attrs.field(default=None, repr=False, eq=False)

    @property
    def released(self) -> frozenset[str]:
        """The labels whose arrays were freed (``release``, ``free``, ``free_all``, the end of
        ``async with``, a context reset): those arrays must not be used any more."""
        released = self.lease.released
        return frozenset() if released is None else frozenset(released)

    def release(self) -> None:
        """Free the arrays (as ``mgr.release(response)``); nothing if they were released already.

        Safe to call again, from any task of the manager's loop, and after the manager closed
        (its exit released everything). A release while a walk is under way frees the blocks
        once the walk has ended; the walk raises :class:`ReleasedError` at its next chunk.
        """
        self.lease.release(self)

    async def aclose(self) -> None:
        """Release the arrays (see :meth:`release`): ``async with response:`` does it on exit."""
        self.lease.release(self)

    async def __aenter__(self) -> ArrayResponse:
        return self

    def use(self) -> AbstractAsyncContextManager[dict[str, Any]]:
        """``async with response.use() as arrays:`` the arrays, resident until the block exits.

        Spilled spillable arrays come back first (a request of their member like any other, with
        its budget and policy: it may wait, or fail as a request would), possibly at new addresses:
        ``arrays`` (``response.arrays``) holds the current ones. Inside the block none is spilled;
        blocks may nest and run concurrently. Outside, a spillable array may be spilled at any time
        (on the simulator a touch of it raises :class:`~aiocubie.errors.SpilledError`; on a GPU it is
        undefined). A response with no spillable array just hands its arrays.
        """
        return self.lease.use()

    async def __aexit__(self, *exc_info: object) -> None:
        self.lease.release(self)

    def _full_shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]]:
        """Label -> (shape, dtype) of the full-size host array a walk takes for it (the run axis at
        ``runs``; an empty run axis stays empty)."""
        cached = self.lease.cached_views()
        found: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] | None = cached.get("full")
        if found is None:
            found = {}
            for label, array in self.arrays.items():
                full = list(self.chunked_shapes[label])
                axis = self.chunk_axes[label]
                if axis is not None and full[axis]:
                    full[axis] = self.runs
                found[label] = (tuple(full), np.dtype(array.dtype))
            cached["full"] = found
        return found

    def buffer_count(self, label: str) -> int:
        """How many chunk buffers ``label`` has (1 unless it asked for more and was chunked)."""
        found = self.buffers.get(label)
        return 1 if found is None else len(found)

    def buffer(self, label: str, index: int) -> Any:
        """Chunk buffer ``index`` of ``label``, counted modulo :meth:`buffer_count`."""
        found = self.buffers.get(label)
        return self.arrays[label] if found is None else found[index % len(found)]

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        """Return ``(start, stop)`` in runs of chunk ``index``.

        Raises
        ------
        IndexError
            If ``index`` is not in ``range(self.chunks)``.
        """
        if not 0 <= index < self.chunks:
            raise IndexError(f"chunk {index} out of range: the plan has {self.chunks} chunks")
        start = index * self.chunk_length
        return start, min(start + self.chunk_length, self.runs)

    def chunk_slices(self, index: int, label: str) -> tuple[slice, ...]:
        """Index of chunk ``index`` into the *full-size* host array matching ``label``.

        Unchunkable arrays get full slices. Use it to copy the chunk's part of a host array
        into (or out of) the device array ``arrays[label]``.
        """
        start, stop = self.chunk_bounds(index)
        shape = self.chunked_shapes[label]
        axis = self.chunk_axes[label]
        index_tuple = [slice(None)] * len(shape)
        if axis is not None:
            index_tuple[axis] = slice(start, stop)
        return tuple(index_tuple)

    def chunk_ranges(self) -> Iterator[tuple[int, int]]:
        """Yield ``(start, stop)`` of every chunk, in order."""
        for index in range(self.chunks):
            yield self.chunk_bounds(index)
