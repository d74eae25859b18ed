#!/usr/bin/env python3
"""Under pressure (issue 33): spilling and priorities, each against its baseline in the same run.

- (a) spill and restore bandwidth against raw pinned copies of the same bytes (spilling: to come);
- (b) an oversubscribed pipeline, with spilling and with each of today's policies (spilling: to come);
- (c) the wait of a high-priority request under a steady stream of low-priority ones, against the same
  request on an idle manager, and against the stream at the high one's own priority (first come, first
  served: what priorities change).

Usage: python benchmarks/bench_pressure.py [--backend simulator|cuda] [--quick] [--name NAME] [--out DIR]
       [--only c]
Each part is one function ``part_x(args, table, rows)``; ``main`` runs the parts asked for and writes
NAME.md and NAME.json. The work a request serves is a sleep, so the figures are the scheduler's, on
any backend.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_common import Table, machine  # noqa: E402

from aiocubie import ArrayRequest, MemoryManager  # noqa: E402

MIB = 1 << 20


def _blob(nbytes: int) -> dict[str, ArrayRequest]:
    return {"x": ArrayRequest((nbytes,), np.uint8, unchunkable=True)}


# -- (a), (b): spilling --------------------------------------------------------------------------
# (s7-spill adds part_a and part_b here, and their names to PARTS)


# -- (c): a high-priority request under a stream of low-priority ones ---------------------------
async def _high_waits(args: argparse.Namespace, *, lows: int, high_priority: int) -> list[float]:
    """Seconds each high request waited (request -> served), with ``lows`` low-priority tasks streaming."""
    budget, repeats = 64 * MIB, 5 if args.quick else 30
    hold = 0.002  # what a low request serves: its arrays are held this long
    patience = 0.25 if args.quick else 1.0  # a high request not served by then is counted as starved
    waits: list[float] = []
    async with MemoryManager(
        backend=args.backend, policy="wait", batch_window=0, memory_limit=budget, free_cache_seconds=0
    ) as mgr:
        high = object()
        mgr.register(high, stream_group="high", priority=high_priority)
        low_parts = [object() for _ in range(lows)]
        for i, part in enumerate(low_parts):
            mgr.register(part, stream_group=f"low{i % 3}", priority=0)
        stop = anyio.Event()

        async def stream(part: object) -> None:  # each low task: a quarter of the budget, again and again
            while not stop.is_set():
                async with mgr.request(part, _blob(budget // 4)):
                    await anyio.sleep(hold)

        async with anyio.create_task_group() as tg:
            for part in low_parts:
                tg.start_soon(stream, part)
            await anyio.sleep(0.02)  # the stream is steady
            for _ in range(repeats):
                started = time.perf_counter()
                with anyio.move_on_after(patience):  # starved: counted as the whole patience
                    async with mgr.request(high, _blob(budget // 2)):
                        waits.append(time.perf_counter() - started)
                        await anyio.sleep(hold)
                if len(waits) < repeats and time.perf_counter() - started >= patience:
                    waits.append(patience)
                await anyio.sleep(0.005)
            stop.set()
    return waits


async def part_c(args: argparse.Namespace, table: Table, rows: list[dict[str, Any]]) -> None:
    """(c): the high request's wait on an idle manager, under the stream at priority 10, and at the stream's 0."""
    idle = await _high_waits(args, lows=0, high_priority=10)
    ranked = await _high_waits(args, lows=6, high_priority=10)
    fifo = await _high_waits(args, lows=6, high_priority=0)
    base = statistics.median(idle)
    cases = (("idle manager", idle), ("6 low streams, high priority", ranked), ("6 low streams, same priority", fifo))
    for name, waits in cases:
        p50, p99 = statistics.median(waits), float(np.percentile(waits, 99))
        table.add("c", name, len(waits), p50 * 1e3, p99 * 1e3, max(waits) * 1e3, p50 / base if base else float("nan"))
        rows.append({"part": "c", "case": name, "n": len(waits), "p50_s": p50, "p99_s": p99, "max_s": max(waits)})


#: The parts, in the order they run.
PARTS: dict[str, Callable[[argparse.Namespace, Table, list[dict[str, Any]]], Awaitable[None]]] = {"c": part_c}


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_pressure", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("simulator", "cuda"), default="simulator")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--only", choices=tuple(PARTS), action="append")
    args = parser.parse_args(argv)
    table = Table(
        f"Under pressure ({args.backend}): each case against its baseline, same run",
        ["part", "case", "n", "p50 ms", "p99 ms", "max ms", "p50 / baseline"],
    )
    rows: list[dict[str, Any]] = []
    for name in args.only or PARTS:
        await PARTS[name](args, table, rows)
    name = args.name or f"{args.backend}-pressure"
    report = f"# bench_pressure ({args.backend})\n\n{table.markdown()}\n"
    print(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.md").write_text(report)
    (args.out / f"{name}.json").write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
