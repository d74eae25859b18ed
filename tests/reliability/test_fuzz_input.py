"""Seeded, randomized bad input on every public entry point (issue 11, "Bad input").

Each value a caller could pass by mistake (numbers no float holds, shapes numpy cannot make,
arrays where names go, lists where arrays go...) must raise an AiocubieError with a short,
clear message, before anything is allocated or copied, and never take down another
request's batch. CI draws a few hundred cases per seed; ``--soak`` draws many more.
"""

from __future__ import annotations

import contextlib
import math
import random
import warnings
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any

import anyio
import numpy as np
import pytest
from _reliability import SOAK, Component
from simkit import ByHand

from aiocubie import ArrayRequest, ArrayResponse, MemoryKind, MemoryManager, Options, walk_chunks
from aiocubie._requests import check_requests
from aiocubie.errors import (
    AiocubieError,
    AllocationError,
    BudgetError,
    ConfigurationError,
    InvalidRequestError,
    RegistrationError,
    UnknownAllocatorError,
)
from aiocubie.simulator import SimulatorBackend

pytestmark = [
    pytest.mark.filterwarnings("ignore::aiocubie.errors.AiocubieWarning"),  # budgets near full warn
    pytest.mark.filterwarnings("ignore:Data type alias:DeprecationWarning"),  # numpy's, for junk dtype text
]

SEEDS = [101, 102, 103, 104] if SOAK else [101, 102]
CASES = 3000 if SOAK else 150  # per seed and entry point


@pytest.fixture(params=["asyncio", "trio", "uvloop"])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    """asyncio, trio and (where installed) uvloop."""
    if request.param == "uvloop":
        pytest.importorskip("uvloop")
        return "asyncio", {"use_uvloop": True}
    return request.param


# -- what a caller might pass by mistake ---------------------------------------------------------

HUGE = [10**400, -(10**400), 2**63, 2**64, 2**70, Fraction(10**400, 3), Fraction(1, 10**400), 1e308, -1e308]


def junk(rng: random.Random) -> Any:
    """One value of a random sort: numbers of every size and type, text, containers, arrays, objects."""
    pick = rng.randrange(16)
    if pick == 0:
        return rng.choice(HUGE)
    if pick == 1:
        return rng.randint(-(2**70), 2**70)
    if pick == 2:
        return rng.choice([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-320, rng.uniform(-2, 2)])
    if pick == 3:
        return rng.choice(["", "1GB", "alloc", "f4", "device", "Part#4", "\x00", "é" * 3, "default"])
    if pick == 4:
        return rng.choice([b"", b"f4", bytearray(b"x")])
    if pick == 5:
        return rng.choice([None, True, False, np.bool_(True)])
    if pick == 6:
        return [rng.randint(-3, 3) for _ in range(rng.randrange(4))]
    if pick == 7:
        return [[1.0], [2.0, 3.0]]  # ragged
    if pick == 8:
        return rng.choice([np.array([1, 2]), np.zeros((2, 2)), np.array("x"), np.array([], "f4")])
    if pick == 9:
        return rng.choice([np.float64(0.5), np.int64(3), np.int8(-1), np.uint64(2**64 - 1), np.float32("nan")])
    if pick == 10:
        return rng.choice([object(), Component(), print, lambda: None, type])
    if pick == 11:
        return {rng.choice(["a", "b", 1]): rng.randint(0, 3)}
    if pick == 12:
        return 1 + 2j
    if pick == 13:
        return rng.choice([Fraction(1, 3), Fraction(-1, 2), Fraction(3, 2)])
    if pick == 14:
        return (rng.randint(-2, 5), rng.choice(["a", 1.5, None]))
    return rng.randint(-5, 5)


