"""Completion-bridge benchmark: GPU event -> asyncio future, per mechanism, on a real GPU.

Measures (1) latency from the GPU finishing a kernel to the awaiting coroutine resuming in the
loop thread, and (2) the CPU a process burns while the loop waits on a pending event. Needs
numba-cuda and CuPy (for the timestamping kernel). Not a test: it only reports.

Method (latency). A one-thread kernel spins ``--kernel-us`` on %globaltimer, then writes the
globaltimer reading at its end into mapped host memory. An event is recorded after it, and the
mechanism resolves a future with ``loop.call_soon_threadsafe(fut.set_result, None)``; the
coroutine awaiting it reads ``time.perf_counter_ns()`` as soon as it resumes. The two clocks are
tied by calibration samples in the same round: the main thread spins on the mapped slot and
reads the host clock the moment the stamp lands; the round's offset is the minimum of
(host - stamp) over those samples, so latencies are slightly under-stated, by the fastest
poll-to-see delay (about a microsecond, see ``_calibration_spread_us``). Rounds interleave all
mechanisms so drift and clock changes hit them alike. Each latency is split at the moment the
mechanism's callback runs (before ``call_soon_threadsafe``): GPU -> callback, callback -> resume.

Method (idle CPU). A kernel spins ``--idle-s`` seconds; the loop awaits its event through the
mechanism; process CPU time (all threads, ``time.process_time``) over wall time is the share of
one core burnt waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import itertools
import json
import platform
import queue
import random
import sys
import threading
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import numpy as np

from aiocubie._backends import Backend
from aiocubie._backends import _cuda as cu
from aiocubie._backends._cuda._events import StreamWaiter
from aiocubie._requests import MemoryKind

STAMP_SOURCE = r"""
extern "C" __global__ void stamp_after(unsigned long long spin_ns, unsigned long long out_addr, int slot) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < spin_ns);
    ((volatile unsigned long long*)out_addr)[slot] = t;
    __threadfence_system();
}
"""

MECHANISMS = ("thread", "stream_callback", "thread_spin", "poll", "handoff_floor")
DESCRIPTIONS = {
    "thread": "the backend's: helper thread per stream sleeping in a blocking-sync cuda.core Event.sync()",
    "stream_callback": "cuStreamAddCallback right after the event (numba 0.30's Stream.add_callback is broken)",
    "thread_spin": "helper thread, cuEventSynchronize on a default (spinning) event: burns a core while waiting",
    "poll": "event.query() from the loop, asyncio.sleep back-off 20 us doubling to 1 ms",
    "handoff_floor": "no GPU: a helper thread wakes at a deadline and hands off; resume - handoff is the loop's floor",
}

_STREAM_CB_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
_stream_callbacks: dict[int, Callable[[], None]] = {}
_stream_keys = itertools.count(1)


@_STREAM_CB_TYPE  # type: ignore[untyped-decorator]
def _stream_callback(stream: int, status: int, key: int) -> None:
    _stream_callbacks.pop(key)()


class Bench:
    """One stream, one mapped stamp buffer, and a way to wait on it per mechanism."""

    def __init__(self, backend: Backend, slots: int) -> None:
        import cupy
        from cuda.bindings import driver as binding

        self.backend = backend
        self.stream = backend.device.create_stream()
        dtype = np.dtype(np.uint64)
        block = backend.resource.allocate(slots * dtype.itemsize, MemoryKind.MAPPED, self.stream)
        self.buf = backend.arrays.make(block, (slots,), dtype, self.stream)
        self.buf[:] = 0
        self.addr = np.uint64(self.buf.__cuda_array_interface__["data"][0])
        self.kernel = cupy.RawKernel(STAMP_SOURCE, "stamp_after")
        self.binding = binding
        self.spin_waiter = StreamWaiter("bench-spin")
        self.stream_cb = binding.CUstreamCallback(ctypes.cast(_stream_callback, ctypes.c_void_p).value)
        self.floor_jobs: queue.SimpleQueue[tuple[float, Callable[[], None]] | None] = queue.SimpleQueue()
        self.floor_thread = threading.Thread(target=self._floor, daemon=True)
        self.floor_thread.start()
        self.called_back = 0  # perf_counter_ns() when the last mechanism's callback ran

    def _floor(self) -> None:
        while (job := self.floor_jobs.get()) is not None:
            deadline, resolve = job
            time.sleep(max(0.0, deadline - time.perf_counter()))
            resolve()

    def close(self) -> None:
        self.floor_jobs.put(None)
        self.floor_thread.join()
        self.spin_waiter.stop()

    def launch(self, kernel_ns: int, slot: int) -> None:
        self.buf[slot] = 0
        with cu.current_cupy_stream(self.stream):
            self.kernel((1,), (1,), (np.uint64(kernel_ns), self.addr, np.int32(slot)))

    def calibrate(self, slot: int, kernel_ns: int) -> int:
        """host clock - GPU clock, seen by spinning on the mapped slot."""
        self.launch(kernel_ns, slot)
        while not self.buf[slot]:
            pass
        return time.perf_counter_ns() - int(self.buf[slot])

    def arm(self, mechanism: str, kernel_ns: int, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None]) -> None:
        """Make ``fut`` resolve when the GPU reaches the point queued now, by ``mechanism``."""

        def resolve() -> None:
            self.called_back = time.perf_counter_ns()
            loop.call_soon_threadsafe(fut.set_result, None)

        if mechanism == "thread":
            self.backend.device.record_event(self.stream).add_done_callback(resolve)
        elif mechanism == "stream_callback":
            key = next(_stream_keys)
            _stream_callbacks[key] = resolve
            self.binding.cuStreamAddCallback(self.binding.CUstream(int(self.stream.handle)), self.stream_cb, key, 0)
        elif mechanism == "thread_spin":
            flags = int(self.binding.CUevent_flags.CU_EVENT_DISABLE_TIMING)
            _, handle = self.binding.cuEventCreate(flags)
            self.binding.cuEventRecord(handle, self.binding.CUstream(int(self.stream.handle)))
            self.spin_waiter.submit(_RawEvent(handle, self.binding), resolve)  # type: ignore[arg-type]
        elif mechanism == "poll":
            self.poll_task = loop.create_task(_poll(self.backend.device.record_event(self.stream), fut, self))
        elif mechanism == "handoff_floor":
            self.floor_jobs.put((time.perf_counter() + kernel_ns / 1e9, resolve))
        else:
            raise ValueError(mechanism)

    async def wait(self, mechanism: str, kernel_ns: int, slot: int) -> tuple[int, int, int, int]:
        """(resume time, callback time, stamp or 0, ns the loop spent arming) for one kernel."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if mechanism != "handoff_floor":
            self.launch(kernel_ns, slot)
        t0 = time.perf_counter_ns()
        self.arm(mechanism, kernel_ns, loop, fut)
        armed = time.perf_counter_ns() - t0
        await fut
        resumed = time.perf_counter_ns()
        stamp = 0 if mechanism == "handoff_floor" else int(self.buf[slot])
        assert mechanism == "handoff_floor" or stamp, "resumed before the kernel stamped"
        return resumed, self.called_back, stamp, armed


