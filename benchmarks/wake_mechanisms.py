"""Wake-up mechanisms head to head on a GPU: a kernel ends -> the awaiting coroutine resumes.

A standalone experiment (issue 32, "a wake-up near the hop floor"), built on ``bridge.py``'s
timestamping kernel and clock calibration. Every mechanism waits for one kernel of ``--kernel-us``
that stamps %globaltimer as it ends; rounds interleave the mechanisms. ``floor`` is a thread ->
loop hop with no GPU (a helper thread wakes at a deadline and calls ``call_soon_threadsafe``):
its number is callback -> resume, the loop's own wake-up cost. Idle CPU: process CPU time over
wall time while one 1 s kernel is pending. Also times an event's record + query with and
without timing. Not a test: it only reports. Usage: ``python3 benchmarks/wake_mechanisms.py
--loop asyncio --json out.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import queue
import random
import sys
import threading
import time
import types
from collections.abc import Callable, Generator
from typing import Any

from bridge import Bench, _stats

from aiocubie._backends import _cuda as cu

MECHANISMS = ("floor", "thread", "spin200_thread", "spin2ms_thread", "loop_poller", "host_close", "thread_poll")
DESCRIPTIONS = {
    "floor": "no GPU: a helper thread wakes at a deadline and calls call_soon_threadsafe (the hop floor)",
    "thread": "today's fallback: StreamWaiter thread in a blocking-sync, no-timing Event.sync(), then the hop",
    "spin200_thread": "the task polls event.query() between loop iterations for 200 us, then the thread",
    "spin2ms_thread": "the task polls event.query() between loop iterations for 2 ms, then the thread",
    "loop_poller": "one loop callback a loop iteration queries every pending event for 2 ms, then the thread",
    "host_close": "cuLaunchHostFunc(libc close, pipe write end): the loop's reader sees EOF (no Python in the driver)",
    "thread_poll": "a helper thread polls event.query() for 2 ms (then blocks), then the hop",
}


@types.coroutine
def _yield_once() -> Generator[None, None, None]:
    yield


class LoopPoller:
    """Idea (1): one callback a loop iteration queries every pending event; past ``budget`` the thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, budget: float) -> None:
        self.loop, self.budget = loop, budget
        self.pending: list[tuple[Any, Callable[[], None]]] = []
        self.deadline = 0.0
        self.armed = False

    def add(self, event: Any, done: Callable[[], None]) -> None:
        self.pending.append((event, done))
        self.deadline = time.perf_counter() + self.budget
        if not self.armed:
            self.armed = True
            self.loop.call_soon(self.tick)

    def tick(self) -> None:
        keep = []
        for event, done in self.pending:
            if event.query():
                done()
            else:
                keep.append((event, done))
        self.pending = keep
        if not keep:
            self.armed = False
        elif time.perf_counter() < self.deadline:
            self.loop.call_soon(self.tick)
        else:
            self.armed = False
            self.pending = []
            for event, done in keep:
                event.add_done_callback(lambda d=done: self.loop.call_soon_threadsafe(d))


