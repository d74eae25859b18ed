"""Unit and property tests of the request/response value types (aiocubie._requests): what they accept,
what they refuse and what the refusal says, and their typed parameters."""

from __future__ import annotations

import inspect
import math
import typing

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiocubie._errors import AiocubieError, InvalidRequestError, RunLengthMismatchError
from aiocubie._requests import (
    MAX_NBYTES,
    ArrayRequest,
    ArrayResponse,
    MemoryKind,
    check_requests,
    run_length,
)

FAST = settings(max_examples=200, deadline=None)


# -- shape -----------------------------------------------------------------------------------
class TestShape:
    def test_tuple_shape_kept(self) -> None:
        req = ArrayRequest(shape=(8, 1000), dtype="float32", chunk_axis=1)
        assert req.shape == (8, 1000)
        assert req.nbytes == 32000

    def test_bare_int_is_1d(self) -> None:
        assert ArrayRequest(shape=7, dtype="int8").shape == (7,)

    def test_list_shape_becomes_tuple(self) -> None:
        req = ArrayRequest(shape=[3, 4], dtype="int8")
        assert req.shape == (3, 4)
        assert isinstance(req.shape, tuple)

    @pytest.mark.parametrize("dim", [np.int8(3), np.int16(3), np.int32(3), np.int64(3), np.uint8(3), np.uint64(3)])
    def test_numpy_integer_dims_accepted_and_made_python_ints(self, dim: object) -> None:
        req = ArrayRequest(shape=(dim, 2), dtype="float64")
        assert req.shape == (3, 2)
        assert all(type(d) is int for d in req.shape)

    def test_numpy_integer_bare_dim(self) -> None:
        req = ArrayRequest(shape=np.int64(5), dtype="float64")
        assert req.shape == (5,)
        assert type(req.shape[0]) is int

    def test_numpy_array_shape(self) -> None:
        req = ArrayRequest(shape=np.array([2, 3]), dtype="float64")
        assert req.shape == (2, 3)
        assert all(type(d) is int for d in req.shape)

    def test_zero_dims_allowed(self) -> None:
        req = ArrayRequest(shape=(0, 5), dtype="float64", chunk_axis=1)
        assert req.nbytes == 0
        assert req.runs == 5
        assert req.bytes_per_run == 0

    @pytest.mark.parametrize("bad", [-1, -100])
    def test_negative_dim_rejected_and_named(self, bad: int) -> None:
        with pytest.raises(InvalidRequestError, match=rf"negative size {bad}\b"):
            ArrayRequest(shape=(4, bad), dtype="float32")

    def test_negative_bare_int_rejected(self) -> None:
        with pytest.raises(InvalidRequestError, match="-3"):
            ArrayRequest(shape=-3, dtype="float32")

    def test_negative_numpy_dim_rejected(self) -> None:
        with pytest.raises(InvalidRequestError, match="negative"):
            ArrayRequest(shape=(np.int64(-2),), dtype="float32")

    @pytest.mark.parametrize("bad", [2.0, 2.5, float("nan"), float("inf"), np.float64(3.0)])
    def test_float_dim_rejected_and_named(self, bad: float) -> None:
        with pytest.raises(InvalidRequestError, match="not an integer") as info:
            ArrayRequest(shape=(4, bad), dtype="float32")
        assert repr(bad) in str(info.value)

    @pytest.mark.parametrize("bad", [2.0, 2.5])
    def test_float_bare_shape_rejected(self, bad: float) -> None:
        with pytest.raises(InvalidRequestError, match=repr(bad).replace(".", r"\.")):
            ArrayRequest(shape=bad, dtype="float32")

    @pytest.mark.parametrize("bad", [True, False, np.True_, np.False_])
    def test_bool_dim_rejected(self, bad: object) -> None:
        with pytest.raises(InvalidRequestError, match="not an integer") as info:
            ArrayRequest(shape=(4, bad), dtype="float32")
        assert repr(bad) in str(info.value)

    @pytest.mark.parametrize("bad", [True, False])
    def test_bool_bare_shape_rejected(self, bad: bool) -> None:
        with pytest.raises(InvalidRequestError, match=repr(bad)):
            ArrayRequest(shape=bad, dtype="float32")

    @pytest.mark.parametrize("bad", ["12", "ab", (3, "4"), (3, None), None, object()])
    def test_non_integer_shapes_rejected(self, bad: object) -> None:
        with pytest.raises(InvalidRequestError):
            ArrayRequest(shape=bad, dtype="float32")

    def test_invalid_request_error_is_value_error_and_aiocubie_error(self) -> None:
        with pytest.raises(ValueError):
            ArrayRequest(shape=(-1,), dtype="float32")
        with pytest.raises(AiocubieError):
            ArrayRequest(shape=(-1,), dtype="float32")