class _RawEvent:
    """A spinning (default-flag) event, waited on as the backend's waiter waits on cuda.core's."""

    def __init__(self, handle: Any, binding: Any) -> None:
        self.handle = handle
        self._binding = binding

    def sync(self) -> None:
        self._binding.cuEventSynchronize(self.handle)

    def __del__(self) -> None:
        self._binding.cuEventDestroy(self.handle)


async def _poll(event: cu.CudaEvent, fut: asyncio.Future[None], bench: Bench) -> None:
    delay = 20e-6
    while not event.query():
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1e-3)
    bench.called_back = time.perf_counter_ns()
    fut.set_result(None)


def _stats(values_ns: list[int]) -> dict[str, float]:
    us = np.asarray(values_ns, dtype=np.float64) / 1e3
    return {
        "n": int(us.size),
        "min_us": round(float(us.min()), 2),
        "median_us": round(float(np.median(us)), 2),
        "p90_us": round(float(np.percentile(us, 90)), 2),
        "p99_us": round(float(np.percentile(us, 99)), 2),
        "max_us": round(float(us.max()), 2),
        "mean_us": round(float(us.mean()), 2),
    }


async def measure(args: argparse.Namespace, bench: Bench, kernel_us: int) -> dict[str, Any]:
    kernel_ns = kernel_us * 1000
    total: dict[str, list[int]] = {m: [] for m in MECHANISMS}
    to_callback: dict[str, list[int]] = {m: [] for m in MECHANISMS}
    to_resume: dict[str, list[int]] = {m: [] for m in MECHANISMS}
    armed: dict[str, list[int]] = {m: [] for m in MECHANISMS}
    spreads: list[int] = []
    order = list(MECHANISMS)
    for _ in range(args.warmup):  # compile, create waiters, warm the driver
        for mechanism in order:
            await bench.wait(mechanism, kernel_ns, 0)
    for _ in range(args.rounds):
        offsets = [bench.calibrate(0, kernel_ns) for _ in range(args.per_round)]
        offset = min(offsets)
        spreads.append(int(np.median(offsets)) - offset)
        random.shuffle(order)
        for mechanism in order:
            for _ in range(args.per_round):
                resumed, called_back, stamp, arm_ns = await bench.wait(mechanism, kernel_ns, 0)
                if mechanism != "handoff_floor":
                    total[mechanism].append(resumed - stamp - offset)
                    to_callback[mechanism].append(called_back - stamp - offset)
                to_resume[mechanism].append(resumed - called_back)
                armed[mechanism].append(arm_ns)
    results: dict[str, Any] = {}
    for mechanism in MECHANISMS:
        results[mechanism] = {
            "what": DESCRIPTIONS[mechanism],
            "latency": _stats(total[mechanism]) if total[mechanism] else None,
            "gpu_to_callback": _stats(to_callback[mechanism]) if to_callback[mechanism] else None,
            "callback_to_resume": _stats(to_resume[mechanism]),
            "arm_cost_median_us": round(float(np.median(armed[mechanism])) / 1e3, 2),
        }
    results["_calibration_spread_us"] = _stats(spreads)
    return results


