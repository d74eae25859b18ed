"""Unit and property tests of the coordinated chunk planner (aiocubie._planner)."""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from aiocubie._errors import (
    AiocubieWarning,
    InsufficientMemoryError,
    InvalidRequestError,
    PlanningError,
    RunLengthMismatchError,
    UnchunkableTooLargeError,
)
from aiocubie._planner import OVERSUBSCRIPTION_WARNING, ChunkPlan, offered_bytes, plan_batch, plan_chunks
from aiocubie._requests import ArrayRequest, ArrayResponse, MemoryKind, check_requests

FAST = settings(max_examples=200, deadline=None)
VRAM_KINDS = ("device", "managed")
HOST_KINDS = ("pinned", "host", "mapped")


@pytest.fixture(autouse=True)
def _warnings_are_errors() -> Any:
    """An unexpected AiocubieWarning fails the test; expected ones use pytest.warns."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", AiocubieWarning)
        yield


@contextlib.contextmanager
def no_warning() -> Iterator[None]:
    """Any warning inside fails the test."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def req(shape: Any, dtype: Any = "float32", **kw: Any) -> ArrayRequest:
    return ArrayRequest(shape=shape, dtype=dtype, **kw)


# -- offered_bytes ---------------------------------------------------------------------------
class TestOfferedBytes:
    def test_headroom_bound(self) -> None:
        assert offered_bytes(1000, 10_000, headroom=0.1, granule=0) == 900

    def test_free_minus_granule_bound(self) -> None:
        assert offered_bytes(1000, 500, headroom=0.1, granule=100) == 400

    def test_no_headroom(self) -> None:
        assert offered_bytes(1000, 10_000, headroom=0.0, granule=0) == 1000

    def test_floor(self) -> None:
        assert offered_bytes(999, 10_000, headroom=0.5, granule=0) == 499

    def test_never_negative(self) -> None:
        assert offered_bytes(1000, 50, headroom=0.0, granule=100) == 0
        assert offered_bytes(0, 0, headroom=0.0, granule=0) == 0
        assert offered_bytes(-10, 1000, headroom=0.0, granule=0) == 0

    def test_returns_int(self) -> None:
        assert type(offered_bytes(1000, 10_000, headroom=0.25, granule=0)) is int

    @FAST
    @given(
        available=st.integers(-(2**20), 2**48),
        free=st.integers(-(2**20), 2**48),
        headroom=st.floats(0.0, 0.999),
        granule=st.integers(0, 2**24),
    )
    def test_formula(self, available: int, free: int, headroom: float, granule: int) -> None:
        got = offered_bytes(available, free, headroom=headroom, granule=granule)
        assert type(got) is int
        assert got >= 0
        assert got <= max(0, free - granule)
        assert got <= max(0, available)
        # exact rational arithmetic (sizes here are under 2**53, where float rounding is exact)
        from fractions import Fraction

        exact = max(0, min(math.floor((1 - Fraction(headroom)) * available), free - granule))
        assert abs(got - exact) <= 1