class PollThread:
    """A helper thread that polls an event for ``budget`` seconds, then blocks in its sync()."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.jobs: queue.SimpleQueue[tuple[Any, Callable[[], None]] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while (job := self.jobs.get()) is not None:
            event, done = job
            deadline = time.perf_counter() + self.budget
            while not event.query() and time.perf_counter() < deadline:
                pass
            event.synchronize()
            done()
            del job, event, done

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


class Probe:
    def __init__(self, bench: Bench) -> None:
        from cuda.bindings import driver

        self.bench, self.driver = bench, driver
        libc = ctypes.CDLL(None, use_errno=True)
        self.close_fn = driver.CUhostFn(ctypes.cast(libc.close, ctypes.c_void_p).value)
        self.poller: LoopPoller | None = None
        self.poll_thread = PollThread(0.002)

    async def wait(self, mechanism: str, kernel_ns: int, slot: int) -> tuple[int, int, int]:
        """(resume ns, callback ns, stamp) for one kernel of ``kernel_ns``."""
        bench = self.bench
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        called = [0]

        def resolve() -> None:
            called[0] = time.perf_counter_ns()
            loop.call_soon_threadsafe(fut.set_result, None)

        def resolve_here() -> None:
            called[0] = time.perf_counter_ns()
            fut.set_result(None)

        if mechanism == "floor":
            bench.floor_jobs.put((time.perf_counter() + kernel_ns / 1e9, resolve))
            await fut
            return time.perf_counter_ns(), called[0], 0
        bench.launch(kernel_ns, slot)
        if mechanism == "thread":
            bench.backend.device.record_event(bench.stream).add_done_callback(resolve)
            await fut
        elif mechanism in ("spin200_thread", "spin2ms_thread"):
            event = bench.backend.device.record_event(bench.stream)
            deadline = time.perf_counter() + (200e-6 if mechanism == "spin200_thread" else 2e-3)
            while True:
                await _yield_once()
                if event.query():
                    called[0] = time.perf_counter_ns()
                    break
                if time.perf_counter() >= deadline:
                    event.add_done_callback(resolve)
                    await fut
                    break
        elif mechanism == "loop_poller":
            if self.poller is None or self.poller.loop is not loop:
                self.poller = LoopPoller(loop, 0.002)
            self.poller.add(bench.backend.device.record_event(bench.stream), resolve_here)
            await fut
        elif mechanism == "host_close":
            rfd, wfd = os.pipe()

            def readable() -> None:
                loop.remove_reader(rfd)
                os.close(rfd)
                resolve_here()

            loop.add_reader(rfd, readable)
            stream = self.driver.CUstream(int(bench.stream.handle))
            (err,) = self.driver.cuLaunchHostFunc(stream, self.close_fn, wfd)
            assert int(err) == 0, err
            await fut
        elif mechanism == "thread_poll":
            self.poll_thread.jobs.put((bench.backend.device.record_event(bench.stream), resolve))
            await fut
        else:
            raise ValueError(mechanism)
        resumed = time.perf_counter_ns()
        stamp = int(bench.buf[slot])
        assert stamp, f"{mechanism}: resumed before the kernel stamped"
        return resumed, called[0] or resumed, stamp


async def measure(args: argparse.Namespace, probe: Probe, kernel_us: int) -> dict[str, Any]:
    kernel_ns = kernel_us * 1000
    total: dict[str, list[int]] = {m: [] for m in MECHANISMS}
    hop: dict[str, list[int]] = {m: [] for m in MECHANISMS}
    order = list(MECHANISMS)
    for _ in range(args.warmup):
        for mechanism in order:
            await probe.wait(mechanism, kernel_ns, 0)
    for _ in range(args.rounds):
        offset = min(probe.bench.calibrate(0, kernel_ns) for _ in range(5))
        random.shuffle(order)
        for mechanism in order:
            for _ in range(args.per_round):
                resumed, called, stamp = await probe.wait(mechanism, kernel_ns, 0)
                if mechanism != "floor":
                    total[mechanism].append(resumed - stamp - offset)
                hop[mechanism].append(resumed - called)
    out: dict[str, Any] = {}
    for m in MECHANISMS:
        out[m] = {"latency": _stats(total[m]) if total[m] else None, "callback_to_resume": _stats(hop[m])}
    return out


async def idle_cpu(args: argparse.Namespace, probe: Probe) -> dict[str, float]:
    out: dict[str, float] = {}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(args.idle_s)
    out["loop_asleep"] = round(100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0), 2)
    for mechanism in MECHANISMS:
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await probe.wait(mechanism, int(args.idle_s * 1e9), 1)
        out[mechanism] = round(100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0), 2)
    return out


def event_costs(backend: Any, n: int = 20000) -> dict[str, float]:
    """us per record + query of one reused event, by options (ideas 2 and 4)."""
    from cuda.core import EventOptions

    stream = backend.device.create_stream()
    out = {}
    for name, opts in {
        "blocking, no timing (today)": EventOptions(blocking_sync=True, timing_enabled=False),
        "blocking, timing": EventOptions(blocking_sync=True, timing_enabled=True),
        "spin, no timing": EventOptions(blocking_sync=False, timing_enabled=False),
        "spin, timing": EventOptions(blocking_sync=False, timing_enabled=True),
    }.items():
        event = stream.record(options=opts)
        event.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            stream.record(event)
            event.is_done  # noqa: B018
        out[name] = round((time.perf_counter() - t0) / n * 1e6, 3)
        event.sync()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--kernel-us", type=int, nargs="+", default=[20, 200, 1000, 5000])
    parser.add_argument("--idle-s", type=float, default=1.0)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    backend = cu.create_cuda_backend(device=0)
    probe = Probe(Bench(backend, slots=2))

    async def run() -> dict[str, Any]:
        by_kernel = {str(k): await measure(args, probe, k) for k in args.kernel_us}
        return {"by_kernel_us": by_kernel, "idle_cpu_pct": await idle_cpu(args, probe)}

    if args.loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            report = runner.run(run())
    else:
        report = asyncio.run(run())
    report["event_costs_us"] = event_costs(backend)
    report["loop"], report["what"] = args.loop, DESCRIPTIONS
    probe.poll_thread.close()
    probe.bench.close()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    print(
        f"-- {args.loop}: median / p99 us, GPU stamp -> resumed (floor: callback -> resumed); idle CPU % (1 s kernel)"
    )
    print(f"{'mechanism':<16}" + "".join(f"{k + ' us':>16}" for k in report["by_kernel_us"]) + f"{'idle%':>8}")
    for m in MECHANISMS:
        cells = []
        for cell in report["by_kernel_us"].values():
            s = cell[m]["latency"] or cell[m]["callback_to_resume"]
            cells.append(f"{s['median_us']:>7.1f}/{s['p99_us']:<7.1f}")
        print(f"{m:<16}" + "".join(f"{c:>16}" for c in cells) + f"{report['idle_cpu_pct'][m]:>8.2f}")
    print(
        "idle loop asleep:",
        report["idle_cpu_pct"]["loop_asleep"],
        "% ; event record+query us:",
        report["event_costs_us"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