def shape(rng: random.Random) -> Any:
    """Shapes near the edges: huge, empty, too many dimensions, or junk."""
    pick = rng.randrange(8)
    if pick == 0:
        return (1,) * rng.randint(60, 70)
    if pick == 1:
        dims = [rng.choice([0, 1, 2**62, 2**63 - 1, 2**63, 2**64, 2**70, 10**400]) for _ in range(rng.randint(1, 3))]
        dims[rng.randrange(len(dims))] = 0  # empty, so its byte count says nothing
        return tuple(dims)
    if pick == 2:
        return tuple(rng.randint(0, 2 ** rng.randint(1, 66)) for _ in range(rng.randint(1, 3)))
    if pick == 3:
        return tuple(rng.randint(0, 6) for _ in range(rng.randint(0, 3)))
    if pick == 4:
        return rng.randint(-3, 40)
    return junk(rng)


def dtype(rng: random.Random) -> Any:
    return rng.choice(
        ["f4", "f8", "i1", "u8", "c16", "?", "O", "U3", "V4", "M8[s]", np.float32, object, None, junk(rng)]
    )


def kind(rng: random.Random) -> Any:
    return rng.choice(["device", "managed", "pinned", "host", "mapped", "gpu", junk(rng)])


def maybe(rng: random.Random, good: Callable[[], Any], bad_chance: float = 0.5) -> Any:
    return junk(rng) if rng.random() < bad_chance else good()


def refused(call: Callable[[], Any], *types: type[AiocubieError]) -> AiocubieError | None:
    """Run ``call``: None if it succeeds, the AiocubieError it raised, or fail on anything else."""
    try:
        call()
    except AiocubieError as exc:
        assert isinstance(exc, types or (AiocubieError,)), f"{type(exc).__name__}: {exc}"
        assert str(exc) and len(str(exc)) < 1000, f"unclear message ({len(str(exc))} characters): {str(exc)[:300]}"
        return exc
    except Exception as exc:
        pytest.fail(f"a raw {type(exc).__name__} escaped: {exc!r}")
    return None


def random_request(rng: random.Random) -> Any:
    """Keyword arguments for ArrayRequest, mostly sound, often not."""
    return {
        "shape": shape(rng),
        "dtype": dtype(rng) if rng.random() < 0.5 else "f4",
        "kind": kind(rng) if rng.random() < 0.3 else "device",
        "chunk_axis": rng.choice([0, -1, 1, 5, junk(rng)]) if rng.random() < 0.3 else 0,
        "unchunkable": rng.choice([False, True, junk(rng)]) if rng.random() < 0.5 else False,
    }


@pytest.fixture
def sim() -> Iterator[SimulatorBackend]:
    backend = SimulatorBackend(1 << 24)
    yield backend
    backend.close()


# -- the pure entry points -----------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_array_requests_accepted_are_allocatable(seed: int, sim: SimulatorBackend) -> None:
    """What ArrayRequest accepts, numpy (and so the simulator and CuPy) can make; the rest is refused."""
    rng = random.Random(seed)
    stream = sim.device.create_stream()
    mem = ByHand(sim)
    for _ in range(CASES * 4):
        fields = random_request(rng)
        request: list[ArrayRequest] = []
        if refused(lambda: request.append(ArrayRequest(**fields)), InvalidRequestError) is not None:
            continue
        (made,) = request
        assert len(made.shape) <= 64
        if made.nbytes <= 1 << 16:  # accepted and small: it must allocate, as device and as host memory
            for where in ("device", "host"):
                array = mem.allocate(
                    made.shape, made.dtype, made.kind if where == "device" else MemoryKind.HOST, stream
                )
                assert tuple(array.shape) == made.shape
                mem.free(array)
            for chunk_length in (0, 1, 3):
                np.empty(made.chunked_shape(chunk_length), made.dtype)
    assert sim.used == 0


