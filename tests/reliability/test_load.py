"""Load: many tasks in active mode with policy "wait" stay within budget, in order, and all finish.

Peak live bytes never exceed a group's budget (the sum of its members' caps), requests of a group
resolve in the order they were submitted, and every task completes (nothing starves).
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict

import anyio
import pytest
from _reliability import SOAK, Component

from aiocubie import ArrayRequest, ArrayResponse, MemoryManager
from aiocubie.simulator import SimulatorBackend

pytestmark = pytest.mark.anyio

MiB = 1 << 20
RUNS = 1024
GROUPS = ("solve", "load", "infer", "post")
MEMBERS_PER_GROUP = 5


@pytest.mark.parametrize("latency", [0.0, 0.0002])
async def test_many_tasks_stay_in_budget_in_order_and_all_finish(latency: float, drained) -> None:
    tasks, per_task = (1000, 100) if SOAK else (1000, 5)
    rng = random.Random(7)
    sim = SimulatorBackend(256 * MiB, latency=latency)
    with anyio.fail_after(1800 if SOAK else 60):
        async with MemoryManager(sim, mode="active", policy="wait", batch_window=0.001) as mgr:
            submitted: dict[str, itertools.count[int]] = {g: itertools.count() for g in GROUPS}
            resolved_at: dict[str, itertools.count[int]] = {g: itertools.count() for g in GROUPS}
            resolution: dict[int, int] = {}  # id(response) -> its place in its group's resolution order
            order: dict[str, list[tuple[int, int]]] = defaultdict(list)  # group -> (submitted, resolved)

            def on_ready(group: str):  # type: ignore[no-untyped-def]
                def hook(response: ArrayResponse) -> None:
                    if response.arrays:  # members with nothing queued get an empty response too
                        resolution[id(response)] = next(resolved_at[group])

                return hook

            members = [Component((g, i)) for g in GROUPS for i in range(MEMBERS_PER_GROUP)]
            for member in members:
                group = member.tag[0]
                mgr.register(member, proportion=0.04, stream_group=group, ready_hook=on_ready(group))
            group_cap = {g: sum(mgr.budget.cap(m) for m in members if m.tag[0] == g) for g in GROUPS}
            finished = 0

            async def worker(member: Component) -> None:
                nonlocal finished
                group = member.tag[0]
                for _ in range(per_task):
                    request = {"x": ArrayRequest((rng.randint(1, 64), RUNS), "float32", chunk_axis=1)}
                    # no checkpoint between taking the number and queueing the ticket
                    place = next(submitted[group])
                    async with mgr.request(member, request) as response:
                        order[group].append((place, resolution.pop(id(response))))
                        for _ in range(rng.randint(0, 3)):
                            await anyio.lowlevel.checkpoint()  # hold the arrays a moment
                finished += 1

            async with anyio.create_task_group() as tg:
                for index in range(tasks):
                    tg.start_soon(worker, members[index % len(members)])

            assert finished == tasks
            snap = mgr.stats()
            for group in GROUPS:
                assert snap.groups[group].peak_bytes <= group_cap[group], group
                assert snap.groups[group].requests == len(order[group]) == tasks * per_task // len(GROUPS)
                by_submission = [resolved for _, resolved in sorted(order[group])]
                assert by_submission == sorted(by_submission), f"group {group!r} resolved out of order"
                # the budget was the limit that mattered: the group came close to it
                assert snap.groups[group].peak_bytes > group_cap[group] // 2
            assert snap.peak_bytes <= sum(group_cap.values())
            await drained(mgr, sim)