# -- dtype -----------------------------------------------------------------------------------
class TestDtype:
    @pytest.mark.parametrize(
        "dtype",
        [
            np.bool_,
            np.int8,
            np.uint8,
            np.int16,
            np.int32,
            np.int64,
            np.uint64,
            np.float16,
            np.float32,
            np.float64,
            np.complex64,
            np.complex128,
            "float32",
            "f8",
            "<i4",
            np.dtype("c16"),
        ],
    )
    def test_supported(self, dtype: object) -> None:
        req = ArrayRequest(shape=(3,), dtype=dtype)
        assert req.dtype == np.dtype(dtype)
        assert isinstance(req.dtype, np.dtype)
        assert req.nbytes == 3 * np.dtype(dtype).itemsize

    @pytest.mark.parametrize(
        "dtype",
        [
            object,
            np.object_,
            "O",
            str,
            "U8",
            "S4",
            np.void,
            "V8",
            np.dtype([("a", "f4"), ("b", "i4")]),
            "datetime64[ns]",
            "timedelta64[s]",
        ],
    )
    def test_unsupported_rejected_and_named(self, dtype: object) -> None:
        with pytest.raises(InvalidRequestError, match="not supported") as info:
            ArrayRequest(shape=(3,), dtype=dtype)
        assert str(np.dtype(dtype)) in str(info.value)

    @pytest.mark.parametrize("dtype", ["not-a-dtype", "float33", 3.5])
    def test_not_a_dtype_rejected_and_named(self, dtype: object) -> None:
        with pytest.raises(InvalidRequestError, match="not a numpy dtype") as info:
            ArrayRequest(shape=(3,), dtype=dtype)
        assert repr(dtype) in str(info.value)


# -- kind ------------------------------------------------------------------------------------
class TestKind:
    def test_default_is_device(self) -> None:
        assert ArrayRequest(shape=(1,), dtype="f4").kind is MemoryKind.DEVICE

    @pytest.mark.parametrize("kind", list(MemoryKind))
    def test_names_and_members(self, kind: MemoryKind) -> None:
        assert ArrayRequest(shape=(1,), dtype="f4", kind=kind.value).kind is kind
        assert ArrayRequest(shape=(1,), dtype="f4", kind=kind).kind is kind

    @pytest.mark.parametrize("bad", ["gpu", "DEVICE", "", "unified", 3, None, []])
    def test_unknown_kind_rejected_and_named(self, bad: object) -> None:
        with pytest.raises(InvalidRequestError, match="unknown memory kind") as info:
            ArrayRequest(shape=(1,), dtype="f4", kind=bad)
        message = str(info.value)
        assert repr(bad) in message
        for kind in MemoryKind:  # the message lists what is valid
            assert kind.value in message

    def test_uses_vram(self) -> None:
        assert {k for k in MemoryKind if k.uses_vram} == {MemoryKind.DEVICE, MemoryKind.MANAGED}

    def test_parse(self) -> None:
        assert MemoryKind.parse("pinned") is MemoryKind.PINNED
        assert MemoryKind.parse(MemoryKind.HOST) is MemoryKind.HOST


