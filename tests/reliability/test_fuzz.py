"""Fuzzed input over every public entry point: only documented errors, never a crash or half a change.

A bad argument raises an AiocubieError subclass whose message names the bad value; no TypeError,
AttributeError or KeyError leaks out, and a failed call leaves the manager as it was.
"""

from __future__ import annotations

import enum
import math
import warnings
from collections.abc import Mapping
from typing import Any

import anyio
import numpy as np
import pytest
from _reliability import Component
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from aiocubie import ArrayRequest, MemoryKind, MemoryManager
from aiocubie._errors import shown
from aiocubie.errors import AiocubieError, BudgetError, ConfigurationError, InvalidRequestError, RegistrationError
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.filterwarnings("ignore::aiocubie.errors.AiocubieWarning")  # budgets near full warn

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# anything a caller might pass by mistake, besides well-formed values
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=4),
    st.lists(st.integers(-3, 3), max_size=3),
    st.tuples(st.integers(-3, 3), st.text(max_size=2)),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.just(object()),
    st.just(np.array([1, 2])),
    st.just(float("nan")),
    st.just(math.inf),
    st.just(np.float64(0.5)),
    st.just(np.int64(3)),
    st.just(1 + 2j),
)


def names_value(exc: BaseException, value: Any) -> bool:
    """True if the error message shows ``value`` the way a user would recognise it."""
    message = str(exc)
    forms = {repr(value), str(value), shown(value)}  # shown(): a huge value is named cut short
    if isinstance(value, (list, tuple)):
        forms.add(repr(tuple(value)))
    if isinstance(value, float) and value.is_integer():
        forms.add(str(int(value)))
    if isinstance(value, enum.Enum):
        forms.add(repr(value.value))
    try:  # a dtype given as a type or code ('O', object) is shown as numpy names it
        # numpy's own advice on a drawn value (a deprecated 'a', numpy 1.x's (type, 1)) is not what
        # this helper reads: no warnings summary
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            forms.add(f"dtype {np.dtype(value)}")
    except Exception:
        pass
    return any(form in message for form in forms)


def check_error(exc: BaseException, value: Any, *types: type[AiocubieError]) -> None:
    assert isinstance(exc, types or (AiocubieError,)), f"{type(exc).__name__}: {exc}"
    assert names_value(exc, value), f"the message does not name {value!r}: {exc}"


# -- ArrayRequest -------------------------------------------------------------------------------

shapes = st.one_of(
    st.integers(-5, 50),
    st.lists(st.integers(-2, 40), max_size=4),
    st.tuples(st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 2**20)),
    junk,
)
dtypes = st.one_of(
    st.sampled_from(["float32", "f8", "int8", "uint64", "bool", "complex64", "U4", "S3", "O", "V8", "M8[s]"]),
    st.sampled_from([np.float32, int, float, bool, complex, str, object, np.dtype("f4,i4")]),
    junk,
)
kinds = st.one_of(st.sampled_from([k.value for k in MemoryKind]), st.sampled_from(list(MemoryKind)), junk)


@pytest.mark.filterwarnings("ignore:Data type alias:DeprecationWarning")  # numpy's own, for junk text like 'a'
@FUZZ
@given(shape=shapes, dtype=dtypes, kind=kinds, axis=st.one_of(st.integers(-6, 6), junk), flags=st.tuples(junk, junk))
@example(shape=[], dtype="float32", kind="device", axis=1, flags=(False, False))  # once named no field
def test_array_request_accepts_or_names_the_bad_field(shape: Any, dtype: Any, kind: Any, axis: Any, flags: Any) -> None:
    unchunkable, zero = flags
    fields = {
        "shape": shape,
        "dtype": dtype,
        "kind": kind,
        "chunk_axis": axis,
        "unchunkable": unchunkable,
        "zero": zero,
    }
    try:
        request = ArrayRequest(**fields)
    except AiocubieError as exc:
        assert isinstance(exc, InvalidRequestError), exc
        bad = [v for v in fields.values() if names_value(exc, v)]
        assert bad or "2**63" in str(exc) or "dtype is required" in str(exc), f"names no field: {exc}"
        return
    except Exception as exc:
        pytest.fail(f"ArrayRequest({fields!r}) raised {type(exc).__name__}: {exc}")
    assert request.nbytes == math.prod(request.shape) * request.dtype.itemsize < 2**63
    assert request.dtype.kind in "biufc"
    assert request.unchunkable or 0 <= request.chunk_axis < len(request.shape)
    assert isinstance(request.kind, MemoryKind)