# -- plan_batch: examples ----------------------------------------------------------------------
class TestPlanExamples:
    def test_fits_is_one_chunk(self) -> None:
        batch = {
            "solver": {
                "state": req((8, 1000), chunk_axis=1),
                "params": req((16,), "float64", unchunkable=True),
            }
        }
        plan = plan_batch(batch, offered=10**6)
        full = 8 * 1000 * 4 + 16 * 8
        assert plan == ChunkPlan(
            runs=1000, chunks=1, chunk_length=1000, offered=10**6, planned_bytes=full, full_bytes=full
        )

    def test_exactly_fits_is_one_chunk(self) -> None:
        plan = plan_batch({"a": {"x": req((100,), "int8")}}, offered=100)
        assert (plan.chunks, plan.chunk_length, plan.planned_bytes) == (1, 100, 100)

    def test_one_byte_short_chunks(self) -> None:
        plan = plan_batch({"a": {"x": req((100,), "int8")}}, offered=99)
        # max_chunk = 99, chunks = ceil(100 / 99) = 2, chunk_length = 50
        assert (plan.chunks, plan.chunk_length, plan.planned_bytes) == (2, 50, 50)

    def test_design_formula(self) -> None:
        # docs/architecture.md (chunk planning): ratio = chunkable / (offered - unchunkable), max_chunk = floor(runs / ratio),
        # chunks = ceil(runs / max_chunk), chunk_length = ceil(runs / chunks).
        batch = {
            "solver": {
                "state": req((8, 1_000_000), "float32", chunk_axis=1),  # 32 B per run
                "params": req((16,), "float64", unchunkable=True),  # 128 B
            },
            "loader": {"obs": req((1_000_000, 2), "float64", chunk_axis=0)},  # 16 B per run
        }
        offered = 10_000_128
        plan = plan_batch(batch, offered)
        chunkable = 48 * 1_000_000
        ratio = chunkable / (offered - 128)  # 4.8
        max_chunk = math.floor(1_000_000 / ratio)  # 208333
        chunks = math.ceil(1_000_000 / max_chunk)  # 5
        chunk_length = math.ceil(1_000_000 / chunks)  # 200000
        assert (max_chunk, chunks, chunk_length) == (208333, 5, 200_000)
        assert plan.runs == 1_000_000
        assert plan.chunks == chunks
        assert plan.chunk_length == chunk_length
        assert plan.planned_bytes == 128 + 48 * 200_000
        assert plan.full_bytes == 128 + 48 * 1_000_000
        assert plan.offered == offered
        assert plan.planned_bytes <= offered

    def test_design_formula_uneven(self) -> None:
        # 10 runs of 10 bytes, 35 bytes offered: max_chunk 3, 4 chunks of ceil(10/4) = 3.
        plan = plan_batch({"a": {"x": req((10, 10), "int8")}}, offered=35)
        assert (plan.chunks, plan.chunk_length, plan.planned_bytes) == (4, 3, 30)

    def test_chunk_length_balanced(self) -> None:
        # max_chunk 6 for 13 runs: 3 chunks; balanced chunk_length 5, not 6.
        plan = plan_batch({"a": {"x": req((13,), "int8")}}, offered=6)
        assert (plan.chunks, plan.chunk_length) == (3, 5)

    def test_one_run_per_chunk(self) -> None:
        plan = plan_batch({"a": {"x": req((7, 4), "int8")}}, offered=4)
        assert (plan.chunks, plan.chunk_length, plan.planned_bytes) == (7, 1, 4)

    def test_unchunkable_keep_shape(self) -> None:
        params = req((16, 3), "float64", unchunkable=True)
        state = req((4, 100), "float32", chunk_axis=-1)
        plan = plan_batch({"a": {"params": params, "state": state}}, offered=16 * 3 * 8 + 16 * 25)
        assert plan.chunks == 4 and plan.chunk_length == 25
        assert params.chunked_shape(plan.chunk_length) == (16, 3)
        assert state.chunked_shape(plan.chunk_length) == (4, 25)
        assert plan.planned_bytes == 16 * 3 * 8 + 16 * 25

    def test_empty_batch(self) -> None:
        plan = plan_batch({}, offered=0)
        assert plan == ChunkPlan(0, 1, 0, 0, 0, 0)
        plan = plan_batch({"a": {}, "b": {}}, offered=100)
        assert (plan.runs, plan.chunks, plan.full_bytes) == (0, 1, 0)

    def test_only_unchunkable(self) -> None:
        plan = plan_batch({"a": {"p": req((10,), "int8", unchunkable=True)}}, offered=10)
        assert (plan.runs, plan.chunks, plan.chunk_length, plan.planned_bytes) == (0, 1, 0, 10)

    def test_zero_runs(self) -> None:
        plan = plan_batch({"a": {"x": req((0, 5), "int8")}}, offered=0)
        assert (plan.runs, plan.chunks, plan.chunk_length, plan.planned_bytes) == (0, 1, 0, 0)


