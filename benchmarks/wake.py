"""Wake-up on a GPU: a kernel ends -> the task awaiting its request resumes, against the hop floor.

Issue 32's row. A one-thread kernel spins ``--kernel-us`` on %globaltimer on the group's stream and
stamps its end in mapped memory (``bridge.py``'s kernel and clock calibration); then the task
awaits ``mgr.request(...)`` (its allocation event is recorded after the kernel) or
``wait_event`` on an event recorded after it. The latency is resume - stamp. ``hop floor`` is a
thread -> loop hop with no GPU (a helper thread wakes at the same deadline and calls
``call_soon_threadsafe``; callback -> resume), interleaved with the others in the same rounds. Idle
CPU: process CPU time over wall time for 1 s of a manager with nothing pending, and of one
awaiting a request behind a 1 s kernel. GPU only; not a test. Usage: ``python3 benchmarks/wake.py
--loop asyncio``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from typing import Any

import numpy as np
from bridge import Bench, _stats

from aiocubie import ArrayRequest, MemoryManager
from aiocubie._backends import _cuda as cu
from aiocubie._completion import wait_event

REQUEST = {"a": ArrayRequest((1024,), np.float32)}
PATHS = ("hop floor", "request", "wait_event")


class Owner:
    """A registered component."""


async def sample(path: str, bench: Bench, mgr: MemoryManager, owner: Owner, kernel_ns: int) -> tuple[int, int]:
    """(resume ns, stamp ns) for one wait; for the floor (resume ns, callback ns)."""
    if path == "hop floor":
        resumed, called, _, _ = await bench.wait("handoff_floor", kernel_ns, 0)
        return resumed, called
    bench.launch(kernel_ns, 0)
    if path == "request":
        response = await mgr.request(owner, REQUEST)
        resumed = time.perf_counter_ns()
        mgr.release(response)
    else:
        await wait_event(bench.backend.device.record_event(bench.stream))
        resumed = time.perf_counter_ns()
    stamp = int(bench.buf[0])
    assert stamp, f"{path}: resumed before the kernel ended"
    return resumed, stamp


async def measure(args: argparse.Namespace, bench: Bench, mgr: MemoryManager, owner: Owner) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kernel_us in args.kernel_us:
        kernel_ns = kernel_us * 1000
        samples: dict[str, list[int]] = {p: [] for p in PATHS}
        order = list(PATHS)
        for _ in range(args.warmup):
            for path in order:
                await sample(path, bench, mgr, owner, kernel_ns)
        for _ in range(args.rounds):
            offset = min(bench.calibrate(0, kernel_ns) for _ in range(5))
            random.shuffle(order)
            for path in order:
                for _ in range(args.per_round):
                    resumed, mark = await sample(path, bench, mgr, owner, kernel_ns)
                    samples[path].append(resumed - mark - (0 if path == "hop floor" else offset))
        stats = {p: _stats(v) for p, v in samples.items()}
        floor = stats["hop floor"]["median_us"]
        for path in PATHS[1:]:
            stats[path]["median_over_floor"] = round(stats[path]["median_us"] / floor, 2)
        out[str(kernel_us)] = stats
    return out


async def idle_cpu(bench: Bench, mgr: MemoryManager, owner: Owner, seconds: float) -> dict[str, float]:
    def share(cpu: float, wall: float) -> float:
        return round(100 * (time.process_time() - cpu) / (time.perf_counter() - wall), 2)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    shares = {"manager, nothing pending": share(cpu, wall)}
    cpu, wall = time.process_time(), time.perf_counter()
    bench.launch(int(seconds * 1e9), 1)
    mgr.release(await mgr.request(owner, REQUEST))
    shares["manager, a request behind one long kernel"] = share(cpu, wall)
    return shares


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--kernel-us", type=int, nargs="+", default=[20, 200, 1000, 5000])
    parser.add_argument("--idle-s", type=float, default=1.0)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--label", default="")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    backend = cu.create_cuda_backend(device=0)
    bench = Bench(backend, slots=2)

    async def run() -> dict[str, Any]:
        async with MemoryManager(backend, batch_window=0) as mgr:
            owner = Owner()
            mgr.register(owner)
            bench.stream = mgr.groups.stream(owner)
            latency = await measure(args, bench, mgr, owner)
            return {"by_kernel_us": latency, "idle_cpu_pct": await idle_cpu(bench, mgr, owner, args.idle_s)}

    if args.loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            report = runner.run(run())
    else:
        report = asyncio.run(run())
    bench.close()
    report.update(loop=args.loop, label=args.label, device=backend.device.device_name, args=vars(args))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    print(f"-- {args.label} {args.loop}: median / p99 us from the kernel's end (floor: callback -> resumed)")
    print(f"{'path':<12}" + "".join(f"{k + ' us kernel':>24}" for k in report["by_kernel_us"]))
    for path in PATHS:
        cells = []
        for cell in report["by_kernel_us"].values():
            s = cell[path]
            ratio = f" ({s['median_over_floor']:.2f}x)" if "median_over_floor" in s else ""
            cells.append(f"{s['median_us']:.1f}/{s['p99_us']:.1f}{ratio}")
        print(f"{path:<12}" + "".join(f"{c:>24}" for c in cells))
    print("idle CPU % of one core:", report["idle_cpu_pct"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
