#!/usr/bin/env python3
"""The batch stream's host cost without a GPU: Python calls and loop-thread microseconds a batch.

The loaders of ``bench_pipeline --only stream`` (docs/concepts/walks.md, "A batch stream") with small batches (64 KiB,
one chunk each), so that what is measured is Python on the loop thread rather than copies, on two
devices: the simulator (latency 0; its streams are threads, its copies and arrays Python) and the
zero-latency device of ``aiocubie._bench`` (work done as queued, numpy arrays over memory it reuses
as a GPU's pool does, host arrays pinned: what is left is aiocubie's own Python, as on a GPU whose
copies and events are single C calls):

- one at a time: request (``ordered=True``) -> walk (``overlap=True``, depth-2 requests) -> release;
- one response kept: one request, every batch walked through its buffers;
- 4 tasks, one group: four request -> walk -> release loaders at once;
- walk_batches: one request, every batch walked by ``walk_batches`` with 4 in flight.

Each case and device reports Python calls a batch (cProfile of one run), loop-thread CPU microseconds a batch
(``time.thread_time``, best of ``--runs``) and wall microseconds a batch (best of ``--runs``). Every
output element is checked.

Usage: python benchmarks/bench_stream_host.py [TREE ...] [--batches N] [--runs N] [--out FILE.json]
Each TREE (a checkout, or a ``git archive`` of another commit) is measured in a fresh interpreter with
it first on ``sys.path``, the trees alternating (drift on a shared machine hits them alike); without
a TREE, this checkout. Loop-thread CPU includes the page faults of memory the C allocator gave back
to the system: the simulator's blocks are fresh memory each, and so were the zero-latency device's
before it reused them (older trees). To compare such trees on aiocubie's Python
alone, keep glibc's heap from shrinking in every tree alike:
``MALLOC_TOP_PAD_=67108864 MALLOC_TRIM_THRESHOLD_=268435456 python benchmarks/bench_stream_host.py ...``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
CASES = ("one at a time", "one response kept", "4 tasks, one group", "walk_batches, 4 in flight")
DEVICES = ("simulator", "zero-latency")


class _Owner:
    """A component that walks."""


def _backend(device: str) -> Any:
    from aiocubie._bench import InstantBackend

    try:
        from aiocubie.simulator import SimulatorBackend
    except ImportError:  # a tree before issue 31's namespaces
        from aiocubie import SimulatorBackend  # type: ignore[attr-defined,no-redef]

    if device == "simulator":
        return SimulatorBackend(1 << 30)
    backend = InstantBackend(1 << 30)
    backend.device.is_pinned = lambda array: True  # type: ignore[method-assign]  # every host array pinned
    return backend


async def _measure(device: str, case: str, batches: int, runs: int) -> dict[str, float]:
    import anyio
    import numpy as np

    from aiocubie import ArrayRequest, MemoryManager, walk_batches, walk_chunks, walk_requests

    tasks = 4 if case.startswith("4 tasks") else 1
    keep = case == "one response kept"
    async with MemoryManager(_backend(device), mode="active", headroom=0.0) as mgr:
        owners = [_Owner() for _ in range(tasks)]
        for owner in owners:
            mgr.register(owner, proportion=0.2, stream_group="g")
        # a tree before issue 31's views made host arrays with mgr.create_host_array
        host_array = mgr.host.array if hasattr(mgr, "host") else mgr.create_host_array
        xs = [host_array((16, 1024), np.float32, kind="pinned") for _ in range(batches)]
        ys = [host_array((16, 1024), np.float32, kind="pinned") for _ in range(batches)]
        for b, x in enumerate(xs):
            x[...] = np.arange(x.size, dtype=np.float32).reshape(x.shape) + b
        requests = walk_requests(
            {"x": ArrayRequest.like(xs[0], chunk_axis=0), "y": ArrayRequest.like(ys[0], chunk_axis=0)}, 2
        )

        async def walk(response: Any, b: int) -> None:
            async for chunk in walk_chunks(response, inputs={"x": xs[b]}, outputs={"y": ys[b]}, overlap=True):
                chunk.device["y"][...] = chunk.device["x"] * 2 + 1

        async def worker(i: int) -> None:
            if case.startswith("walk_batches"):
                async with mgr.request(owners[i], requests, ordered=True) as response:
                    pairs = (({"x": xs[b]}, {"y": ys[b]}) for b in range(batches))
                    async for chunk in walk_batches(response, pairs, in_flight=4):
                        chunk.device["y"][...] = chunk.device["x"] * 2 + 1
                return
            if keep:
                async with mgr.request(owners[i], requests, ordered=True) as response:
                    for b in range(i, batches, tasks):
                        await walk(response, b)
                return
            for b in range(i, batches, tasks):
                async with mgr.request(owners[i], requests, ordered=True) as response:
                    await walk(response, b)

        async def run() -> None:
            for y in ys:
                y.fill(np.nan)
            async with anyio.create_task_group() as tg:
                for i in range(tasks):
                    tg.start_soon(worker, i)
            for x, y in zip(xs, ys):
                if not np.array_equal(y, x * 2 + 1):
                    raise AssertionError(f"{case}: wrong outputs")

        await run()  # warm: streams, copy streams, caches
        profiler = cProfile.Profile()
        profiler.enable()
        await run()
        profiler.disable()
        calls = pstats.Stats(profiler).total_calls  # type: ignore[attr-defined]
        cpu, wall = [], []
        for _ in range(runs):
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            await run()
            cpu.append(time.thread_time() - cpu0)
            wall.append(time.perf_counter() - wall0)
    return {"calls": calls / batches, "cpu_us": min(cpu) / batches * 1e6, "wall_us": min(wall) / batches * 1e6}


def _child(batches: int, runs: int) -> dict[str, dict[str, float]]:
    import anyio

    return {
        f"{device}: {case}": anyio.run(_measure, device, case, batches, runs) for device in DEVICES for case in CASES
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", type=Path)
    parser.add_argument("--batches", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="fresh interpreters per tree, alternating")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.batches, args.runs)))
        return
    trees = [tree.resolve() for tree in args.trees] or [HERE]
    rounds: dict[str, list[dict[str, dict[str, float]]]] = {str(tree): [] for tree in trees}
    for _ in range(args.rounds):
        for tree in trees:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            command = [sys.executable, __file__, "--child", "--batches", str(args.batches), "--runs", str(args.runs)]
            out = subprocess.run(command, env=env, cwd="/", capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(f"{tree}: {out.stderr}")
            rounds[str(tree)].append(json.loads(out.stdout))
    best = {
        tree: {
            case: {key: min(r[case][key] for r in results) for key in ("calls", "cpu_us", "wall_us")}
            for case in results[0]
        }
        for tree, results in rounds.items()
    }
    print(f"{'case':36s} {'tree':24s} {'calls/batch':>12s} {'loop CPU us':>12s} {'wall us':>9s}")
    for case in (f"{device}: {case}" for device in DEVICES for case in CASES):
        for tree, figures in best.items():
            f = figures[case]
            print(f"{case:36s} {tree[-24:]:24s} {f['calls']:12.0f} {f['cpu_us']:12.1f} {f['wall_us']:9.1f}")
    if args.out:
        args.out.write_text(json.dumps({"batches": args.batches, "rounds": rounds, "best": best}, indent=1) + "\n")


if __name__ == "__main__":
    main()