# -- plan_batch: errors and warnings ---------------------------------------------------------
class TestPlanErrors:
    def test_unchunkable_too_large(self) -> None:
        batch = {"a": {"p": req((100,), "int8", unchunkable=True), "x": req((10,), "int8")}}
        with pytest.raises(UnchunkableTooLargeError, match="need 100 bytes but only 99") as info:
            plan_batch(batch, offered=99)
        assert isinstance(info.value, PlanningError)

    def test_unchunkable_exactly_offered_no_run_fits(self) -> None:
        batch = {"a": {"p": req((100,), "int8", unchunkable=True), "x": req((10,), "int8")}}
        with pytest.raises(InsufficientMemoryError, match="not even one run fits"):
            plan_batch(batch, offered=100)

    def test_insufficient_memory(self) -> None:
        batch = {"a": {"x": req((10, 50), "int8")}}  # 50 B per run
        with pytest.raises(InsufficientMemoryError, match="one run needs 50 bytes") as info:
            plan_batch(batch, offered=49)
        assert isinstance(info.value, PlanningError)
        assert "49" in str(info.value)
        assert plan_batch(batch, offered=50).chunk_length == 1

    def test_zero_offered(self) -> None:
        with pytest.raises(InsufficientMemoryError):
            plan_batch({"a": {"x": req((10,), "int8")}}, offered=0)

    def test_run_length_mismatch_in_one_instance(self) -> None:
        batch = {"a": {"x": req((10, 3), chunk_axis=0), "y": req((3, 11), chunk_axis=1)}}
        with pytest.raises(RunLengthMismatchError, match=r"'x' has 10 runs.*'y' has 11") as info:
            plan_batch(batch, offered=10**9)
        assert isinstance(info.value, InvalidRequestError)

    def test_run_length_mismatch_across_instances(self) -> None:
        batch = {"a": {"x": req((10,))}, "b": {"z": req((12,))}}
        with pytest.raises(RunLengthMismatchError, match="'z' has 12"):
            plan_batch(batch, offered=10**9)

    def test_run_length_mismatch_with_host_array(self) -> None:
        batch = {"a": {"x": req((10,))}, "b": {"h": req((12,), kind="pinned")}}
        with pytest.raises(RunLengthMismatchError):
            plan_batch(batch, offered=10**9)

    def test_unchunkable_does_not_count_for_run_length(self) -> None:
        batch = {"a": {"x": req((10,)), "p": req((12,), unchunkable=True)}, "b": {"y": req((2, 10), chunk_axis=1)}}
        assert plan_batch(batch, offered=10**9).runs == 10

    def test_oversubscription_warning(self) -> None:
        batch = {"a": {"x": req((2101,), "int8")}}
        with pytest.warns(AiocubieWarning, match=r"2101 bytes, more than 20x the 105 bytes free"):
            plan = plan_batch(batch, offered=100, free=105)
        assert plan.chunks == 22

    def test_oversubscription_boundary(self) -> None:
        batch = {"a": {"x": req((2100,), "int8")}}
        with no_warning():
            assert plan_batch(batch, offered=100, free=105).chunks == 21  # exactly 20x
            plan_batch(batch, offered=10**6)  # free unknown

    def test_no_oversubscription_warning_before_an_error(self) -> None:
        batch = {"a": {"x": req((1000,), "int8"), "p": req((500,), "int8", unchunkable=True)}}
        with no_warning(), pytest.raises(UnchunkableTooLargeError):
            plan_batch(batch, offered=10, free=10)
        with no_warning(), pytest.raises(InsufficientMemoryError):
            plan_batch({"a": {"x": req((1000, 50), "int8")}}, offered=10, free=10)

    def test_oversubscription_zero_free(self) -> None:
        with pytest.warns(AiocubieWarning):
            plan_batch({"a": {"x": req((21,), "int8")}}, offered=21, free=0)
        with no_warning():
            plan_batch({"a": {"x": req((20,), "int8")}}, offered=20, free=0)

    def test_oversubscription_counts_only_vram(self) -> None:
        with no_warning():
            plan_batch({"a": {"x": req((10**6,), "int8", kind="pinned")}}, offered=0, free=1)
        with pytest.warns(AiocubieWarning, match="1000000 bytes, more than 20x the 1 bytes free"):
            plan_batch({"a": {"x": req((10**6,), "int8", kind="managed")}}, offered=10**6, free=1)

    def test_not_even_one_run_hints_at_a_chunk_axis_that_looks_wrong(self) -> None:
        # 8 "runs" of a million elements: the runs are along axis 1, but chunk_axis defaults to 0
        batch = {"a": {"state": req((8, 10**6), "float32")}}
        with pytest.raises(InsufficientMemoryError, match="not even one run fits") as info:
            plan_batch(batch, offered=10**6)
        assert "'state' (shape (8, 1000000)) is chunked along axis 0, of 8 runs" in str(info.value)
        assert "pass chunk_axis=1" in str(info.value)
        assert plan_batch({"a": {"state": req((8, 10**6), "float32", chunk_axis=1)}}, offered=10**6).chunks == 32

    def test_not_even_one_run_gives_no_hint_for_a_likely_axis(self) -> None:
        with pytest.raises(InsufficientMemoryError) as info:
            plan_batch({"a": {"state": req((1000, 100), "float32")}}, offered=100)
        assert "chunk_axis=" not in str(info.value)

    def test_the_remedy_of_a_passive_plan_names_no_proportion(self) -> None:
        with pytest.raises(UnchunkableTooLargeError) as info:
            plan_chunks(0, 100, 0, 99, passive=True)
        assert "proportion" not in str(info.value) and "release arrays" in str(info.value)
        with pytest.raises(UnchunkableTooLargeError, match="raise the group's proportion"):
            plan_chunks(0, 100, 0, 99)


