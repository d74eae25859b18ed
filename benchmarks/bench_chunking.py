"""Chunked batches: how much of its budget a chunked batch uses, and its chunk count against the minimum.

Four members of one group each ask for one float32 array of 4 KiB, 1 MiB or 256 MiB along the run
axis; active mode with no headroom gives the group a budget of 1/2.5, 1/3.3 or 1/3.97 of the batch.
"""

from __future__ import annotations

import math
import time

import anyio
import numpy as np
from bench_common import Device, Section, Settings, Table, ratio
from bench_latency import Owner

from aiocubie import ArrayRequest, MemoryManager

SIZES = {"4 KiB": 4 << 10, "1 MiB": 1 << 20, "256 MiB": 256 << 20}
MEMBERS = 4
#: The batch is this many times the budget (never a whole number, so the chunks cannot all be full).
OVERSUBSCRIPTION = (2.5, 3.3, 3.97)


async def chunked_batch(device: Device, nbytes: int, oversubscription: float, repeats: int) -> dict[str, float]:
    """Plan and allocate one chunked batch ``repeats`` times; what it used, and how fast."""
    total = device.backend.device.memory_info().total
    budget = math.floor(MEMBERS * nbytes / oversubscription)
    runs = nbytes // 4
    async with MemoryManager(device.backend, mode="active", headroom=0.0) as mgr:
        owners = [Owner() for _ in range(MEMBERS)]
        for owner in owners:
            mgr.register(owner, proportion=budget / MEMBERS / total, stream_group="chunked")
        budget = sum(mgr.budget.cap(owner) for owner in owners)  # caps round down to whole bytes
        request = {"state": ArrayRequest((runs,), np.float32, chunk_axis=0)}
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            async with anyio.create_task_group() as tg:
                responses = []

                async def ask(owner: Owner) -> None:
                    responses.append(await mgr.request(owner, request))

                for owner in owners:
                    tg.start_soon(ask, owner)
            seconds.append(time.perf_counter() - start)
            used = sum(device.backend.arrays.nbytes(r.arrays["state"]) for r in responses)
            chunks = {r.chunks for r in responses}
            for response in responses:
                mgr.release(response)
    assert len(chunks) == 1, f"members of one batch got different plans: {chunks}"
    longest = budget // (MEMBERS * 4)  # whole runs that fit the budget
    return {
        "budget": budget,
        "used": used,
        "chunks": chunks.pop(),
        "fewest": math.ceil(runs / longest),  # the least any plan can do
        "longest_used": longest * MEMBERS * 4,  # first chunk's bytes had chunks been as long as fit
        "seconds": float(np.median(seconds)),
    }


def run(device: Device, settings: Settings) -> Section:
    """One row per size and oversubscription, with the device's first allocator."""
    section = Section()
    table = Table(
        "Chunked batches",
        [
            "array size",
            "batch / budget",
            "budget bytes",
            "used / budget",
            "chunks",
            "minimum chunks",
            "used / budget, longest chunks",
            "ready ms",
        ],
        note=f"{MEMBERS} members x one float32 array each, one batch; budget = the group's cap (active mode, "
        "headroom 0). used: bytes of the arrays allocated for one chunk. minimum chunks: ceil(runs / whole "
        "runs that fit the budget). longest chunks: what the first chunk would use were chunks as long as "
        "fit (the last one shorter) instead of equal, ceil(runs / chunks). ready ms: median request->ready "
        "of the whole batch.",
    )
    device.use(device.allocators[0])
    uses, extra = [], []
    for label, nbytes in SIZES.items():
        for oversubscription in OVERSUBSCRIPTION:
            result = anyio.run(chunked_batch, device, nbytes, oversubscription, settings.iters(5, 2), backend="asyncio")
            use = ratio(result["used"], result["budget"])
            uses.append(use or 0.0)
            extra.append(result["chunks"] - result["fewest"])
            table.add(
                label,
                oversubscription,
                result["budget"],
                use,
                result["chunks"],
                result["fewest"],
                ratio(result["longest_used"], result["budget"]),
                round(result["seconds"] * 1e3, 3),
            )
    # the plan is the same on every backend, so these targets are checked everywhere
    section.target("chunked batches: used / budget, worst case", min(uses), 0.95, at_least=True)
    section.target("chunked batches: chunks over the minimum, worst case", max(extra), 0)
    section.tables.append(table)
    return section
