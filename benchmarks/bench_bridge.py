"""The completion bridge: latency from the device finishing work to the awaiting task resuming,
and the CPU a process burns while its loop waits on a pending event.

A blocker queued on the stream stamps the host clock as it ends; an event recorded after it is
awaited through ``aiocubie._completion.wait_event``, the path every request takes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import numpy as np
from bench_common import Device, Section, Settings, Table, percent, summary
from bench_latency import LOOPS, Owner

from aiocubie import MemoryManager
from aiocubie._completion import thread_safe_caller, wait_event

#: How long the blocker holds the stream: long enough that the event is pending when awaited.
BLOCK_SECONDS = 0.0005


async def bridge_latency(device: Device, n: int, warmup: int) -> dict[str, np.ndarray[Any, Any]]:
    """Blocker end -> task resumed, through ``wait_event`` and split at the backend's callback."""
    backend, stream = device.backend, device.stream
    call_soon = thread_safe_caller()
    whole, to_callback, to_loop = [], [], []
    for i in range(warmup + n):
        ended = device.block(stream, BLOCK_SECONDS)
        await wait_event(backend.device.record_event(stream))
        resumed = time.perf_counter_ns()
        # the same hop, instrumented: when did the backend call back?
        ended_split = device.block(stream, BLOCK_SECONDS)
        called: list[int] = []
        done = anyio.Event()

        def on_done() -> None:
            called.append(time.perf_counter_ns())
            call_soon(done.set)

        backend.device.record_event(stream).add_done_callback(on_done)
        await done.wait()
        resumed_split = time.perf_counter_ns()
        if i >= warmup:
            whole.append(resumed - _stamp(ended))
            to_callback.append(called[0] - _stamp(ended_split))
            to_loop.append(resumed_split - called[0])
    return {
        "wait_event: blocker end -> task resumed": np.asarray(whole),
        "  split: blocker end -> backend callback": np.asarray(to_callback),
        "  split: backend callback -> task resumed": np.asarray(to_loop),
    }


def _stamp(ended: Callable[[], int | None]) -> int:
    stamp = ended()
    assert stamp is not None, "the event completed before the blocker ended"
    return stamp


async def cpu_share(wait: Callable[[], Awaitable[None]]) -> float:
    """Percent of one core the whole process uses (all threads) while ``wait()`` runs."""
    cpu, wall = time.process_time(), time.perf_counter()
    await wait()
    return percent(time.process_time() - cpu, time.perf_counter() - wall)


async def idle_cpu(device: Device, seconds: float) -> dict[str, float]:
    """CPU share of an idle loop, of one waiting on a pending event, and of an idle manager."""
    backend, stream = device.backend, device.stream
    shares = {"loop asleep (anyio.sleep), baseline": await cpu_share(lambda: anyio.sleep(seconds))}

    async def pending_event() -> None:
        device.block(stream, seconds)
        await wait_event(backend.device.record_event(stream))

    shares["awaiting a pending event (wait_event)"] = await cpu_share(pending_event)
    async with MemoryManager(backend) as mgr:
        owners = [Owner() for _ in range(8)]
        for i, owner in enumerate(owners):
            mgr.register(owner, stream_group=f"idle{i}")
        shares["manager with 8 idle group schedulers"] = await cpu_share(lambda: anyio.sleep(seconds))
    return shares


def run(device: Device, settings: Settings) -> Section:
    """Bridge latency per loop and idle CPU; on a GPU also benchmarks/bridge.py's mechanisms."""
    n, warmup = settings.iters(1000), settings.iters(50, 5)
    section = Section()
    latency = Table(
        "Completion bridge latency",
        ["loop", "path", "median us", "p99 us", "max us"],
        note=f"From the end of a {BLOCK_SECONDS * 1e6:g} us blocker queued on the stream (host clock "
        "stamped as it ends) to the awaiting task running; the event is recorded right after it.",
    )
    for loop in LOOPS:
        for label, samples in anyio.run(bridge_latency, device, n, warmup, backend=loop).items():
            stats = summary(samples)
            latency.add(loop, label, stats["median_us"], stats["p99_us"], round(float(samples.max()) / 1e3, 3))
            if device.name == "cuda" and loop == "asyncio" and label.startswith("wait_event"):
                section.target("bridge latency median (wait_event, asyncio)", stats["median_us"], 30.0, "us")
                section.target("bridge latency p99 (wait_event, asyncio)", stats["p99_us"], 200.0, "us")
    idle = Table(
        "CPU used while idle",
        ["loop", "state", "% of one core"],
        note=f"Process CPU time (all threads) over {settings.idle_seconds:g} s of wall time.",
    )
    for loop in LOOPS:
        for state, share in anyio.run(idle_cpu, device, settings.idle_seconds, backend=loop).items():
            idle.add(loop, state, share)
            if device.name == "cuda" and loop == "asyncio" and state.startswith("awaiting"):
                section.target("CPU while awaiting a pending event (asyncio)", share, 5.0, "% core")
    section.tables += [latency, idle]
    mechanisms = getattr(device, "mechanisms", None)
    if mechanisms is not None:
        section.tables.append(mechanism_table(mechanisms(settings)))
    return section


def mechanism_table(report: dict[str, Any]) -> Table:
    """benchmarks/bridge.py's report (GPU kernel end -> asyncio resume) as a table."""
    table = Table(
        "Event->loop mechanisms (benchmarks/bridge.py, asyncio)",
        [
            "mechanism",
            "median us",
            "p99 us",
            "GPU -> callback median us",
            "callback -> resumed median us",
            "idle CPU %",
            "what",
        ],
        note="From the GPU's %globaltimer stamp at the end of a 20 us kernel to the coroutine resuming, split "
        f"where the mechanism's callback runs (loop asleep: {report['idle_cpu_pct'].get('loop_asleep_baseline', '-')}% CPU).",
    )
    for name, result in report["mechanisms"].items():
        if name.startswith("_"):
            continue
        lat, called = result.get("latency") or {}, result.get("gpu_to_callback") or {}
        table.add(
            name,
            lat.get("median_us"),
            lat.get("p99_us"),
            called.get("median_us"),
            result["callback_to_resume"]["median_us"],
            report["idle_cpu_pct"].get(name),
            result["what"],
        )
    return table