# -- host kinds ------------------------------------------------------------------------------
class TestHostKinds:
    @pytest.mark.parametrize("kind", HOST_KINDS)
    def test_host_kinds_cost_nothing_but_share_the_plan(self, kind: str) -> None:
        batch = {
            "a": {"x": req((100, 4), "int8")},
            "b": {"h": req((100, 1000), "float64", kind=kind)},
        }
        plan = plan_batch(batch, offered=200)
        assert plan.runs == 100
        assert plan.full_bytes == 400
        assert (plan.chunks, plan.chunk_length, plan.planned_bytes) == (2, 50, 200)
        resp = ArrayResponse(
            arrays={},
            chunks=plan.chunks,
            chunk_length=plan.chunk_length,
            runs=plan.runs,
            chunked_shapes={"h": batch["b"]["h"].chunked_shape(plan.chunk_length)},
            chunk_axes={"h": 0},
            stream=None,
        )
        assert resp.chunked_shapes["h"] == (50, 1000)  # chunked in lockstep
        assert list(resp.chunk_ranges()) == [(0, 50), (50, 100)]

    @pytest.mark.parametrize("kind", HOST_KINDS)
    def test_host_only_batch_fits_in_nothing(self, kind: str) -> None:
        batch = {"a": {"h": req((100, 1000), kind=kind), "p": req((10**6,), kind=kind, unchunkable=True)}}
        plan = plan_batch(batch, offered=0)
        assert (plan.runs, plan.chunks, plan.chunk_length, plan.planned_bytes) == (100, 1, 100, 0)

    def test_managed_counts(self) -> None:
        with pytest.raises(InsufficientMemoryError):
            plan_batch({"a": {"m": req((10, 8), "int8", kind="managed")}}, offered=7)
        assert plan_batch({"a": {"m": req((10, 8), "int8", kind="managed")}}, offered=16).chunks == 5

    def test_host_unchunkable_cannot_be_too_large(self) -> None:
        batch = {"a": {"x": req((10,), "int8"), "p": req((10**9,), "int8", unchunkable=True, kind="host")}}
        assert plan_batch(batch, offered=5).chunks == 2


# -- property tests ----------------------------------------------------------------------------
DTYPES = ["bool", "int8", "uint16", "float16", "int32", "float32", "float64", "complex64", "complex128"]


@st.composite
def batches(draw: Any, max_runs: int = 60) -> tuple[dict[str, dict[str, ArrayRequest]], int, list[Any]]:
    """A random batch sharing one run length; also our own record of every array, so the
    bytes can be recomputed without trusting ArrayRequest's derived fields.

    Returns ``(batch, runs, specs)``; each spec is ``(shape, axis or None, itemsize, vram)``.
    """
    runs = draw(st.one_of(st.integers(2, max_runs), st.integers(2, max_runs), st.integers(0, 3)))
    batch: dict[str, dict[str, ArrayRequest]] = {}
    specs: list[Any] = []
    for i in range(draw(st.integers(1, 4))):
        arrays: dict[str, ArrayRequest] = {}
        for j in range(draw(st.integers(0, 4))):
            dtype = np.dtype(draw(st.sampled_from(DTYPES)))
            kind = draw(st.sampled_from(VRAM_KINDS * 3 + HOST_KINDS))
            unchunkable = draw(st.integers(0, 3)) == 0
            ndim = draw(st.integers(0 if unchunkable else 1, 3))
            shape = draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim))
            if draw(st.integers(0, 15)) == 0 and ndim:  # now and then an empty array
                shape[draw(st.integers(0, ndim - 1))] = 0
            axis: int | None = None
            given_axis = 0
            if not unchunkable:
                axis = draw(st.integers(0, ndim - 1))
                shape[axis] = runs
                given_axis = axis - ndim if draw(st.booleans()) else axis  # negative axes too
            request = ArrayRequest(
                shape=tuple(shape),
                dtype=dtype,
                kind=kind,
                chunk_axis=given_axis,
                unchunkable=unchunkable,
            )
            label = f"i{i}a{j}"
            arrays[label] = request
            specs.append((tuple(shape), axis, dtype.itemsize, kind in VRAM_KINDS, label, i))
        batch[f"inst{i}"] = arrays
    if all(axis is None for _, axis, *_ in specs):
        runs = 0  # nothing chunkable: the batch has no run axis
    elif runs == 1:  # a run axis of length 1 is not chunked (as cubie plans it): its arrays are fixed
        specs = [(shape, None, *rest) for shape, _, *rest in specs]
    return batch, runs, specs


