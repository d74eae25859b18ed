"""The allocator's pool after every release: request storms, then what the pool still has in use.

Tasks each make 20 requests of 64 KiB to 16 MiB (``async with mgr.request(...)``), in groups of
one or several tasks, per allocator, with and without zero fill, kernels (a fill on the group's
stream) and cancellations; then 1 s of quiet and ``gc.collect()``. Prints one row per case: the
manager's live bytes, the pool's bytes in use after the storm and after the manager's exit, and
what a new manager on the same device starts with. Exit status 1 if any is not 0.

    python3 scripts/pool_release_check.py --backend cuda          # on a GPU
    python scripts/pool_release_check.py --backend simulator --quick
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from typing import Any

import anyio
import numpy as np

import aiocubie
from aiocubie import ArrayRequest, MemoryManager


class Component:
    """A user's component."""


async def storm(
    mgr: MemoryManager, *, groups: int, tasks: int, zero: bool, kernels: bool, cancel: bool, top: int
) -> tuple[int, list[Component]]:
    """Run the storm; return how many requests were cancelled, and the components (registered still)."""
    cancelled = 0
    owners = [Component() for _ in range(tasks)]  # registered all along: the readings find their groups live
    for i, owner in enumerate(owners):
        mgr.register(owner, stream_group=f"g{i % groups}")

    async def task(i: int) -> None:
        nonlocal cancelled
        owner = owners[i]
        rng = random.Random(i)
        for _ in range(20):
            nbytes = rng.choice([64 << 10, 1 << 20, 4 << 20, top])
            request = {"x": ArrayRequest((nbytes // 4,), np.float32, zero=zero, unchunkable=True)}
            with anyio.CancelScope() as scope:
                if cancel and rng.random() < 0.3:
                    scope.deadline = anyio.current_time() + rng.uniform(0, 2e-4)
                async with mgr.request(owner, request) as response:
                    if kernels:  # a fill kernel on the group's stream
                        with aiocubie.current_cupy_stream(response.stream):
                            response.arrays["x"].fill(1.0)
                    await anyio.sleep(0)
            cancelled += scope.cancelled_caught

    async with anyio.create_task_group() as tg:
        for i in range(tasks):
            tg.start_soon(task, i)
    return cancelled, owners


def in_use(mgr: MemoryManager) -> int:
    mgr.backend.device.synchronize()  # stream-ordered frees land
    found = mgr.stats().pool.in_use
    assert found is not None, "this allocator cannot say what its pool has in use"
    return found


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuda", choices=["cuda", "simulator"])
    parser.add_argument("--quick", action="store_true", help="fewer cases and 1 MiB at most (CI)")
    parser.add_argument("--allocators", default="default,cupy", help="comma-separated (default: default,cupy)")
    args = parser.parse_args()
    allocators = args.allocators.split(",")
    shapes = [(1, 2), (1, 24), (4, 24), (24, 24)] if not args.quick else [(1, 2), (2, 8)]
    variants = [
        dict(zero=False, kernels=False, cancel=False),
        dict(zero=True, kernels=True, cancel=False),
        dict(zero=True, kernels=False, cancel=True),
    ]
    top = (1 << 20) if args.quick else (16 << 20)
    quiet = 0.05 if args.quick else 1.0
    bad = 0
    print(
        "| allocator | groups x tasks | zero, kernels, cancel | cancelled | live after | pool in use after | after exit | new manager |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for allocator in allocators:
        if args.backend == "cuda":
            backend: Any = aiocubie.create_backend("cuda", allocator=allocator)
        else:
            backend = aiocubie.simulator.SimulatorBackend(
                1 << 30, allocator=None if allocator == "default" else allocator
            )
        try:
            for groups, tasks in shapes:
                for variant in variants:
                    async with MemoryManager(backend, batch_window=1e-3) as mgr:
                        # the components stay alive (and registered) until the readings: their groups too
                        cancelled, owners = await storm(mgr, groups=groups, tasks=tasks, top=top, **variant)
                        await anyio.sleep(quiet)
                        gc.collect()
                        live, after = mgr.stats().live_bytes, in_use(mgr)
                        del owners
                    gc.collect()
                    exited = in_use(mgr)
                    async with MemoryManager(backend) as fresh:
                        start = in_use(fresh)
                    flags = ", ".join("yes" if on else "no" for on in variant.values())
                    print(
                        f"| {allocator} | {groups} x {tasks} | {flags} | {cancelled} | {live} | {after} | {exited} | {start} |",
                        flush=True,
                    )
                    bad += any((live, after, exited, start))
        finally:
            backend.close()
    print(
        f"{bad} case(s) left bytes in use"
        if bad
        else "every case: 0 bytes in use after release, after exit and at the next start"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    status = anyio.run(main)
    print(f"({time.perf_counter() - t0:.1f} s)")
    sys.exit(status)