# -- chunk axis, unchunkable, 0-d ------------------------------------------------------------
class TestChunkAxis:
    @pytest.mark.parametrize(
        ("shape", "axis", "normalised"),
        [((4,), 0, 0), ((4,), -1, 0), ((2, 3, 4), -1, 2), ((2, 3, 4), -3, 0), ((2, 3, 4), 1, 1)],
    )
    def test_in_range_and_negative_normalised(self, shape: tuple[int, ...], axis: int, normalised: int) -> None:
        req = ArrayRequest(shape=shape, dtype="f4", chunk_axis=axis)
        assert req.chunk_axis == normalised
        assert req.runs == shape[normalised]

    def test_numpy_axis_normalised_to_int(self) -> None:
        req = ArrayRequest(shape=(2, 3), dtype="f4", chunk_axis=np.int64(-1))
        assert req.chunk_axis == 1
        assert type(req.chunk_axis) is int

    @pytest.mark.parametrize(("shape", "axis"), [((4,), 1), ((4,), -2), ((2, 3), 2), ((2, 3), -3)])
    def test_out_of_range_rejected_and_named(self, shape: tuple[int, ...], axis: int) -> None:
        with pytest.raises(InvalidRequestError, match=rf"chunk_axis {axis} is out of range") as info:
            ArrayRequest(shape=shape, dtype="f4", chunk_axis=axis)
        assert str(shape) in str(info.value)

    @pytest.mark.parametrize("bad", [1.0, True, False, "0", None])
    def test_non_integer_axis_rejected(self, bad: object) -> None:
        with pytest.raises(InvalidRequestError, match="chunk_axis must be an integer") as info:
            ArrayRequest(shape=(2, 3), dtype="f4", chunk_axis=bad)
        assert repr(bad) in str(info.value)

    def test_zero_d_needs_unchunkable(self) -> None:
        with pytest.raises(InvalidRequestError, match="unchunkable=True"):
            ArrayRequest(shape=(), dtype="f8")

    def test_zero_d_unchunkable_ok(self) -> None:
        req = ArrayRequest(shape=(), dtype="f8", unchunkable=True)
        assert req.shape == ()
        assert req.nbytes == 8
        assert req.runs is None
        assert req.bytes_per_run == 0
        assert req.chunked_shape(1) == ()

    def test_unchunkable_keeps_shape(self) -> None:
        req = ArrayRequest(shape=(16, 3), dtype="f8", unchunkable=True)
        assert req.runs is None
        assert req.bytes_per_run == 0
        for length in (0, 1, 5, 100):
            assert req.chunked_shape(length) == (16, 3)

    def test_bytes_per_run_and_chunked_shape(self) -> None:
        req = ArrayRequest(shape=(8, 100, 3), dtype="f4", chunk_axis=1)
        assert req.runs == 100
        assert req.bytes_per_run == 8 * 3 * 4
        assert req.chunked_shape(10) == (8, 10, 3)
        assert req.chunked_shape(100) == (8, 100, 3)
        assert req.chunked_shape(1000) == (8, 100, 3)  # never longer than the full axis

    def test_frozen(self) -> None:
        req = ArrayRequest(shape=(2,), dtype="f4")
        with pytest.raises(AttributeError):
            req.shape = (3,)  # type: ignore[misc]

    def test_flags(self) -> None:
        req = ArrayRequest(shape=(2,), dtype="f4", zero=True)
        assert req.zero is True and req.unchunkable is False