def vram_bytes(specs: list[Any], chunk_length: int) -> int:
    """VRAM bytes of the batch with the run axis cut to ``chunk_length`` (our own arithmetic)."""
    total = 0
    for shape, axis, itemsize, vram, _, _ in specs:
        if not vram:
            continue
        dims = list(shape)
        if axis is not None:
            dims[axis] = min(chunk_length, dims[axis])
        total += math.prod(dims) * itemsize
    return total


def planned_bytes_via_requests(batch: dict[str, dict[str, ArrayRequest]], chunk_length: int) -> int:
    return sum(
        math.prod(r.chunked_shape(chunk_length)) * r.dtype.itemsize
        for arrays in batch.values()
        for r in arrays.values()
        if r.kind in (MemoryKind.DEVICE, MemoryKind.MANAGED)
    )


def offers(specs: list[Any], runs: int) -> st.SearchStrategy[int]:
    """Offers biased to where the planner has to chunk: between one run and the whole batch."""
    fixed, one, full = vram_bytes(specs, 0), vram_bytes(specs, 1), vram_bytes(specs, runs)
    return st.one_of(
        st.integers(one, max(one, full - 1)),
        st.integers(one, max(one, full - 1)),
        st.integers(0, 2 * full + 64),
        st.sampled_from([0, 1, fixed - 1, fixed, fixed + 1, one - 1, one, full - 1, full, full + 1]),
    ).filter(lambda n: n >= 0)


