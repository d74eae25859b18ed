#!/usr/bin/env python3
"""N GPUs against one: a chunked workload through a DeviceSet in one program, and through Dask.

Each job walks a matrix through a device budget of about half its size: the walk copies each
chunk in, a compute-bound kernel (an FMA loop per element) runs on it, and the chunk is copied
out, overlapped at depth 2. The jobs run on one GPU, then on N (one lane per device), in the
same run: the figure is the throughput ratio, N over one. Then the same with Dask: N workers,
each with its own CUDA_VISIBLE_DEVICES and an aiocubie manager from the worker plugin, against
the jobs all sent to one of them. Every group's peak is checked against its cap, per device.

Usage: python benchmarks/bench_multigpu.py [--backend cuda|simulator] [--gpus N] [--quick] [--dask-cuda] [--out FILE.md]
``--gpus`` defaults to every GPU the process sees (on the simulator: 2; it models a host of N).
``--dask-cuda`` (with ``--backend cuda``, where dask_cuda is importable): the Dask part runs under
dask-cuda's LocalCUDACluster with an RMM pool on each worker, each manager on ``allocator="rmm"``
wrapping that pool and budgeting its maximum size (``budget="rmm_maximum_pool_size"``).
The simulator models the kernel as time on the stream's compute engine and the copies as time on
its copy engines, each device on its own threads; there the figures show the mechanism only.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import os
import platform
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import aiocubie
from aiocubie import ArrayRequest, DeviceSet, MemoryManager, walk_chunks, walk_requests
from aiocubie.simulator import Engines, SimulatorBackend

MiB = 1 << 20


#: The throughput targets against one GPU (issue 24); other counts: 0.875 N.
TARGETS = {2: 1.8, 4: 3.6, 8: 7.0}


def target(gpus: int) -> float:
    """The throughput ratio ``gpus`` devices must reach against one."""
    return TARGETS.get(gpus, 0.875 * gpus)


@dataclass(frozen=True)
class Workload:
    """A job is ``rows`` x ``cols`` float32 in and out; a lane may hold ``cap`` bytes at once."""

    rows: int
    cols: int
    jobs: int  # per lane of the N-device run (the one-device run does as many in all)
    cap: int
    iters: int  # FMA iterations per element (GPU)
    kernel_seconds: float  # per chunk (simulator)
    repeats: int

    @property
    def job_bytes(self) -> int:
        return self.rows * self.cols * 4


def workload(backend: str, quick: bool) -> Workload:
    if backend == "cuda":
        if quick:
            return Workload(rows=1024, cols=64 * 1024, jobs=4, cap=160 * MiB, iters=1024, kernel_seconds=0, repeats=1)
        return Workload(rows=4096, cols=64 * 1024, jobs=8, cap=640 * MiB, iters=8192, kernel_seconds=0, repeats=3)
    return Workload(rows=64, cols=16 * 1024, jobs=3 if quick else 6, cap=2 * MiB, iters=0, kernel_seconds=0.004,
                    repeats=1 if quick else 3)  # fmt: skip


def requests(w: Workload) -> dict[str, ArrayRequest]:
    chunked = {
        "x": ArrayRequest((w.rows, w.cols), np.float32, chunk_axis=0),
        "y": ArrayRequest((w.rows, w.cols), np.float32, chunk_axis=0),
    }
    return walk_requests(chunked, depth=2)


class Kernel:
    """The job's compute: an FMA loop per element on the GPU, or stream time on the simulator."""

    def __init__(self, w: Workload) -> None:
        self.w = w
        self._cupy: Any = None

    def launch(self, mgr: MemoryManager, stream: Any, x: Any, y: Any) -> None:
        backend = mgr.backend
        if isinstance(backend, SimulatorBackend):
            backend.launch(stream, duration=self.w.kernel_seconds, tag="burn")
            return
        if self._cupy is None:
            import cupy

            self._cupy = cupy.ElementwiseKernel(
                "float32 x, int32 iters",
                "float32 y",
                "float v = x; for (int i = 0; i < iters; ++i) { v = fmaf(v, 0.999f, 0.001f); } y = v;",
                "aiocubie_bench_burn",
            )
        with mgr.on_device(), aiocubie.current_cupy_stream(stream):
            self._cupy(x, np.int32(self.w.iters), y)

    @functools.cache  # noqa: B019 - one kernel object per run; a Python loop of iters steps
    def expected(self, x: float) -> float:
        v = np.float32(x)
        for _ in range(self.w.iters):
            v = np.float32(v * np.float32(0.999) + np.float32(0.001))
        return float(v)