# -- size overflow ---------------------------------------------------------------------------
class TestSize:
    def test_exactly_max_bytes_allowed(self) -> None:
        req = ArrayRequest(shape=(MAX_NBYTES,), dtype="int8")
        assert req.nbytes == 2**63 - 1

    def test_one_byte_over_rejected(self) -> None:
        with pytest.raises(InvalidRequestError, match=str(2**63)):
            ArrayRequest(shape=(2**63,), dtype="int8")

    def test_itemsize_overflow_rejected(self) -> None:
        # 2**61 elements of 8 bytes: 2**64 bytes, though the element count is fine.
        with pytest.raises(InvalidRequestError, match="2\\*\\*63 - 1") as info:
            ArrayRequest(shape=(2**31, 2**30), dtype="float64", chunk_axis=1)
        assert str(2**64) in str(info.value)

    def test_unchunkable_overflow_rejected(self) -> None:
        with pytest.raises(InvalidRequestError):
            ArrayRequest(shape=(2**40, 2**40), dtype="int8", unchunkable=True)

    def test_zero_dim_with_a_small_extent_is_empty(self) -> None:
        assert ArrayRequest(shape=(2**40, 0), dtype="f8").nbytes == 0

    # issue 11 item 15: empty, yet numpy cannot make them (sizes and strides are int64)
    @pytest.mark.parametrize("shape", [(2**70, 0), (0, 2**64), (0, 2**63 - 1), (2**62, 0, 4)])
    def test_an_empty_array_numpy_cannot_index_is_refused(self, shape: tuple[int, ...]) -> None:
        with pytest.raises(InvalidRequestError, match="cannot be indexed") as info:
            ArrayRequest(shape=shape, dtype="f4")
        assert str(shape) in str(info.value)
        with pytest.raises(ValueError):  # what numpy would have said at allocation
            np.empty(shape, "f4")

    def test_more_dimensions_than_numpy_allows_are_refused(self) -> None:
        from aiocubie._requests import MAX_NDIM  # numpy's limit: 64 since numpy 2, 32 before

        assert ArrayRequest((1,) * MAX_NDIM, "f4", unchunkable=True).shape == (1,) * MAX_NDIM
        with pytest.raises(InvalidRequestError, match=f"{MAX_NDIM + 1} dimensions, over the {MAX_NDIM}"):
            ArrayRequest((1,) * (MAX_NDIM + 1), "f4", unchunkable=True)
        np.empty((1,) * MAX_NDIM, "f4")  # numpy agrees
        with pytest.raises(ValueError):
            np.empty((1,) * (MAX_NDIM + 1), "f4")

    @FAST
    @given(
        shape=st.lists(st.one_of(st.integers(0, 2**40), st.integers(2**60, 2**66)), min_size=1, max_size=4),
        dtype=st.sampled_from(["i1", "f2", "f4", "f8", "c16"]),
    )
    def test_refused_iff_numpy_could_not_make_it(self, shape: list[int], dtype: str) -> None:
        itemsize = np.dtype(dtype).itemsize
        nbytes = math.prod(shape) * itemsize
        extent = math.prod(max(d, 1) for d in shape) * itemsize
        if extent > 2**63 - 1:
            with pytest.raises(InvalidRequestError):
                ArrayRequest(shape=tuple(shape), dtype=dtype)
        else:
            assert ArrayRequest(shape=tuple(shape), dtype=dtype).nbytes == nbytes
            if nbytes == 0:
                np.empty(shape, dtype)  # numpy makes what is accepted (nothing to allocate)


