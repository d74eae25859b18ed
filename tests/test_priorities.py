"""Priorities among requests waiting for memory: higher first, first come first served within a
priority, in one group and across groups (passive mode, policy wait), and the starvation bound.

On asyncio, trio and uvloop. ``fail_after`` only guards hangs; orders are asserted, not times.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.abc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simkit import HANG_GUARD, LOOPS, Part, assert_all_released, ignore_waits_on_itself, vec, wait_until

from aiocubie import ArrayResponse, MemoryManager
from aiocubie._priority import effective, outranks, rank
from aiocubie._waiting import WaitingLine
from aiocubie.errors import InvalidRequestError, RegistrationError
from aiocubie.simulator import SimulatorBackend

KB = 1000

# a member's served request may still be held when its next one is planned: that warning is not
# what these tests look at
pytestmark = ignore_waits_on_itself


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def blob(nbytes: int) -> dict[str, object]:
    return {"blob": vec(nbytes, "u1", unchunkable=True)}


def waiting(mgr: MemoryManager) -> int:
    """Requests queued or waiting for memory, in every group."""
    return sum(g.queued + g.planning for g in mgr.statistics().groups.values())


class Served:
    """Tasks that each await one request, note when they are served (by name), and release at once."""

    def __init__(self, mgr: MemoryManager, tg: anyio.abc.TaskGroup) -> None:
        self.mgr, self.tg = mgr, tg
        self.order: list[str] = []
        self.came: dict[str, float] = {}

    async def ask(self, part: Part, nbytes: int, name: str, priority: int | None = None, hold: float = 0.0) -> None:
        self.came[name] = time.perf_counter()
        async with self.mgr.request(part, blob(nbytes), priority=priority):
            self.order.append(name)
            if hold:
                await anyio.sleep(hold)

    async def start(self, part: Part, nbytes: int, name: str, priority: int | None = None) -> None:
        """Start ``ask`` and wait until its request is queued or waiting."""
        before = waiting(self.mgr)
        self.tg.start_soon(self.ask, part, nbytes, name, priority)
        await wait_until(lambda: waiting(self.mgr) == before + 1)


@pytest.mark.anyio
async def test_one_group_serves_higher_priorities_first_and_first_come_first_served_within(
    sim: SimulatorBackend,
) -> None:
    holder, part = Part(), Part()
    options: Any = dict(policy="wait", batch_window=0, max_batch=1, free_cache_seconds=0, priority_aging=None)
    async with MemoryManager(sim, **options) as mgr:
        mgr.register(holder, stream_group="h")
        mgr.register(part, stream_group="g")  # every request of one member: one queue
        held = await mgr.request(holder, blob(800 * KB))
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                served = Served(mgr, tg)
                for name, priority in [("0a", 0), ("5a", 5), ("0b", 0), ("5b", 5), ("3", 3), ("-1", -1)]:
                    await served.start(part, 600 * KB, name, priority)
                mgr.release(held)
        assert served.order == ["5a", "5b", "3", "0a", "0b", "-1"]
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_the_default_priority_is_the_members_and_a_request_may_name_its_own(sim: SimulatorBackend) -> None:
    holder, low, high = Part(), Part(), Part()
    options: Any = dict(policy="wait", batch_window=0, max_batch=1, free_cache_seconds=0, priority_aging=None)
    async with MemoryManager(sim, **options) as mgr:
        mgr.register(holder, stream_group="h")
        mgr.register(low, stream_group="g")
        mgr.register(high, stream_group="g", priority=7)
        held = await mgr.request(holder, blob(800 * KB))
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                served = Served(mgr, tg)
                await served.start(low, 600 * KB, "low")
                await served.start(high, 600 * KB, "high")  # the member's 7
                await served.start(low, 600 * KB, "urgent", priority=9)  # its own
                await served.start(high, 600 * KB, "demoted", priority=-1)
                assert mgr.statistics().groups["g"].by_priority == {0: 1, 7: 1, 9: 1, -1: 1}
                mgr.release(held)
        assert served.order == ["urgent", "high", "low", "demoted"]
        waits = mgr.stats().waits_by_priority
        assert {p: w.count for p, w in waits.items()} == {0: 2, 7: 1, 9: 1, -1: 1}  # the holder's 0 too
        assert waits[-1].p50 is not None and waits[-1].p50 > 0  # it waited for the other three
        text = mgr.summary()
        assert "priority 9: 1 waits" in text and "priority -1: 1 waits" in text
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_across_groups_the_waiting_line_serves_higher_priorities_first(sim: SimulatorBackend) -> None:
    holder, a, b, c = Part(), Part(), Part(), Part()
    options: Any = dict(policy="wait", batch_window=0, free_cache_seconds=0, priority_aging=None)
    async with MemoryManager(sim, **options) as mgr:
        for part, group in ((holder, "h"), (a, "a"), (b, "b"), (c, "c")):
            mgr.register(part, stream_group=group)
        held = await mgr.request(holder, blob(800 * KB))
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                served = Served(mgr, tg)
                await served.start(a, 600 * KB, "a0", 0)
                await served.start(b, 600 * KB, "b5", 5)
                await served.start(c, 600 * KB, "c0", 0)
                mgr.release(held)
        assert served.order == ["b5", "a0", "c0"]
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_a_lower_priority_batch_that_fits_waits_behind_a_higher_one_waiting_in_passive_mode(
    sim: SimulatorBackend,
) -> None:
    holder, big, small, peer = Part(), Part(), Part(), Part()
    options: Any = dict(policy="wait", batch_window=0, free_cache_seconds=0, priority_aging=None)
    async with MemoryManager(sim, **options) as mgr:
        for part, group in ((holder, "h"), (big, "big"), (small, "small"), (peer, "peer")):
            mgr.register(part, stream_group=group)
        held = [await mgr.request(holder, blob(400 * KB)), await mgr.request(holder, blob(300 * KB))]
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                served = Served(mgr, tg)
                await served.start(big, 500 * KB, "big", 5)  # 300 kB free: it waits
                await served.start(small, 200 * KB, "small", 0)  # fits, but would take what big waits for
                assert served.order == []
                # one of big's priority that fits is served at once, as before priorities
                async with mgr.request(peer, blob(100 * KB), priority=5):
                    pass
                mgr.release(held.pop())  # 600 kB free: big or small, not both
        assert served.order == ["big", "small"]
        mgr.release(held.pop())
        assert_all_released(mgr, sim)


@pytest.mark.anyio
@pytest.mark.parametrize("aging", [None, 0.02])
async def test_a_low_priority_request_under_a_steady_high_priority_stream(sim: SimulatorBackend, aging: Any) -> None:
    """Strict priorities (aging None): the low one is not served while the stream lasts. With aging, it
    is served before every high one that came more than (high - low) * aging seconds after it."""
    holder, low, high = Part(), Part(), Part()
    options: Any = dict(policy="wait", batch_window=0, max_batch=1, free_cache_seconds=0, priority_aging=aging)
    async with MemoryManager(sim, **options) as mgr:
        mgr.register(holder, stream_group="h")
        mgr.register(low, stream_group="g")
        mgr.register(high, stream_group="g", priority=2)
        held = await mgr.request(holder, blob(800 * KB))
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                served = Served(mgr, tg)
                await served.start(high, 600 * KB, "h0")
                await served.start(low, 600 * KB, "low")
                stop = anyio.Event()

                async def stream() -> None:  # three high ones waiting at all times, each held 5 ms
                    n = 1
                    while not stop.is_set():
                        if waiting(mgr) < 5:
                            tg.start_soon(served.ask, high, 600 * KB, f"h{n}", None, 0.005)
                            n += 1
                        await anyio.sleep(0.0005)

                tg.start_soon(stream)
                await wait_until(lambda: waiting(mgr) >= 5)
                mgr.release(held)
                await wait_until(lambda: len(served.order) >= 40 or "low" in served.order)
                if aging is None:
                    await wait_until(lambda: len(served.order) >= 40)
                stop.set()
        order = served.order
        if aging is None:
            assert order.index("low") >= 40  # every high one that came went first
        else:
            bound = served.came["low"] + 2 * aging
            after = [name for name in order[order.index("low") :] if name != "low"]
            late = [name for name in order[: order.index("low")] if served.came[name] > bound + 0.005]
            assert late == [], (late, after)  # none that came after the bound went first
            assert order.index("low") < 40
        assert_all_released(mgr, sim)


@pytest.mark.anyio
async def test_a_bad_priority_is_refused_where_it_is_given(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        with pytest.raises(RegistrationError, match="priority must be an int"):
            mgr.register(Part(), priority=1.5)  # type: ignore[arg-type]
        part = Part()
        mgr.register(part)
        for bad in (True, "high", 2.0):
            with pytest.raises(InvalidRequestError, match="priority must be an int"):
                mgr.request(part, blob(10), priority=bad)  # type: ignore[arg-type]
        response: ArrayResponse = await mgr.request(part, blob(10), priority=3)
        mgr.release(response)


# -- the rule itself, pure ------------------------------------------------------------------------
waiters = st.lists(st.tuples(st.integers(-3, 3), st.floats(0, 10, allow_nan=False)), min_size=1, max_size=12)


@given(waiters, st.floats(10, 20), st.one_of(st.none(), st.floats(0.01, 5)))
@settings(max_examples=200, deadline=None)
def test_rank_orders_by_effective_priority_then_first_come(ws: list[tuple[int, float]], now: float, aging: Any) -> None:
    ordered = sorted(ws, key=lambda w: rank(*w, now, aging))
    levels = [effective(*w, now, aging) for w in ordered]
    assert levels == sorted(levels, reverse=True)
    for (w1, l1), (w2, l2) in zip(zip(ordered, levels), zip(ordered[1:], levels[1:])):
        if l1 == l2:
            assert w1[1] <= w2[1]  # first come, first served within a level


@given(
    st.integers(-5, 5),
    st.integers(1, 5),
    st.floats(0, 5, allow_nan=False),
    st.floats(1e-6, 5, allow_nan=False),  # strictly after the bound (at it, rounding may go either way)
    st.floats(0, 10, allow_nan=False),
    st.floats(0.01, 1),
)
@settings(max_examples=300, deadline=None)
def test_the_starvation_bound_holds_for_every_later_request(
    low: int, gap: int, came: float, extra: float, later: float, aging: float
) -> None:
    """A request of priority p goes before every request of q > p that came more than (q - p) * aging after it."""
    high_came = came + gap * aging + extra
    now = high_came + later
    assert outranks((low, came), (low + gap, high_came), now, aging)
    assert not outranks((low + gap, high_came), (low, came), now, aging)


@given(st.lists(st.tuples(st.integers(-2, 2), st.floats(0, 10, allow_nan=False)), min_size=1, max_size=8, unique=True))
@settings(max_examples=200, deadline=None)
def test_exactly_one_batch_of_the_line_goes_first(entries: list[tuple[int, float]]) -> None:
    line = WaitingLine(lambda: None)
    batches = [object() for _ in entries]
    for batch, (priority, since) in zip(batches, entries):
        line.join(batch, priority, since)
    firsts = [b for b in batches if line.first(b, 10.0)]
    assert len(firsts) == 1
    best = min(zip(entries, batches), key=lambda e: rank(*e[0], 10.0, None))[1]
    assert firsts == [best]
