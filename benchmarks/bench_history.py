"""What the allocation history costs per request: off (the default) against on, in the same run.

Requests on the zero-latency device of ``aiocubie._bench`` (every microsecond is aiocubie's
Python), the two settings measured in alternation, best of N each, against a bare asyncio future
round trip timed in the same run. Runs the same on every machine: no device library is imported.
Run alone: python benchmarks/bench_history.py
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_common beside this file

from bench_common import Section, Settings, Table, ratio

from aiocubie import MemoryManager
from aiocubie._bench import REQUEST, InstantBackend, future_round_trip, per_request

#: History on: at most this much per request, as a multiple of history off.
TARGET_ON = 1.15
#: Requests each path serves before it is measured: more events than the ring holds (100,000).
WARM_UP = 60_000


class _Owner:
    """A registered component."""


async def _paths(mgr: MemoryManager, groups: int) -> Callable[[int], Awaitable[None]]:
    """The request-and-release loop of ``groups`` requesters (one each in its own group, or one group)."""
    if groups == 1:
        owner = _Owner()
        mgr.register(owner, stream_group="solo")

        async def single(n: int) -> None:
            for _ in range(n):
                mgr.release(await mgr.request(owner, REQUEST))

        single.owner = owner  # type: ignore[attr-defined]  # held while the loop runs
        return single
    owners = [_Owner() for _ in range(groups)]
    for owner in owners:
        mgr.register(owner, stream_group="batch")

    async def requester(owner: _Owner, rounds: int) -> None:
        for _ in range(rounds):
            mgr.release(await mgr.request(owner, REQUEST))

    async def everyone(n: int) -> None:
        await asyncio.gather(*(requester(owner, max(1, n // groups)) for owner in owners))

    everyone.owners = owners  # type: ignore[attr-defined]
    return everyone


async def measure(count: int, repeats: int, warm_up: int = WARM_UP) -> dict[str, dict[str, float]]:
    """Seconds per request of each path with history off and on (alternating runs), and the bare future."""
    results: dict[str, dict[str, float]] = {
        "bare asyncio future round trip": {"": await per_request(future_round_trip, count, repeats)}
    }
    for label, requesters in (("one request in a loop", 1), ("64 requesters, one group", 64)):
        off_mgr, on_mgr = MemoryManager(InstantBackend()), MemoryManager(InstantBackend())
        on_mgr.record_history()
        async with off_mgr, on_mgr:
            off, on = await _paths(off_mgr, requesters), await _paths(on_mgr, requesters)
            # Both warmed alike first, the ring filled (a long-running program's state): without it
            # the order of the first runs decided the figure (on two H200s' VM, 64 requesters: 1.46x
            # when off ran first, 1.12x when on did, 1.09x warmed).
            for path in (off, on):
                await path(warm_up)
            best = {"off": float("inf"), "on": float("inf")}
            for _ in range(repeats):  # alternate, so drift on a shared machine hits both alike
                best["off"] = min(best["off"], await per_request(off, count, 1))
                best["on"] = min(best["on"], await per_request(on, count, 1))
            assert len(on_mgr.history().events) > 0
        results[label] = best
    return results


def rows(results: dict[str, dict[str, float]]) -> list[tuple[str, float, float, float | None, float | None]]:
    """(path, us off, x future off, us on, on / off) for ``measure``'s results."""
    base = results["bare asyncio future round trip"][""]
    out: list[tuple[str, float, float, float | None, float | None]] = [
        ("bare asyncio future round trip", base * 1e6, 1.0, None, None)
    ]
    for label, times in results.items():
        if "off" in times:
            out.append((label, times["off"] * 1e6, times["off"] / base, times["on"] * 1e6, times["on"] / times["off"]))
    return out


def run(device: Any, settings: Settings) -> Section:
    """The benchmark as ``benchmarks/run`` reports it."""
    count, repeats, warm_up = settings.iters(6400, 640), settings.iters(9, 3), settings.iters(WARM_UP, 640)
    section = Section()
    table = Table(
        "Allocation history: cost per request, off (the default) and on, zero-latency device (asyncio)",
        ["path", "us off", "x bare future (off)", "us on", "on / off"],
        note=f"Request + release of one 1 MiB array; history on and off each warmed with {warm_up:,} requests (the ring "
        f"full), then measured in alternation, best of {repeats} runs of {count} requests each. On records a plan, "
        "an allocation and a release per request.",
    )
    for label, off_us, off_x, on_us, on_off in rows(asyncio.run(measure(count, repeats, warm_up))):
        table.add(label, round(off_us, 3), round(off_x, 3), on_us and round(on_us, 3), on_off and round(on_off, 3))
        if on_off is not None:
            section.target(f"per request, {label}, history on / off", ratio(on_off, 1.0), TARGET_ON, "x")
    section.tables.append(table)
    return section


if __name__ == "__main__":
    for label, off_us, off_x, on_us, on_off in rows(asyncio.run(measure(6400, 9))):
        extra = "" if on_us is None else f"   on {on_us:7.2f} us  on/off {on_off:5.3f}x"
        print(f"{label:32s} off {off_us:7.2f} us  {off_x:5.2f}x future{extra}")