# -- check_requests --------------------------------------------------------------------------
class TestCheckRequests:
    def test_valid_mapping_returned_as_dict_with_totals(self) -> None:
        a = ArrayRequest(shape=(2, 5), dtype="f4", chunk_axis=1)
        b = ArrayRequest(shape=(3,), dtype="f8", unchunkable=True)
        h = ArrayRequest(shape=(7, 5), dtype="f8", kind="pinned", chunk_axis=1)  # host: no VRAM
        from types import MappingProxyType

        out = check_requests(MappingProxyType({"a": a, "b": b, "h": h}))
        assert type(out.arrays) is dict
        assert out.arrays == {"a": a, "b": b, "h": h}
        assert out.arrays["a"] is a
        assert (out.runs, out.fixed, out.per_run) == (5, 24, 8)
        assert out.chunk_axes == {"a": 1, "b": None, "h": 1}
        assert out.chunked_shapes(2) == {"a": (2, 2), "b": (3,), "h": (7, 2)}

    def test_empty_mapping_refused(self) -> None:
        with pytest.raises(InvalidRequestError, match=r"the requests hold no array \(\{\}\): ask for at least one"):
            check_requests({})

    def test_run_length_mismatch_found_at_once(self) -> None:
        with pytest.raises(RunLengthMismatchError, match="'a' has 5 runs .* 'b' has 6"):
            check_requests({"a": ArrayRequest((5,), "f4"), "b": ArrayRequest((6,), "f4")})

    # issue 11 item 16: an empty run axis has no runs, so it agrees with any run length
    def test_an_empty_run_axis_agrees_with_any_run_length(self) -> None:
        empty = ArrayRequest((0, 7), "f8", chunk_axis=0)
        assert (empty.runs, empty.bytes_per_run, empty.nbytes) == (0, 0, 0)
        out = check_requests(
            {"z": empty, "k": ArrayRequest((1000,), "f4"), "y": ArrayRequest((3, 0), "f4", chunk_axis=1)}
        )
        assert (out.runs, out.fixed, out.per_run) == (1000, 0, 4)
        assert out.chunk_axes == {"z": 0, "k": 0, "y": 1}
        assert out.chunked_shapes(300) == {"z": (0, 7), "k": (300,), "y": (3, 0)}
        assert run_length([("z", empty), ("k", ArrayRequest((1000,), "f4"))]) == 1000
        assert run_length([("k", ArrayRequest((1000,), "f4")), ("z", empty)]) == 1000

    def test_only_empty_run_axes_make_a_request_of_no_runs(self) -> None:
        out = check_requests({"z": ArrayRequest((0,), "f4"), "p": ArrayRequest((4,), "f8", unchunkable=True)})
        assert (out.runs, out.fixed, out.per_run) == (0, 32, 0)
        assert out.chunked_shapes(0) == {"z": (0,), "p": (4,)}

    def test_non_empty_run_axes_must_still_agree_around_an_empty_one(self) -> None:
        with pytest.raises(RunLengthMismatchError, match="'a' has 5 runs .* 'b' has 6"):
            check_requests(
                {"z": ArrayRequest((0,), "f4"), "a": ArrayRequest((5,), "f4"), "b": ArrayRequest((6,), "f4")}
            )

    @pytest.mark.parametrize("bad", [[("a", 1)], None, "abc", 3, (ArrayRequest(shape=1, dtype="f4"),)])
    def test_not_a_mapping(self, bad: object) -> None:
        with pytest.raises(InvalidRequestError, match="mapping") as info:
            check_requests(bad)
        assert type(bad).__name__ in str(info.value)

    @pytest.mark.parametrize("label", ["", 1, None, b"a", ("a",)])
    def test_bad_labels(self, label: object) -> None:
        with pytest.raises(InvalidRequestError, match="non-empty strings") as info:
            check_requests({label: ArrayRequest(shape=1, dtype="f4")})
        assert repr(label) in str(info.value)

    @pytest.mark.parametrize("value", [None, np.zeros(3), {"shape": (1,), "dtype": "f4"}, (3,)])
    def test_values_must_be_array_requests(self, value: object) -> None:
        with pytest.raises(InvalidRequestError, match="not an ArrayRequest") as info:
            check_requests({"x": value})
        assert "'x'" in str(info.value)
        assert type(value).__name__ in str(info.value)


# -- ArrayResponse ---------------------------------------------------------------------------
def _response(chunks: int, chunk_length: int, runs: int) -> ArrayResponse:
    return ArrayResponse(
        arrays={},
        chunks=chunks,
        chunk_length=chunk_length,
        runs=runs,
        chunked_shapes={"state": (8, chunk_length), "params": (16,), "t": (chunk_length, 2, 3)},
        chunk_axes={"state": 1, "params": None, "t": 0},
        stream=None,
    )


