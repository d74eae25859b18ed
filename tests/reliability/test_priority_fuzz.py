"""A seeded fuzz of requests with priorities and cancellations, under every policy and both modes: no
sample of the device or of a group ever goes over its cap, every request ends (served, refused or
cancelled), and everything is released at the end. An async reclaim hook frees held arrays now and then.

On asyncio, trio and uvloop; ``AIOCUBIE_SEED=n`` runs seed n alone, ``--soak`` runs ten seeds, longer.
"""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest
from _reliability import LOOPS, SEEDS, Component, scale

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie.errors import AiocubieError
from aiocubie.simulator import SimulatorBackend

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::aiocubie.errors.AiocubieWarning")]

TOTAL = 1_000_000
LIMIT = 800_000  # passive mode's cap: the manager's memory_limit


@pytest.fixture(params=LOOPS)
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def over_caps(mgr: MemoryManager, sim: SimulatorBackend) -> list[str]:
    """What is over its cap now: the device, the memory limit (passive mode), or a group (active mode)."""
    snap = mgr.stats()
    over = [f"device {sim.used}" for _ in range(1) if sim.used > TOTAL]
    over += [f"limit {snap.live_bytes}" for _ in range(1) if not mgr.options.active and snap.live_bytes > LIMIT]
    over += [f"{name} {g.live_bytes} > {g.cap_bytes}" for name, g in snap.groups.items() if g.over_cap]
    return over


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("mode", "policy"), [("passive", "wait"), ("passive", "chunk"), ("active", "wait")])
async def test_requests_with_priorities_and_cancellations_never_go_over_a_cap(
    seed: int, mode: str, policy: str, drained
) -> None:
    rng = random.Random(seed)
    sim = SimulatorBackend(TOTAL)
    options: Any = dict(mode=mode, policy=policy, batch_window=rng.choice([0, 0.001]), priority_aging=0.01)
    if mode == "passive":
        options["memory_limit"] = LIMIT
    samples: list[list[str]] = []
    ended = {"served": 0, "refused": 0, "cancelled": 0}
    cached: list[ArrayResponse] = []
    with anyio.fail_after(60):
        async with MemoryManager(sim, free_cache_seconds=0, reclaim_timeout=0.02, **options) as mgr:
            parts = [Component(i) for i in range(6)]
            for i, part in enumerate(parts):
                proportion = 0.15 if mode == "active" else None
                mgr.register(part, stream_group=f"g{i % 3}", priority=rng.randint(-2, 2), proportion=proportion)

            async def evict(nbytes: int) -> int:  # an async reclaim hook: drops cached responses
                freed = 0
                while cached and freed < nbytes:
                    response = cached.pop(0)
                    freed += sum(a.nbytes for a in response.arrays.values())
                    mgr.release(response)
                await anyio.sleep(0)
                return freed

            mgr.pool.add_reclaim_hook(evict)

            async def ask(part: Component, nbytes: int, priority: int | None, patience: float, keep: bool) -> None:
                request = {"x": ArrayRequest((nbytes,), "u1", chunk_axis=0, unchunkable=rng.random() < 0.3)}
                response = None
                with anyio.move_on_after(patience):
                    try:
                        response = await mgr.request(part, request, priority=priority)
                    except AiocubieError:
                        ended["refused"] += 1
                        return
                if response is None:  # cancelled while it waited
                    ended["cancelled"] += 1
                    return
                ended["served"] += 1
                if keep:
                    cached.append(response)
                    return
                await anyio.sleep(rng.random() * 0.003)
                mgr.release(response)

            stop = anyio.Event()

            async def sample() -> None:
                while not stop.is_set():
                    samples.append(over_caps(mgr, sim))
                    await anyio.sleep(0.0005)

            count = scale(150, 1500)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sample)
                async with anyio.create_task_group() as asks:
                    for _ in range(count):
                        part = rng.choice(parts)
                        nbytes = rng.randint(1_000, 120_000 if mode == "active" else 400_000)
                        priority = rng.choice([None, -1, 0, 3])
                        keep = rng.random() < 0.1
                        asks.start_soon(ask, part, nbytes, priority, rng.choice([0.0005, 0.01, 1.0]), keep)
                        await anyio.sleep(rng.random() * 0.001)
                stop.set()
            for response in cached:
                mgr.release(response)
            assert sum(ended.values()) == count
            assert [s for s in samples if s] == []
            assert len(samples) > 10
            await drained(mgr, sim)