class Lane:
    """A component with its host buffers: runs jobs one after another on its manager's device."""

    def __init__(self, mgr: MemoryManager, w: Workload, kernel: Kernel, name: str) -> None:
        self.mgr, self.w, self.kernel, self.name = mgr, w, kernel, name
        self.host_x = mgr.host.array((w.rows, w.cols), np.float32, "pinned")
        self.host_x[...] = np.linspace(0, 1, w.cols, dtype=np.float32)
        self.host_y = mgr.host.array((w.rows, w.cols), np.float32, "pinned")
        self.located: set[int] = set()  # the devices the driver says this lane's arrays are on

    async def job(self) -> None:
        mgr, w = self.mgr, self.w
        async with mgr.request(self, requests(w)) as response:
            async for chunk in walk_chunks(response, inputs={"x": self.host_x}, outputs={"y": self.host_y}):
                if chunk.index == 0 and w.iters:
                    self.located.add(device_of(chunk.device["x"]))
                self.kernel.launch(mgr, chunk.stream, chunk.device["x"], chunk.device["y"])
        if w.iters:  # the GPU computed it: check a corner
            assert np.isclose(self.host_y[-1, 1], self.kernel.expected(float(self.host_x[-1, 1])), rtol=1e-3)


def device_of(array: Any) -> int:
    """The GPU a CuPy array's memory is on, as the CUDA runtime says (cudaPointerGetAttributes).

    Not the driver's CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, which read 0 for device 1's memory
    on the two-H200 run (results/0.2.0.md, "Two GPUs").
    """
    import cupy

    return int(cupy.cuda.runtime.pointerGetAttributes(array.data.ptr).device)


def register(devices: DeviceSet, w: Workload, kernel: Kernel) -> list[Lane]:
    """One lane per device, each in its own stream group, with a cap of ``w.cap`` bytes."""
    lanes = []
    for device in devices.devices:
        mgr = devices.manager(device)
        lane = Lane(mgr, w, kernel, f"lane-{device}")
        devices.register(lane, device=device, stream_group=lane.name, proportion=w.cap / mgr.pool.memory_info().total)
        lanes.append(lane)
    return lanes