@FUZZ
@given(value=st.one_of(kinds, st.text()))
def test_memory_kind_parse(value: Any) -> None:
    try:
        kind = MemoryKind.parse(value)
    except Exception as exc:
        check_error(exc, value, InvalidRequestError)
    else:
        assert kind.value == getattr(value, "value", value)


# -- the manager's synchronous entry points ------------------------------------------------------


def budget_state(mgr: MemoryManager) -> tuple[object, ...]:
    groups = {name: members for name, members in mgr.groups.members().items() if members}  # groups stay once made
    return (mgr.budget.manual_pool, mgr.budget.auto_pool, groups, len(mgr.statistics().members))


@pytest.fixture(scope="module")
def manager() -> MemoryManager:
    """One manager for many examples (not running: registration and budgets need no loop)."""
    mgr = MemoryManager(SimulatorBackend(1 << 30))
    mgr.keep = [Component(share) for share in (0.3, 0.2)]  # type: ignore[attr-defined]  # or they are collected
    for member in mgr.keep:  # type: ignore[attr-defined]
        mgr.register(member, proportion=member.tag, name=f"manual {member.tag}")
    return mgr


proportions = st.one_of(st.none(), st.floats(0.0001, 0.2), junk, st.fractions(-2, 2), st.decimals(-2, 2))
group_names = st.one_of(st.sampled_from(["default", "solve", "load"]), st.text(max_size=6), junk)
hooks = st.one_of(st.none(), st.just(print), st.just(lambda *a: None), junk)


@FUZZ
@given(
    proportion=proportions,
    group=group_names,
    inv=hooks,
    ready=hooks,
    name=st.one_of(st.none(), st.text(max_size=6), junk),
)
def test_register_registers_wholly_or_not_at_all(
    manager: MemoryManager, proportion: Any, group: Any, inv: Any, ready: Any, name: Any
) -> None:
    instance = Component()
    before = budget_state(manager)
    args = {"proportion": proportion, "stream_group": group, "invalidate_hook": inv, "ready_hook": ready, "name": name}
    try:
        manager.register(instance, **args)
    except Exception as exc:
        assert isinstance(exc, (RegistrationError, BudgetError)), f"{type(exc).__name__}: {exc}"
        assert not manager.is_registered(instance)
        assert budget_state(manager) == before
        if "would sum to" not in str(exc):  # over budget: the message gives the sums instead
            assert any(names_value(exc, v) for v in args.values()), exc
        return
    try:
        assert manager.is_registered(instance)
        assert manager.groups.group_of(instance) == group
        assert 0 < manager.budget.proportion(instance) <= 1
        if proportion is not None:
            assert manager.budget.proportion(instance) == pytest.approx(float(proportion))
    finally:
        manager.unregister(instance)
    assert budget_state(manager) == before


@FUZZ
@given(proportion=st.one_of(st.floats(0.01, 0.3), junk, st.fractions(-2, 2)))
def test_set_manual_proportion_changes_wholly_or_not_at_all(manager: MemoryManager, proportion: Any) -> None:
    instance = Component()
    manager.register(instance)
    try:
        before = (budget_state(manager), manager.budget.proportion(instance))
        try:
            manager.budget.set_manual(instance, proportion)
        except Exception as exc:
            assert isinstance(exc, BudgetError), f"{type(exc).__name__}: {exc}"
            assert (budget_state(manager), manager.budget.proportion(instance)) == before
            if "would sum to" not in str(exc):
                check_error(exc, proportion)
        else:
            assert manager.budget.proportion(instance) == pytest.approx(float(proportion))
    finally:
        manager.unregister(instance)


@FUZZ
@given(name=group_names)
def test_group_names_everywhere(manager: MemoryManager, name: Any) -> None:
    instance = Component()
    manager.register(instance, stream_group="default")
    try:
        for call in (
            lambda: manager.groups.flush(name),
            lambda: manager.budget.available(name),
            lambda: manager.groups.move(instance, name),
        ):
            try:
                call()
            except Exception as exc:
                check_error(exc, name, RegistrationError)
    finally:
        manager.unregister(instance)


@FUZZ
@given(label=st.one_of(st.text(max_size=4), junk), value=st.one_of(st.just(ArrayRequest((4,), "f4")), junk))
def test_request_mappings_and_labels(manager: MemoryManager, label: Any, value: Any) -> None:
    instance = Component()
    manager.register(instance)
    try:
        mappings = [{label: value}] if isinstance(label, (str, int, float, bytes, type(None))) else []
        for requests in (*mappings, [(label, value)], label):
            try:
                manager.request(instance, requests)
            except Exception as exc:
                assert isinstance(exc, InvalidRequestError), f"{type(exc).__name__}: {exc}"
                parts = [requests, *(x for item in getattr(requests, "items", dict)() for x in item)]
                assert any(names_value(exc, part) for part in parts) or type(requests).__name__ in str(exc), exc
            else:
                assert isinstance(requests, Mapping)
        for call in (lambda: manager.free(label), lambda: manager.release(value)):
            try:
                call()  # free/release of what was never handed out is a no-op or a clear error
            except Exception as exc:
                assert isinstance(exc, AiocubieError), f"{type(exc).__name__}: {exc}"
    finally:
        manager.unregister(instance)