@pytest.mark.parametrize("seed", SEEDS)
def test_request_mappings_and_run_lengths(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(CASES):
        mapping: dict[Any, Any] = {}
        for _ in range(rng.randrange(4)):
            label = rng.choice(["a", "b", "c", junk(rng)]) if rng.random() < 0.2 else rng.choice("abcdef")
            value: Any
            if rng.random() < 0.8:
                runs = rng.choice([0, 0, 10, 1000])
                value = ArrayRequest((runs, rng.randint(0, 3)), "f4", unchunkable=rng.random() < 0.2)
            else:
                value = junk(rng)
            try:
                mapping[label] = value
            except TypeError:  # an unhashable label is the caller's own TypeError, not ours
                continue
        checked: list[Any] = []
        if refused(lambda: checked.append(check_requests(mapping)), InvalidRequestError) is not None:
            continue
        runs_seen = {r.runs for r in checked[0].arrays.values() if r.runs}
        assert len(runs_seen) <= 1 and checked[0].runs == next(iter(runs_seen), 0)  # zero runs never mismatch


@pytest.mark.parametrize("seed", SEEDS)
def test_options_and_simulator_settings(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(CASES):
        name = rng.choice(["mode", "policy", "headroom", "batch_window", "max_batch", "free_cache_seconds"])
        refused(lambda: Options(**{name: junk(rng)}), ConfigurationError)
        setting = rng.choice(["total", "latency", "granule", "reserved", "array_type"])
        backend: list[SimulatorBackend] = []
        if refused(lambda: backend.append(SimulatorBackend(**{setting: junk(rng)})), ConfigurationError) is None:
            backend[0].close()
        faults = SimulatorBackend(1 << 10).faults
        rule = {key: junk(rng) for key in rng.sample(["after", "times", "probability", "seed"], rng.randint(0, 2))}
        site = rng.choice(["allocate", "copy", "record_event", "prefetch", junk(rng)])
        if refused(lambda: faults.inject(site, **rule), ConfigurationError) is None:
            assert site in faults.fired


# -- the manager's synchronous entry points ------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_registration_budgets_and_default_names(seed: int, sim: SimulatorBackend) -> None:
    rng = random.Random(seed)
    mgr = MemoryManager(sim)
    kept: list[Component] = []
    for _ in range(CASES):
        instance = Component()
        name = rng.choice([None, None, f"Component#{rng.randint(1, 40)}", junk(rng)])
        proportion = maybe(rng, lambda: rng.choice([None, 0.001, 0.01]), 0.3)
        error = refused(
            lambda: mgr.register(instance, proportion=proportion, name=name), RegistrationError, BudgetError
        )
        if error is not None:
            assert not mgr.is_registered(instance)
            continue
        kept.append(instance)
        refused(lambda: mgr.budget.set_manual(instance, junk(rng)), BudgetError)
        refused(lambda: mgr.budget.move_to_manual(instance, junk(rng)), BudgetError)
        assert 0 < mgr.budget.proportion(instance) <= 1
        if rng.random() < 0.3:  # departures free names for explicit reuse, never for a default clash
            mgr.unregister(kept.pop(rng.randrange(len(kept))))
        stats = mgr.statistics()  # members by name: fewer names than members if two share one
        assert len(stats.members) == stats.tables["members"], f"two members share a name: {sorted(stats.members)}"
    assert math.isclose(mgr.budget.manual_pool + mgr.budget.auto_pool, 1.0) or not kept or mgr.budget.auto_pool == 0


def test_an_explicit_default_like_name_is_never_given_again() -> None:
    """Issue 11 item 18: register(x, name="Component#2") then register(y): y gets another name."""
    sim = SimulatorBackend(1 << 20)
    mgr = MemoryManager(sim)
    first, x, y, z = Component(), Component(), Component(), Component()
    mgr.register(first)
    mgr.register(x, name="Component#2")
    mgr.register(y, name="Component#4")
    mgr.register(z)
    taken = list(mgr.statistics().members)
    assert sorted(taken) == ["Component#1", "Component#2", "Component#3", "Component#4"]
    assert mgr.allocate(x, {"a": ArrayRequest((1000,), "u1")}) is not None
    assert mgr.stats().instances["Component#2"].live_bytes == 1000  # x's bytes stay its own
    mgr.free_all()
    sim.close()


@pytest.mark.parametrize("seed", SEEDS)
def test_allocate_all_and_host_arrays(seed: int, sim: SimulatorBackend) -> None:
    """allocate_all and create_host_array refuse what cannot be made before allocating anything."""
    rng = random.Random(seed)
    mgr = MemoryManager(sim)
    owner = Component()
    mgr.register(owner)
    for _ in range(CASES):
        requests: dict[str, Any] = {}
        for label in "ab"[: rng.randint(1, 2)]:
            try:
                requests[label] = ArrayRequest(**random_request(rng))
            except AiocubieError:
                requests[label] = ArrayRequest((rng.choice([0, 4, 1000]),), "f4")
        before = sim.used
        response: list[ArrayResponse] = []
        if refused(lambda: response.append(mgr.allocate(owner, requests))) is not None:
            assert sim.used == before and mgr.statistics().allocations == 0
        else:
            mgr.release(response[0])
        like = rng.choice([None, None, junk(rng)])
        host_shape = shape(rng) if rng.random() < 0.5 else (rng.randint(0, 3),)
        host_kind = rng.choice(["host", "pinned", kind(rng)])
        refused(
            lambda: mgr.host.array(host_shape, dtype(rng), host_kind, like=like),
            InvalidRequestError,
            AllocationError,
        )
        refused(lambda: mgr.pool.set_allocator(junk(rng)), UnknownAllocatorError)
        managed = mgr.allocate(owner, {"m": ArrayRequest((4,), "f4", kind="managed")}).arrays["m"]
        refused(
            lambda: mgr.host.advise(managed, rng.choice(["read_mostly", junk(rng)]), rng.choice([0, None, junk(rng)]))
        )
        mgr.free_all()
    assert sim.used == 0
    with pytest.raises(AllocationError):  # issue 11 item 15: never numpy's MemoryError
        mgr.host.array((2**45,), "u1", "host")


# -- the async entry points, with good requests batched among bad ones -----------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("seed", SEEDS)
async def test_bad_input_never_takes_down_a_batch(seed: int, drained: Any) -> None:
    """Good requests batched with refused ones, empty run axes and bad copies and walks are all served."""
    rng = random.Random(seed)
    sim = SimulatorBackend(1 << 22)
    rounds = CASES // 5
    with anyio.fail_after(600 if SOAK else 60):
        async with MemoryManager(sim, batch_window=0.001) as mgr:
            members = [Component(i) for i in range(4)]
            for member in members:
                mgr.register(member)

            async def good(member: Component, runs: int) -> None:
                requests = {"x": ArrayRequest((runs, 3), "f8"), "p": ArrayRequest((2,), "f4", unchunkable=True)}
                async with mgr.request(member, requests) as response:
                    assert response.chunked_shapes["p"] == (2,)
                    x = np.arange(runs * 3, dtype="f8").reshape(runs, 3)
                    y = np.zeros_like(x)
                    async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"x": y}):
                        assert chunk.device["x"].shape[0] == (chunk.length if runs else 0)
                    np.testing.assert_array_equal(y, x)

            loner = Component("oversized")
            mgr.register(loner, stream_group="oversized")

            async def bad(member: Component) -> None:
                fields = random_request(rng)
                try:
                    request = ArrayRequest(**fields)
                    requests: Any = {"bad": request}
                    if request.nbytes > sim.total // 16:
                        # Valid, but maybe larger than the device: planned with batch-mates it would
                        # fail them too (see test_an_oversized_request_fails_alone_not_its_batch_mates).
                        member = loner
                except AiocubieError:
                    label = junk(rng)
                    try:
                        requests = rng.choice([junk(rng), {label: junk(rng)}, {"x": junk(rng)}])
                    except TypeError:  # an unhashable label: no mapping can even be built
                        requests = [(label, junk(rng))]
                try:
                    pending = mgr.request(member, requests)
                except AiocubieError:
                    return  # refused up front: nothing was queued
                try:
                    response = await pending
                except AiocubieError:  # accepted but cannot fit here: a planning error of its own
                    return
                mgr.release(response)

            async def first_chunk(response: ArrayResponse, **copies: Any) -> None:
                async with contextlib.aclosing(walk_chunks(response, **copies)) as walk:  # closed, not collected
                    await walk.__anext__()

            async def bad_copies(member: Component) -> None:
                async with mgr.request(member, {"d": ArrayRequest((8,), "f4")}) as response:
                    device = response.arrays["d"]
                    for call in (
                        lambda: mgr.host.to_device(member, junk(rng), [device]),
                        lambda: mgr.host.to_device(member, [junk(rng)], [device]),
                        lambda: mgr.host.from_device(
                            member, [device], rng.choice([junk(rng), [junk(rng)], [np.zeros(3)]])
                        ),
                        lambda: first_chunk(response, inputs=junk(rng)),
                        lambda: first_chunk(response, outputs={"d": junk(rng)}),
                        lambda: mgr.host.prefetch(member, device, junk(rng)),
                    ):
                        try:
                            await call()
                        except AiocubieError as exc:
                            assert len(str(exc)) < 1000
                        except StopAsyncIteration:
                            pass

            for _ in range(rounds):
                async with anyio.create_task_group() as tasks:
                    for member in members:
                        pick = rng.randrange(4)
                        if pick == 0:
                            tasks.start_soon(bad, member)
                        elif pick == 1:
                            tasks.start_soon(bad_copies, member)
                        else:  # issue 11 item 16: an empty run axis batched with 1,000 runs
                            tasks.start_soon(good, member, rng.choice([0, 0, 1000, 1000, 7]))
            await drained(mgr, sim)
    assert sim.used == 0