async def run_lanes(lanes: list[Lane], jobs: int) -> float:
    """Run ``jobs`` jobs, each lane taking the next as it finishes one; seconds taken."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(jobs):
        queue.put_nowait(i)

    async def drain(lane: Lane) -> None:
        while not queue.empty():
            queue.get_nowait()
            await lane.job()

    started = time.perf_counter()
    await asyncio.gather(*(drain(lane) for lane in lanes))
    return time.perf_counter() - started


def device_set(backend: str, ids: list[int]) -> DeviceSet:
    options: dict[str, Any] = {"mode": "active", "policy": "wait"}
    if backend == "cuda":
        return DeviceSet(ids, backend="cuda", allocator="cupy", **options)
    engines = Engines(h2d_bandwidth=2e9, d2h_bandwidth=2e9)
    host = len(ids)
    return DeviceSet(
        ids, backend=lambda d: SimulatorBackend(64 * MiB, device=d, devices=host, engines=engines), **options
    )


def peaks(devices: DeviceSet, run: str, lanes: list[Lane]) -> list[dict[str, Any]]:
    rows = []
    located = {lane.name: lane.located for lane in lanes}
    for device, snapshot in devices.stats().items():
        for group, usage in snapshot.groups.items():
            rows.append(
                {
                    "run": run,
                    "device": device,
                    "group": group,
                    "peak": usage.peak_bytes,
                    "cap": usage.cap_bytes,
                    "on": located.get(group, set()),
                }
            )
    return rows


async def bench_device_set(backend: str, w: Workload, gpus: int) -> tuple[list[float], list[dict[str, Any]]]:
    """Throughput ratios ``gpus`` devices / one, and the peaks against caps."""
    kernel = Kernel(w)
    ratios, rows = [], []
    jobs = w.jobs * gpus
    async with device_set(backend, list(range(gpus))) as every:
        lanes = register(every, w, kernel)
        await run_lanes(lanes, len(lanes))  # warm up: kernel compiled and loaded on each device
        for _ in range(w.repeats):
            one = await run_lanes(lanes[:1], jobs)
            many = await run_lanes(lanes, jobs)
            ratios.append(one / many)
        rows = peaks(every, "device set", lanes)
        for lane in lanes:
            every.unregister(lane)
    return ratios, rows


# -- Dask ------------------------------------------------------------------------------------
_LANES: dict[str, Lane] = {}  # one lane per worker process (or per in-process worker)


async def dask_job(w: Workload) -> dict[str, Any]:
    """A task: run one job on this worker's manager; report its group's peak and cap."""
    from distributed import get_worker

    from aiocubie.dask import get_manager

    mgr = get_manager()
    key = get_worker().address
    lane = _LANES.get(key)
    if lane is None:
        lane = _LANES[key] = Lane(mgr, w, Kernel(w), "lane")
        mgr.register(lane, stream_group="lane", proportion=w.cap / mgr.pool.memory_info().total)
    await lane.job()
    usage = mgr.stats().groups["lane"]
    return {"worker": key, "peak": usage.peak_bytes, "cap": usage.cap_bytes, "on": lane.located}


def rmm_pool(w: Workload) -> tuple[int, int]:
    """The RMM pool each dask-cuda worker starts with, and its maximum size (its manager's budget)."""
    return 2 * w.cap, 4 * w.cap


async def bench_dask(
    backend: str, w: Workload, gpus: int, dask_cuda: bool = False
) -> tuple[list[float], list[dict[str, Any]]]:
    from distributed import Client, LocalCluster, Nanny, Scheduler, SpecCluster

    from aiocubie.dask import ManagerPlugin

    if dask_cuda:
        from dask_cuda import LocalCUDACluster

        # one worker process per GPU with its own CUDA_VISIBLE_DEVICES and dask-cuda's RMM pool; the
        # plugin, registered below once the workers are up, wraps that pool
        initial, maximum = rmm_pool(w)
        cluster: Any = LocalCUDACluster(
            n_workers=gpus,
            threads_per_worker=1,
            rmm_pool_size=initial,
            rmm_maximum_pool_size=maximum,
            dashboard_address=None,
            asynchronous=True,
        )
        plugin = ManagerPlugin(
            backend="cuda", mode="active", policy="wait", allocator="rmm", budget="rmm_maximum_pool_size"
        )
    elif backend == "cuda":
        # one worker process per GPU, each seeing only its own (what dask-cuda's LocalCUDACluster does)
        workers = {
            f"gpu{i}": {"cls": Nanny, "options": {"nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": str(i)}}}
            for i in range(gpus)
        }
        scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
        cluster = SpecCluster(workers=workers, scheduler=scheduler, asynchronous=True)
        plugin = ManagerPlugin(backend="cuda", mode="active", policy="wait", allocator="cupy")
    else:
        cluster = LocalCluster(
            n_workers=gpus, threads_per_worker=1, processes=False, asynchronous=True, dashboard_address=None
        )
        plugin = ManagerPlugin(backend="simulator", mode="active", policy="wait")
    ratios, rows = [], []
    async with cluster, Client(cluster, asynchronous=True) as client:
        await client.wait_for_workers(gpus)
        await client.register_plugin(plugin)
        addresses = sorted((await client.scheduler.identity())["workers"])
        for address in addresses:  # warm up each worker
            await client.submit(dask_job, w, workers=[address], pure=False)
        results: list[dict[str, Any]] = []
        jobs = w.jobs * gpus
        for _ in range(w.repeats):
            started = time.perf_counter()
            one = [client.submit(dask_job, w, workers=[addresses[0]], pure=False) for _ in range(jobs)]
            results += await client.gather(one)
            middle = time.perf_counter()
            many = [client.submit(dask_job, w, pure=False) for _ in range(jobs)]
            results += await client.gather(many)
            ratios.append((middle - started) / (time.perf_counter() - middle))
        for i, address in enumerate(addresses):
            mine = [r for r in results if r["worker"] == address]
            rows.append(
                {
                    "run": "dask",
                    "device": f"worker {i} (CUDA_VISIBLE_DEVICES={i})" if backend == "cuda" else f"worker {i}",
                    "group": "lane",
                    "peak": max(r["peak"] for r in mine),
                    "cap": min(r["cap"] for r in mine),
                    "on": set().union(*(r["on"] for r in mine)),
                }
            )
    return ratios, rows


