"""A seeded fuzz of everything under pressure at once: requests, spills, restores (``use()``), priorities,
releases and cancellations, under each policy in both modes, on asyncio, trio and uvloop.

Every refusal must be one the rules allow, judged on what the scheduler saw when it refused (see
:class:`Refusals`); no sample of the device or of a group is over its cap; every cache read back holds
what was last written into it; once everything is released, unregistered or closed, the accounting and
the pinned host memory are back to zero. ``AIOCUBIE_SEED=n`` runs seed n alone, ``--soak`` twenty seeds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import AsyncIterator
from typing import Any

import anyio
import attrs
import numpy as np
import pytest
from _reliability import LOOPS, scale, settle
from simkit import Part

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie.errors import AiocubieError, InsufficientMemoryError, UnchunkableTooLargeError
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

TOTAL = 4_000_000
SEEDS = [int(os.environ["AIOCUBIE_SEED"])] if os.environ.get("AIOCUBIE_SEED") else list(range(scale(4, 20)))


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


@attrs.define(eq=False)
class Ask:
    """One request as the refusal rules see it: whose, at which priority, and the bytes it needs."""

    group: str
    priority: int
    fixed: int  # of its unchunkable arrays
    step: int  # of one run of its chunkable arrays (0: none)
    full: int  # whole


@attrs.define(eq=False)
class Cache:
    """A component's spillable cache: its response, the value last written, and the ``use()`` blocks open."""

    response: ArrayResponse
    part: Part
    group: str
    n: int
    value: float = 0.0
    pins: int = 0
    record: Any = attrs.field(init=False)  # its spill state, kept past a release

    def __attrs_post_init__(self) -> None:
        self.record = self.response.lease.spill

    def ask(self) -> Ask:  # its restore: a request of its member at the response's priority
        return Ask(self.group, self.response.lease.priority, 4 * self.n, 0, 4 * self.n)

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[dict[str, Any]]:
        """``response.use()``, counted here first: the count matches the record's at every instant."""
        self.pins += 1
        try:
            async with self.response.use() as arrays:
                yield arrays
        finally:
            self.pins -= 1


@attrs.frozen
class Seen:
    """What the scheduler saw when it refused: the free memory, each group's (cap, held), the idle caches."""

    free: int
    groups: dict[str, tuple[int | None, int]]
    idle: list[tuple[str, int]]  # (group, priority) of each cache a spill could have taken
    pins: list[tuple[int, int]]  # (the record's, ours) for each cache: they must agree


