"""Seeded random op sequences while a history records, then its trace, series, plot, memory viz and JSON.

Requests (express and batched, several members and groups, priorities, ordered, spillable), cancelled
before they are ready; releases from another task; walks of depth 1 and 2, left early or cancelled
mid-walk; restores (``use()``); resets; unregistering; the history stopped and started again; rings
small enough to overflow. Every op ends with a documented error at worst, and every history read
makes a trace a viewer reads whole (``check_trace_event_format``).
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import anyio
import numpy as np
import pytest
from simkit import LOOPS, TOTAL, Part
from test_trace import check_trace_event_format

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager, walk_chunks, walk_requests
from aiocubie.errors import AiocubieError
from aiocubie.simulator import SimulatorBackend
from aiocubie.stats import History, render_history

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::aiocubie.errors.AiocubieWarning")]
OPS = ["request", "release", "walk", "use", "reset", "unregister", "restart"]


class _Run:
    """One seed's manager, members and held responses, and its ops."""

    def __init__(self, mgr: MemoryManager, rng: random.Random) -> None:
        self.mgr, self.rng = mgr, rng
        self.parts: list[Part] = []
        self.held: list[ArrayResponse] = []

    def add(self) -> Part:
        part = Part()
        group, priority = self.rng.choice(["g0", "g1", "g2"]), self.rng.randint(-2, 3)
        self.mgr.register(part, stream_group=group, name=f"p{len(self.parts)}", priority=priority)
        self.parts.append(part)
        return part

    async def request(self, rng: random.Random, part: Part) -> None:
        n = rng.choice([10, 1000, 10_000, TOTAL // 40, TOTAL // 16])
        requests = {
            f"a{i}": ArrayRequest((n,), "float64", spillable=rng.random() < 0.3, unchunkable=rng.random() < 0.5)
            for i in range(rng.randint(1, 3))
        }
        with anyio.move_on_after(rng.choice([0, 0.0005, 0.01, 5])):  # cancelled before it is ready, or not
            ordered, priority = rng.random() < 0.3, rng.choice([None, -1, 2, 5])
            self.held.append(await self.mgr.request(part, requests, ordered=ordered, priority=priority))

    async def walk(self, rng: random.Random, part: Part) -> None:
        x = np.arange(rng.choice([4, 64, 256]) * 64, dtype=np.float32).reshape(-1, 64)
        y = np.empty_like(x)
        depth, stop = rng.choice([1, 2]), rng.choice([None, 0, 1])
        requests = walk_requests({"x": ArrayRequest.like(x), "y": ArrayRequest.like(y)}, depth)
        with anyio.move_on_after(rng.choice([0.0002, 0.002, 5])):  # cancelled mid-walk, or not
            async with self.mgr.request(part, requests) as response:
                for _ in range(rng.choice([1, 2])):
                    walk = walk_chunks(response, inputs={"x": x}, outputs={"y": y}, depth=depth)
                    async with contextlib.aclosing(walk) as chunks:
                        async for chunk in chunks:
                            chunk.device["y"][...] = 2 * chunk.device["x"]
                            await anyio.sleep(0)
                            if chunk.index == stop:
                                break  # left early

    async def one(self, rng: random.Random) -> None:
        op = rng.choices(OPS, weights=[9, 3, 5, 1, 0.3, 0.3, 0.2])[0]
        live = [p for p in self.parts if self.mgr.is_registered(p)] or [self.add()]
        part = rng.choice(live)
        if op == "request":
            await self.request(rng, part)
        elif op == "release" and self.held:
            self.held.pop(rng.randrange(len(self.held))).release()  # often another task's
        elif op == "walk":
            await self.walk(rng, part)
        elif op == "use" and (spillable := [r for r in self.held if r.lease.spill is not None]):
            async with rng.choice(spillable).use():
                await anyio.sleep(0)
        elif op == "reset":
            (self.mgr.pool.invalidate_all if rng.random() < 0.5 else self.mgr.free_all)()
        elif op == "unregister":
            self.mgr.unregister(part)
            self.add()
        elif op == "restart":
            self.mgr.record_history(rng.random() < 0.7, max_entries=rng.choice([8, 64, 5000]))

    async def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(rng.randint(5, 15)):
            with contextlib.suppress(AiocubieError):  # documented refusals and failures only
                await self.one(rng)
            await anyio.sleep(rng.choice([0, 0, 0.001]))


def _read(history: History, out: Path) -> None:
    """Every reader of a history: the trace a viewer reads whole, the series, the plot, the memory viz, JSON."""
    check_trace_event_format(json.loads(history.to_perfetto(out / "t.json").read_text()))
    history.series("group")
    history.series("instance")
    if any(e.kind.value in ("allocate", "release") for e in history.events):  # else the plot refuses, saying so
        render_history(history, out / "h.html")
    history.to_memory_viz(out / "m.pickle")
    history.to_json(out / "h.json")
    check_trace_event_format(json.loads(History.load(out / "h.json").to_perfetto(out / "t.json").read_text()))


@pytest.mark.parametrize("anyio_backend", LOOPS)
@pytest.mark.parametrize("seed", range(6))
async def test_random_ops_while_recording_make_a_trace_a_viewer_reads(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    with SimulatorBackend(total=TOTAL) as sim:
        mode, policy = rng.choice(["passive", "active"]), rng.choice(["chunk", "wait", "fail"])
        async with MemoryManager(sim, mode=mode, policy=policy, batch_window=rng.choice([0, 0.003])) as mgr:
            mgr.record_history(max_entries=rng.choice([8, 200, 100_000]))
            run = _Run(mgr, rng)
            for _ in range(rng.randint(2, 5)):
                run.add()
            async with anyio.create_task_group() as tasks:
                for index in range(rng.randint(2, 5)):
                    tasks.start_soon(run.worker, seed * 100 + index)
            _read(mgr.history(), tmp_path)
        _read(mgr.history(), tmp_path)  # after the manager's exit