def report(args: argparse.Namespace, w: Workload, results: dict[str, list[float]], rows: list[dict[str, Any]]) -> str:
    device = f"a simulated host of {args.gpus} devices"
    if args.backend == "cuda":
        import cupy

        names = [cupy.cuda.runtime.getDeviceProperties(i)["name"] for i in range(args.gpus)]
        device = ", ".join(f"{i}: {n.decode() if isinstance(n, bytes) else n}" for i, n in enumerate(names))
    lines = [
        "## aiocubie multi-GPU benchmark",
        "",
        f"`{' '.join([os.path.basename(sys.executable), *sys.argv])}` on {device}; host {socket.gethostname()} "
        f"({os.cpu_count()} CPUs, Python {platform.python_version()}), {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
        f"{w.jobs * args.gpus} jobs of {w.job_bytes / MiB:.0f} MiB in and out each, a cap of {w.cap / MiB:.0f} MiB per lane "
        f"(active mode, walk depth 2), {f'an FMA loop of {w.iters} iterations per element' if w.iters else 'simulated kernels'}; "
        f"{w.repeats} repeat(s), one device then {args.gpus}, in the same run.",
        "",
        f"| how | throughput {args.gpus} / one device (each repeat) | median | target |",
        "|---|---|---|---|",
    ]
    for name, ratios in results.items():
        median = statistics.median(ratios)
        lines.append(
            f"| {name} | {', '.join(f'{r:.2f}x' for r in ratios)} | {median:.2f}x | >= {target(args.gpus):.1f}x "
            f"{'met' if median >= target(args.gpus) else 'NOT met'} |"
        )
    lines += [
        "",
        "| run | device | group | peak MiB | cap MiB | peak <= cap | arrays on device |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ok = row["cap"] is not None and row["peak"] <= row["cap"]
        lines.append(
            f"| {row['run']} | {row['device']} | {row['group']} | {row['peak'] / MiB:.1f} | "
            f"{(row['cap'] or 0) / MiB:.1f} | {'yes' if ok else 'NO'} | {sorted(row['on']) or 'not checked'} |"
        )
    return "\n".join(lines) + "\n"


async def main(args: argparse.Namespace) -> int:
    w = workload(args.backend, args.quick)
    results: dict[str, list[float]] = {}
    rows: list[dict[str, Any]] = []
    if args.gpus is None:
        args.gpus = aiocubie.device_count(args.backend) if args.backend == "cuda" else 2
    if args.gpus < 2:
        print(f"bench_multigpu: needs at least 2 devices, got {args.gpus}", file=sys.stderr)
        return 2
    if args.dask_cuda and (args.backend != "cuda" or args.no_dask):
        print("bench_multigpu: --dask-cuda runs the Dask part on GPUs: use it with --backend cuda", file=sys.stderr)
        return 2
    if args.dask_cuda and importlib.util.find_spec("dask_cuda") is None:
        print("bench_multigpu: --dask-cuda needs dask-cuda (pip install dask-cuda)", file=sys.stderr)
        return 2
    results["device set, one program"], found = await bench_device_set(args.backend, w, args.gpus)
    rows += found
    if not args.no_dask:
        how = (
            "Dask-CUDA (LocalCUDACluster, RMM pool), one worker per GPU"
            if args.dask_cuda
            else "Dask, one worker per GPU"
        )
        results[how], found = await bench_dask(args.backend, w, args.gpus, args.dask_cuda)
        rows += found
    text = report(args, w, results, rows)
    print(text)
    if args.out:
        with open(args.out, "w") as file:
            file.write(text)
    return 0 if all(r["cap"] is not None and r["peak"] <= r["cap"] for r in rows) else 1


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_multigpu.py", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("simulator", "cuda"), default="simulator")
    parser.add_argument("--quick", action="store_true", help="a smoke run of seconds")
    parser.add_argument(
        "--gpus", type=int, default=None, help="devices to use (default: every GPU seen; on the simulator 2)"
    )
    parser.add_argument("--no-dask", action="store_true", help="only the device set")
    parser.add_argument(
        "--dask-cuda",
        action="store_true",
        help="the Dask part under dask-cuda's LocalCUDACluster with an RMM pool per worker (allocator rmm)",
    )
    parser.add_argument("--out", help="also write the markdown table here")
    return parser.parse_args(argv)


if __name__ == "__main__":
    # Run as the module bench_multigpu, not __main__, so that Dask's workers import the job
    # function (and the lanes it keeps) by name rather than receiving pickled copies.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_multigpu

    sys.exit(asyncio.run(bench_multigpu.main(bench_multigpu.parse())))