class TestArrayResponse:
    def test_chunk_bounds_last_shorter(self) -> None:
        resp = _response(chunks=3, chunk_length=4, runs=10)
        assert [resp.chunk_bounds(i) for i in range(3)] == [(0, 4), (4, 8), (8, 10)]
        assert list(resp.chunk_ranges()) == [(0, 4), (4, 8), (8, 10)]

    def test_single_chunk(self) -> None:
        resp = _response(chunks=1, chunk_length=10, runs=10)
        assert list(resp.chunk_ranges()) == [(0, 10)]

    def test_zero_runs(self) -> None:
        resp = _response(chunks=1, chunk_length=0, runs=0)
        assert list(resp.chunk_ranges()) == [(0, 0)]

    @pytest.mark.parametrize("index", [-1, 3, 100])
    def test_chunk_bounds_out_of_range(self, index: int) -> None:
        resp = _response(chunks=3, chunk_length=4, runs=10)
        with pytest.raises(IndexError, match=rf"chunk {index} out of range: the plan has 3 chunks"):
            resp.chunk_bounds(index)
        with pytest.raises(IndexError):
            resp.chunk_slices(index, "state")

    def test_chunk_slices(self) -> None:
        resp = _response(chunks=3, chunk_length=4, runs=10)
        assert resp.chunk_slices(0, "state") == (slice(None), slice(0, 4))
        assert resp.chunk_slices(2, "state") == (slice(None), slice(8, 10))
        assert resp.chunk_slices(1, "params") == (slice(None),)
        assert resp.chunk_slices(2, "t") == (slice(8, 10), slice(None), slice(None))

    def test_chunk_slices_unknown_label(self) -> None:
        resp = _response(chunks=3, chunk_length=4, runs=10)
        with pytest.raises(KeyError):
            resp.chunk_slices(0, "nope")

    @FAST
    @given(
        runs=st.integers(1, 300),
        max_chunk=st.integers(1, 300),
        before=st.integers(0, 3),
        after=st.integers(0, 3),
    )
    def test_slices_tile_a_host_array(self, runs: int, max_chunk: int, before: int, after: int) -> None:
        """Walking the chunks with chunk_slices copies a full host array exactly once, in order."""
        chunks = -(-runs // max_chunk)
        chunk_length = -(-runs // chunks)
        shape = (2,) * before + (runs,) + (3,) * after
        chunked = (2,) * before + (chunk_length,) + (3,) * after
        resp = ArrayResponse(
            arrays={},
            chunks=chunks,
            chunk_length=chunk_length,
            runs=runs,
            chunked_shapes={"a": chunked, "p": (5,)},
            chunk_axes={"a": before, "p": None},
            stream=None,
        )
        ranges = list(resp.chunk_ranges())
        assert len(ranges) == chunks
        assert ranges[0][0] == 0 and ranges[-1][1] == runs
        for (_, stop), (start, _) in zip(ranges, ranges[1:]):
            assert stop == start
        assert all(0 < stop - start <= chunk_length for start, stop in ranges)

        host = np.arange(math.prod(shape)).reshape(shape)
        out = np.full(shape, -1)
        for i in range(chunks):
            idx = resp.chunk_slices(i, "a")
            part = host[idx]
            assert part.shape[before] == ranges[i][1] - ranges[i][0]
            # the part fits the device array of the chunked shape
            assert all(p <= c for p, c in zip(part.shape, chunked))
            assert (out[idx] == -1).all()
            out[idx] = part
        np.testing.assert_array_equal(out, host)
        params = np.arange(5)
        for i in range(chunks):
            np.testing.assert_array_equal(params[resp.chunk_slices(i, "p")], params)


def test_dtype_none_and_non_bool_flags_are_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="dtype is required"):
        ArrayRequest((4,), None)
    with pytest.raises(InvalidRequestError, match="'no'"):
        ArrayRequest((4,), "f4", unchunkable="no")
    with pytest.raises(InvalidRequestError, match="1"):
        ArrayRequest((4,), "f4", zero=1)
    assert ArrayRequest((4,), "f4", zero=np.bool_(True)).zero is True


def test_a_swapped_shape_and_dtype_says_so() -> None:
    with pytest.raises(InvalidRequestError, match=r"shape 'f4' is a dtype.*ArrayRequest\(shape, dtype\) \(swapped\?\)"):
        ArrayRequest("f4", (3, 4))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="holds 'a', which is not an integer"):
        ArrayRequest("ab", "f4")  # type: ignore[arg-type]  # not a dtype: the usual message


def test_array_request_parameters_are_typed() -> None:
    hints = typing.get_type_hints(ArrayRequest.__init__)
    assert hints["shape"] != typing.Any and hints["unchunkable"] is bool and hints["zero"] is bool
    assert "Sequence" in str(inspect.signature(ArrayRequest).parameters["shape"].annotation)


def test_like_takes_shape_and_dtype_from_an_array() -> None:
    host = np.zeros((8, 1000), np.float32)
    request = ArrayRequest.like(host, chunk_axis=1, zero=True)
    assert request == ArrayRequest((8, 1000), np.float32, chunk_axis=1, zero=True)
    assert ArrayRequest.like(host, kind="pinned", unchunkable=True).kind.value == "pinned"
    with pytest.raises(InvalidRequestError, match="shape and a dtype, got list"):
        ArrayRequest.like([1.0, 2.0])
    with pytest.raises(InvalidRequestError, match="not supported on the GPU"):
        ArrayRequest.like(np.array(["text"]))