@pytest.mark.anyio
async def test_unallocatable_requests_are_refused_before_their_batch(drained: Any) -> None:
    """Issue 11 item 15: (1,)*65, (2**70, 0) and (0, 2**64) are refused when built, so the
    request beside them in the batch is served."""
    sim = SimulatorBackend(1 << 20)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0.05) as mgr:
            a, b = Component(), Component()
            mgr.register(a)
            mgr.register(b)
            for fields in ({"shape": (1,) * 65, "unchunkable": True}, {"shape": (2**70, 0)}, {"shape": (0, 2**64)}):
                with pytest.raises(InvalidRequestError):
                    ArrayRequest(dtype="f4", **fields)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                async with anyio.create_task_group() as tasks:
                    results: list[Any] = []

                    async def ask(who: Component, requests: dict[str, ArrayRequest]) -> None:
                        async with mgr.request(who, requests) as response:
                            results.append(response.chunked_shapes)

                    tasks.start_soon(ask, a, {"z": ArrayRequest((0,), "f4")})
                    tasks.start_soon(ask, b, {"k": ArrayRequest((1000,), "f4")})
            assert sorted(results, key=str) == [{"k": (1000,)}, {"z": (0,)}]
            await drained(mgr, sim)


@pytest.mark.anyio
async def test_an_oversized_request_fails_alone_not_its_batch_mates(drained: Any) -> None:
    sim = SimulatorBackend(1 << 20)
    with anyio.fail_after(10):
        async with MemoryManager(sim, batch_window=0.05) as mgr:
            a, b = Component(), Component()
            mgr.register(a)
            mgr.register(b)
            outcomes: dict[str, Any] = {}

            async def ask(name: str, who: Component, requests: dict[str, ArrayRequest]) -> None:
                try:
                    outcomes[name] = await mgr.request(who, requests)
                except AiocubieError as exc:
                    outcomes[name] = exc

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(ask, "huge", a, {"h": ArrayRequest((1 << 21,), "u1", unchunkable=True)})
                tasks.start_soon(ask, "small", b, {"s": ArrayRequest((1000,), "f4")})
            for value in outcomes.values():
                if isinstance(value, ArrayResponse):
                    mgr.release(value)
            await drained(mgr, sim)
            assert isinstance(outcomes["huge"], AiocubieError)
            assert isinstance(outcomes["small"], ArrayResponse), outcomes["small"]