async def idle_cpu(args: argparse.Namespace, bench: Bench) -> dict[str, float]:
    """Percent of one core the process burns while the loop waits ``--idle-s`` on a pending event."""
    out: dict[str, float] = {}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(args.idle_s)
    out["loop_asleep_baseline"] = round(100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0), 2)
    for mechanism in MECHANISMS:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await bench.wait(mechanism, int(args.idle_s * 1e9), 1)
        out[mechanism] = round(100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0), 2)
    return out


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for dist in ("numpy", "numba", "numba-cuda", "cupy-cuda13x", "cupy-cuda12x", "cuda-bindings", "anyio"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return found


def table(report: dict[str, Any]) -> str:
    lines = []
    for kernel_us, mechanisms in report["by_kernel_us"].items():
        lines.append(f"-- {report['loop']} loop, kernel {kernel_us} us: latency GPU done -> coroutine resumed (us)")
        lines.append(
            f"{'mechanism':<16} {'median':>8} {'p99':>8} {'max':>8} {'cb med':>7} {'hop med':>7} "
            f"{'idle CPU%':>9} {'arm':>6}"
        )
        for mechanism in MECHANISMS:
            r = mechanisms[mechanism]
            lat, cb, hop = r["latency"] or {}, r["gpu_to_callback"] or {}, r["callback_to_resume"]
            lines.append(
                f"{mechanism:<16} {lat.get('median_us', float('nan')):>8.1f} {lat.get('p99_us', float('nan')):>8.1f} "
                f"{lat.get('max_us', float('nan')):>8.1f} {cb.get('median_us', float('nan')):>7.1f} "
                f"{hop['median_us']:>7.1f} {report['idle_cpu_pct'][mechanism]:>9.2f} {r['arm_cost_median_us']:>6.1f}"
            )
    lines.append(
        f"(cb med: GPU done -> callback runs; hop med: callback -> coroutine resumes; loop asleep: "
        f"{report['idle_cpu_pct']['loop_asleep_baseline']:.2f}% CPU; target: median < 30 us, p99 < 200 us, idle < 5%)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--kernel-us", type=int, nargs="+", default=[20, 200], help="kernel lengths before the stamp")
    parser.add_argument("--idle-s", type=float, default=1.0)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)

    backend = cu.create_cuda_backend(device=0)
    bench = Bench(backend, slots=2)

    async def run() -> dict[str, Any]:
        by_kernel = {str(k): await measure(args, bench, k) for k in args.kernel_us}
        return {"by_kernel_us": by_kernel, "idle_cpu_pct": await idle_cpu(args, bench)}

    if args.loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            report = runner.run(run())
    else:
        report = asyncio.run(run())
    report.update(
        loop=args.loop,
        device=backend.device.device_name,
        versions=versions(),
        args=vars(args),
        method=__doc__,
        argv=sys.argv,
    )
    bench.close()
    backend.close()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