class Refusals(logging.Handler):
    """The rules for a refusal, checked against what the scheduler saw at the instant it refused.

    The scheduler logs each failed batch ("group %r: batch of %d failed") where it decides, with no
    await between: this handler reads the state then. A check in the refused task would run after
    other tasks moved things (a ``use()`` block ended, a release). Each refused task raises a copy
    of the logged error: they are matched by group, type and message (which names the bytes).
    """

    def __init__(self, mgr: MemoryManager, caches: set[Cache], granule: int) -> None:
        super().__init__()
        self.mgr, self.caches, self.granule = mgr, caches, granule
        self.seen: dict[tuple[str, type[BaseException], str], list[Seen]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith("group %r: batch of %d failed"):
            return
        snap = self.mgr.stats()
        idle, pins = [], []
        for cache in self.caches:
            spill = cache.response.lease.spill
            if spill is not None:
                pins.append((spill.pins, cache.pins))  # type: ignore[attr-defined]
                if spill.idle:  # type: ignore[attr-defined]
                    idle.append((cache.group, spill.priority))  # type: ignore[attr-defined]
        groups = {name: (g.cap_bytes, g.live_bytes) for name, g in snap.groups.items()}
        group, _, exc = record.args  # type: ignore[misc]
        self.seen.setdefault((group, type(exc), str(exc)), []).append(Seen(snap.free, groups, idle, pins))

    def allowed(self, seen: Seen, ask: Ask) -> type[AiocubieError] | None:
        """The refusal the rules allow ``ask`` given what was ``seen``; None if it must not be refused.

        It must have spilled first: any idle cache of its priority or lower (passive mode: of any
        group; active: of its own) would have been spilled before a refusal. A spill never serves a
        lower priority, so idle caches of higher priority may hold what it needs.
        """
        options = self.mgr.options
        active = options.active
        if any(priority <= ask.priority and (not active or group == ask.group) for group, priority in seen.idle):
            return None
        if options.policy.value == "wait":
            return None  # every request here fits the group's empty share, so it waits for that
        cap, held = seen.groups[ask.group]
        room = seen.free - self.granule
        if active:
            assert cap is not None
            if held > cap:
                return InsufficientMemoryError  # the group starts nothing until it is back under its cap
            room = min(room, cap - held)
            if options.policy.value == "fail":
                return InsufficientMemoryError if ask.full > max(room, 0) else None
        if ask.fixed > room:
            return UnchunkableTooLargeError
        return InsufficientMemoryError if ask.fixed + ask.step > room else None

    def check(self, exc: AiocubieError, ask: Ask) -> None:
        """``exc`` ended ``ask``: it must be a refusal the rules allow."""
        found = self.seen.get((ask.group, type(exc), str(exc)))
        assert found, f"not a batch's refusal: {exc!r}"
        seen = found.pop(0)
        assert all(theirs == ours for theirs, ours in seen.pins), seen.pins
        expected = self.allowed(seen, ask)
        assert expected is not None and type(exc) is expected, f"{ask} refused with {exc!r}; saw {seen}"


def over_caps(mgr: MemoryManager, sim: SimulatorBackend) -> list[str]:
    """What is over its cap now: the device, or (active mode) a group."""
    over = [f"device {sim.used}" for _ in range(1) if sim.used > TOTAL]
    return over + [f"{name} {g.live_bytes} > {g.cap_bytes}" for name, g in mgr.stats().groups.items() if g.over_cap]


async def quiet(mgr: MemoryManager, made: list[Cache]) -> None:
    """Wait until no request is pending (one cancelled in flight frees its arrays once its event is
    reached) and no spill copies (a spill goes on, shielded, after the batch it was for is cancelled,
    and after its response is released: ``made`` holds every cache, released ones too)."""
    await settle(mgr)
    while any(c.record.state.name == "SPILLING" for c in made):
        await anyio.sleep(0.002)


@pytest.fixture
def refusals_logged() -> Any:
    """The aiocubie logger at INFO for the test (it logs each failed batch at INFO)."""
    logger = logging.getLogger("aiocubie")
    level = logger.level
    logger.setLevel(logging.INFO)
    yield logger
    logger.setLevel(level)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("mode", "policy"),
    [("passive", "chunk"), ("passive", "wait"), ("active", "chunk"), ("active", "fail"), ("active", "wait")],
)
async def test_pressure_fuzz(seed: int, mode: str, policy: str, refusals_logged: logging.Logger) -> None:
    rng = random.Random(seed)
    levels = rng.choice([[0], [-1, 0, 1, 2], [0, 5]])  # some seeds at one priority, as before priorities
    caches: set[Cache] = set()  # those not released
    made: list[Cache] = []
    samples: list[list[str]] = []
    left: list[Cache] = []  # caches left for the manager's exit
    leaving: list[Part] = []  # members unregistered (their caches freed) once every component is done:
    # a group's cap is the sum of its members', and one that shrinks may leave a group over it
    with SimulatorBackend(total=TOTAL) as sim:
        async with MemoryManager(sim, mode=mode, policy=policy, headroom=0.0) as mgr:
            refusals = Refusals(mgr, caches, sim.device.granule)
            refusals_logged.addHandler(refusals)

            def refused(exc: AiocubieError, ask: Ask) -> None:
                refusals.check(exc, ask)
                samples.append(over_caps(mgr, sim))

            async def new_cache(part: Part, group: str) -> Cache | None:
                n = rng.randrange(60_000, 250_000)
                priority = rng.choice([None, None, min(levels), max(levels)])
                ask = Ask(group, own[part] if priority is None else priority, 4 * n, 0, 4 * n)
                # zeroed: it may be spilled before its task first sees it (a fresh response is idle)
                request = {"c": ArrayRequest((n,), "f4", unchunkable=True, spillable=True, zero=True)}
                try:
                    cache = Cache(await mgr.request(part, request, priority=priority), part, group, n)
                except AiocubieError as exc:
                    refused(exc, ask)
                    return None
                caches.add(cache)
                made.append(cache)
                return cache

            async def use(cache: Cache) -> None:
                try:
                    async with cache.use() as arrays:
                        assert (arrays["c"].get() == cache.value).all()  # intact, spilled and restored or not
                        arrays["c"].set(np.full(cache.n, cache.value + 1, np.float32))
                        cache.value += 1
                except AiocubieError as exc:
                    refused(exc, cache.ask())

            async def step(part: Part, group: str) -> None:
                m = rng.randrange(1, 400_000)
                unchunkable = rng.random() < 0.25
                if unchunkable:
                    m //= 8
                priority = rng.choice([None, None, None, *levels])
                given = own[part] if priority is None else priority
                ask = Ask(group, given, 4 * m if unchunkable else 0, 0 if unchunkable else 4, 4 * m)
                request = {"x": ArrayRequest((m,), "f4", unchunkable=unchunkable)}
                try:
                    async with await mgr.request(part, request, priority=priority):
                        await anyio.sleep(rng.random() * 0.002)
                except AiocubieError as exc:
                    refused(exc, ask)

            async def component(part: Part, group: str) -> None:
                cache: Cache | None = (
                    None  # under "wait" a request can wait for ever on idle caches of a higher priority
                )
                for _ in range(rng.randrange(8, 16)):
                    with anyio.move_on_after(rng.choice([0.0005, 0.002, 0.05, 0.3])):  # some are cancelled
                        action = rng.random()
                        if cache is None or action < 0.1:  # a new cache; the last one released, spilled or not
                            if cache is not None:
                                caches.discard(cache)
                                cache.response.release()
                            cache = None
                            cache = await new_cache(part, group)
                        elif action < 0.4:
                            await use(cache)
                        else:
                            await step(part, group)
                ending = rng.choice(["release", "unregister", "exit"])
                if ending == "unregister":
                    leaving.append(part)
                if cache is not None and ending == "release":
                    caches.discard(cache)
                    cache.response.release()
                elif cache is not None:
                    left.append(cache)

            async def sample(stop: anyio.Event) -> None:
                while not stop.is_set():
                    samples.append(over_caps(mgr, sim))
                    await anyio.sleep(0.0005)

            parts = [Part() for _ in range(6)]
            own = {part: rng.choice(levels) for part in parts}  # each component's priority
            for i, part in enumerate(parts):
                mgr.register(part, stream_group=f"g{i % 2}", priority=own[part])
            try:
                with anyio.fail_after(60):
                    async with anyio.create_task_group() as tg:
                        stop = anyio.Event()
                        tg.start_soon(sample, stop)
                        async with anyio.create_task_group() as work:
                            for i, part in enumerate(parts):
                                work.start_soon(component, part, f"g{i % 2}")
                        stop.set()
                    await quiet(mgr, made)
            finally:
                refusals_logged.removeHandler(refusals)
            for part in leaving:
                mgr.unregister(part)
            left = [c for c in left if c.part not in leaving]
            on_host = sum(4 * c.n for c in left if c.response.lease.spill.spilled)  # type: ignore[union-attr]
            assert mgr.stats().spill.now == on_host  # a release or an unregister took its host copies along
            # a host copy goes back to the pinned pool once its copy's event is reached: let the last land (bounded;
            # one that never goes back still fails below)
            with anyio.move_on_after(2):
                while (sim.device.pinned_pool.in_use == 0) != (on_host == 0):
                    await anyio.sleep(0.002)
            in_use = sim.device.pinned_pool.in_use  # a host copy may take a larger free buffer than it needs
            assert in_use >= on_host and (in_use == 0) == (on_host == 0)
            assert mgr.stats().live_bytes == sum(4 * c.n for c in left) - on_host
            assert mgr.stats().spill.spills > 0
        assert sim.used == 0
        assert sim.device.pinned_pool.in_use == 0  # host copies of the caches left spilled went back at exit
    assert [s for s in samples if s] == []
    assert len(samples) > 10