small_junk = junk.filter(lambda x: not isinstance(x, int) or abs(x) < 1000)  # no 20 GiB host arrays


@FUZZ
@given(
    shape=st.one_of(st.integers(0, 6), st.tuples(st.integers(0, 4), st.integers(0, 4)), small_junk),
    dtype=dtypes,
    kind=kinds,
    like=st.one_of(st.none(), st.just(np.ones(3)), st.just(np.ones((2, 2), "i4")), junk),
)
def test_create_host_array(manager: MemoryManager, shape: Any, dtype: Any, kind: Any, like: Any) -> None:
    args = {"shape": shape, "dtype": dtype, "kind": kind, "like": like}
    try:
        array = manager.host.array(shape, dtype, kind, like=like)
    except Exception as exc:
        assert isinstance(exc, InvalidRequestError), f"{type(exc).__name__}: {exc}"
        named = any(names_value(exc, v) for v in args.values()) or f"like has shape {np.shape(like)}" in str(exc)
        assert named or "dtype is required" in str(exc), exc
        return
    assert array.flags.c_contiguous and isinstance(array, np.ndarray)
    if like is None:
        assert not array.any()
    else:
        np.testing.assert_array_equal(array, np.asarray(like).astype(array.dtype))


@pytest.mark.parametrize("like", [["a", "b"], "", [object(), None], np.array(["x", "y"])])
def test_create_host_array_rejects_a_like_it_cannot_copy(manager: MemoryManager, like: Any) -> None:
    with pytest.raises(InvalidRequestError) as info:
        manager.host.array(np.shape(like), "float32", like=like)
    assert names_value(info.value, like)


@FUZZ
@given(
    backend=st.one_of(st.sampled_from(["simulator", "gpu", ""]), junk),
    mode=st.one_of(st.sampled_from(["passive", "active"]), junk),
    policy=st.one_of(st.sampled_from(["chunk", "wait", "fail"]), junk),
    headroom=st.one_of(st.floats(0, 0.99), junk),
    window=st.one_of(st.floats(0, 1), junk),
    max_batch=st.one_of(st.none(), st.integers(1, 100), junk),
    allocator=st.one_of(st.none(), st.sampled_from(["default", "cupy", "numba"]), junk),
)
def test_manager_options(
    backend: Any, mode: Any, policy: Any, headroom: Any, window: Any, max_batch: Any, allocator: Any
) -> None:
    options = {
        "mode": mode,
        "policy": policy,
        "headroom": headroom,
        "batch_window": window,
        "max_batch": max_batch,
        "free_cache_seconds": window,
        "allocator": allocator,
    }
    try:
        mgr = MemoryManager(backend, **options)
    except Exception as exc:
        assert isinstance(exc, ConfigurationError), f"{type(exc).__name__}: {exc}"
        assert any(names_value(exc, v) for v in (backend, *options.values())), exc
        return
    mgr.close()
    assert mgr.backend.name == "simulator"  # no GPU here: only the simulator can have been built
    assert 0 <= mgr.options.headroom < 1 and mgr.options.batch_window >= 0


@pytest.mark.anyio
async def test_awaited_bad_requests_end_with_errors_and_leave_nothing(drained) -> None:
    """Requests valid alone but impossible to serve end with PlanningError, never a hang."""
    sim = SimulatorBackend(1 << 20)
    with anyio.fail_after(10):
        async with MemoryManager(sim, mode="active", policy="fail", batch_window=0) as mgr:
            solver = Component()
            mgr.register(solver, proportion=0.5)
            impossible = [
                {"big": ArrayRequest((1 << 20,), "f8", unchunkable=True)},  # unchunkable over the cap
                {"x": ArrayRequest((1 << 20,), "f8")},  # fits only chunked: policy "fail"
                {"row": ArrayRequest((1, 1 << 20), "f8", chunk_axis=0)},  # one run is over the cap
            ]
            for requests in impossible:
                with pytest.raises(AiocubieError) as info:
                    await mgr.request(solver, requests)
                assert str(info.value)
            await drained(mgr, sim)