def _plan(batch: Any, offered: int, free: int | None) -> tuple[Any, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result: Any = plan_batch(batch, offered, free=free)
        except PlanningError as exc:
            result = exc
    return result, [w for w in caught if issubclass(w.category, AiocubieWarning)]


@FAST
@given(data=st.data())
def test_plan_is_correct_and_minimal(data: st.DataObject) -> None:
    batch, runs, specs = data.draw(batches())
    full = vram_bytes(specs, runs)
    fixed = vram_bytes(specs, 0)  # the unchunkable VRAM arrays alone
    offered = data.draw(offers(specs, runs), label="offered")
    free = data.draw(st.one_of(st.none(), st.integers(0, full + 8), st.integers(0, full // 19 + 2)), label="free")

    result, warned = _plan(batch, offered, free)

    # the 20x warning, for a batch planned (never before an error)
    planned = not isinstance(result, Exception)
    assert bool(warned) == (planned and free is not None and full > 20 * max(free, 1))

    fits = full <= offered
    if isinstance(result, UnchunkableTooLargeError):
        assert not fits and fixed > offered
        return
    if isinstance(result, InsufficientMemoryError):
        assert not fits and fixed <= offered
        assert vram_bytes(specs, 1) > offered  # not even one run fits
        assert runs >= 1
        return
    assert not isinstance(result, Exception), result
    plan = result
    assert isinstance(plan, ChunkPlan)

    # the plan's own fields agree with our arithmetic
    assert plan.runs == runs
    assert plan.offered == offered
    assert plan.full_bytes == full
    assert plan.planned_bytes == vram_bytes(specs, plan.chunk_length)
    assert plan.planned_bytes == planned_bytes_via_requests(batch, plan.chunk_length)

    # it fits
    assert vram_bytes(specs, plan.chunk_length) <= offered
    # it covers every run, with no empty chunk
    assert plan.chunks >= 1
    assert plan.chunks * plan.chunk_length >= runs
    assert (plan.chunks - 1) * plan.chunk_length < runs or (runs == 0 and plan.chunks == 1)
    assert plan.chunk_length == (-(-runs // plan.chunks) if runs else 0)
    # one chunk iff the whole batch fits
    assert (plan.chunks == 1) == fits
    if fits:
        assert plan.chunk_length == runs
    # minimal: every smaller chunk count needs a chunk length that does not fit
    for fewer in range(1, plan.chunks):
        assert vram_bytes(specs, -(-runs // fewer)) > offered, fewer
    # and the errors were not owed
    assert fits or fixed <= offered
    assert fits or vram_bytes(specs, 1) <= offered

    # unchunkable arrays keep their shape; chunkable ones are cut on their own axis
    for shape, axis, _, _, label, i in specs:
        request = batch[f"inst{i}"][label]
        chunked = request.chunked_shape(plan.chunk_length)
        if axis is None:
            assert chunked == shape
        else:
            assert chunked == (*shape[:axis], plan.chunk_length, *shape[axis + 1 :])

    # walking the chunks covers [0, runs) exactly once
    resp = ArrayResponse(
        arrays={},
        chunks=plan.chunks,
        chunk_length=plan.chunk_length,
        runs=plan.runs,
        chunked_shapes={},
        chunk_axes={},
        stream=None,
    )
    ranges = list(resp.chunk_ranges())
    covered = [r for start, stop in ranges for r in range(start, stop)]
    assert covered == list(range(runs))


@FAST
@given(data=st.data())
def test_outcome_is_determined_by_the_documented_conditions(data: st.DataObject) -> None:
    """Exactly one outcome, chosen by fits / unchunkable-too-large / one-run-fits, in that order."""
    batch, runs, specs = data.draw(batches())
    full = vram_bytes(specs, runs)
    fixed = vram_bytes(specs, 0)
    one_run = vram_bytes(specs, 1)
    offered = data.draw(
        st.sampled_from(sorted({0, fixed - 1, fixed, fixed + 1, one_run - 1, one_run, full - 1, full, full + 1} - {-1}))
    )
    result, _ = _plan(batch, offered, None)
    if full <= offered:
        expected: type = ChunkPlan
    elif fixed > offered:
        expected = UnchunkableTooLargeError
    elif one_run > offered:
        expected = InsufficientMemoryError
    else:
        expected = ChunkPlan
    assert type(result) is expected, (result, full, fixed, one_run, offered)


@FAST
@given(data=st.data())
def test_monotone_in_offered(data: st.DataObject) -> None:
    """More memory never means more chunks, and a batch that plans keeps planning."""
    batch, runs, specs = data.draw(batches())
    full = vram_bytes(specs, runs)
    a = data.draw(offers(specs, runs))
    b = data.draw(st.integers(a, a + full + 8))
    ra, _ = _plan(batch, a, None)
    rb, _ = _plan(batch, b, None)
    if isinstance(ra, ChunkPlan):
        assert isinstance(rb, ChunkPlan)
        assert rb.chunks <= ra.chunks
        assert rb.chunk_length >= ra.chunk_length
    if isinstance(rb, UnchunkableTooLargeError):
        assert isinstance(ra, UnchunkableTooLargeError)


@FAST
@given(data=st.data())
def test_host_arrays_do_not_change_the_plan(data: st.DataObject) -> None:
    """Dropping host arrays (or switching them between host kinds) never changes the plan,
    as long as a VRAM array fixes the run length."""
    batch, runs, specs = data.draw(batches())
    offered = data.draw(offers(specs, runs))
    stripped = {inst: {label: r for label, r in arrays.items() if r.kind.uses_vram} for inst, arrays in batch.items()}
    swapped = {
        inst: {
            label: r
            if r.kind.uses_vram
            else ArrayRequest(
                shape=r.shape,
                dtype=r.dtype,
                chunk_axis=r.chunk_axis,
                unchunkable=r.unchunkable,
                kind=data.draw(st.sampled_from(HOST_KINDS)),
            )
            for label, r in arrays.items()
        }
        for inst, arrays in batch.items()
    }
    r0, _ = _plan(batch, offered, None)
    r1, _ = _plan(swapped, offered, None)
    assert type(r0) is type(r1)
    if isinstance(r0, ChunkPlan):
        assert r0 == r1
    has_vram_chunkable = any(r.kind.uses_vram and not r.unchunkable for a in batch.values() for r in a.values())
    r2, _ = _plan(stripped, offered, None)
    assert type(r0) is type(r2)
    if isinstance(r0, ChunkPlan):
        assert (r0.chunks, r0.planned_bytes, r0.full_bytes) == (r2.chunks, r2.planned_bytes, r2.full_bytes)
        if has_vram_chunkable:
            assert r0 == r2


@FAST
@given(data=st.data())
def test_run_length_mismatch_detected(data: st.DataObject) -> None:
    batch, runs, _ = data.draw(batches())
    chunkable = [(inst, label) for inst, a in batch.items() for label, r in a.items() if not r.unchunkable]
    assume(len(chunkable) >= 2 and runs > 1)  # a mismatch needs two chunkable arrays of several runs
    inst, label = data.draw(st.sampled_from(chunkable))
    old = batch[inst][label]
    other = data.draw(st.integers(2, 70).filter(lambda n: n != runs))  # 0 and 1 runs agree with any length
    shape = list(old.shape)
    shape[old.chunk_axis] = other
    batch[inst][label] = ArrayRequest(shape=tuple(shape), dtype=old.dtype, kind=old.kind, chunk_axis=old.chunk_axis)
    offered = data.draw(st.integers(0, 10**9))
    with pytest.raises(RunLengthMismatchError, match=f"has {other}|has {runs}"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AiocubieWarning)
            plan_batch(batch, offered)


# issue 11 item 16: a zero-length run axis batched with a 1,000-run request
def test_an_empty_run_axis_is_planned_with_any_run_length() -> None:
    empty = {"z": req((0, 10**6), "float64")}  # no runs, though one run would be 8 MB
    thousand = {"k": req((1000,), "float32")}
    plan = plan_batch({"a": empty, "b": thousand}, 4000)
    assert (plan.runs, plan.chunks, plan.chunk_length, plan.full_bytes) == (1000, 1, 1000, 4000)
    assert plan_batch({"b": thousand, "a": empty}, 4000) == plan
    chunked = plan_batch({"a": empty, "b": thousand}, 1000)  # the empty array costs nothing per run
    assert (chunked.chunks, chunked.chunk_length, chunked.planned_bytes) == (4, 250, 1000)
    alone = plan_batch({"a": empty}, 0)
    assert (alone.runs, alone.chunks, alone.chunk_length, alone.full_bytes) == (0, 1, 0, 0)


def test_order_of_instances_does_not_matter() -> None:
    a = {"x": req((40, 3), "float64")}
    b = {"y": req((5, 40), "int8", chunk_axis=1), "p": req((7,), unchunkable=True)}
    assert plan_batch({"a": a, "b": b}, 500) == plan_batch({"b": b, "a": a}, 500)


def test_oversubscription_constant() -> None:
    assert OVERSUBSCRIPTION_WARNING == 20


# issue 25: a run axis of length 1 is planned as cubie plans it (unchunkable), beside N runs
def test_a_length_one_run_axis_is_fixed_beside_n_runs() -> None:
    params = {"p": req((3, 1), "float64", chunk_axis=1)}  # one run's parameters: 24 bytes
    states = {"s": req((2, 100), "float32", chunk_axis=1)}  # 8 bytes per run
    plan = plan_batch({"a": params, "b": states}, 10**6)
    assert (plan.runs, plan.chunks, plan.chunk_length, plan.full_bytes) == (100, 1, 100, 824)
    chunked = plan_batch({"a": params, "b": states}, 24 + 8 * 30)  # the 24 bytes are fixed, not per run
    assert (chunked.chunks, chunked.chunk_length, chunked.planned_bytes) == (4, 25, 24 + 8 * 25)
    assert params["p"].chunked_shape(25) == (3, 1)
    assert check_requests({**params, **states}).chunk_axes == {"p": None, "s": 1}  # whole slices per chunk


# issue 25: a batch of one run (only length-1 run axes) reports its run: chunk_length 1, not 0
def test_a_one_run_batch_reports_its_run() -> None:
    one = {"x": req((4, 1), "float32", chunk_axis=1), "y": req((1,), "int32")}
    plan = plan_batch({"a": one}, 10**6)
    assert (plan.runs, plan.chunks, plan.chunk_length, plan.full_bytes) == (1, 1, 1, 20)
    assert check_requests(one).runs == 1
    with pytest.raises(UnchunkableTooLargeError):  # nothing to cut: a run that does not fit is fixed bytes
        plan_batch({"a": one}, 19)
