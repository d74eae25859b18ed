"""Observability on a real GPU: the history of a chunked batch, the summary, pool facts, JSON.

Each allocator in turn (the ``backend`` fixture), on asyncio and trio. Skipped without a GPU
(see conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.stats import EventKind, History, render_history

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]

MiB = 1 << 20


class Part:
    """A component."""


async def test_history_summary_and_snapshot_of_a_chunked_batch(backend: Any, tmp_path: Path) -> None:
    async with MemoryManager(backend, mode="active") as mgr:
        mgr.record_history()
        part = Part()
        mgr.register(part, stream_group="solve", name="solver", proportion=0.001)
        cap = mgr.budget.cap(part)
        runs = 2 * cap // 4 // 16  # twice the cap (a thousandth of the GPU) in float32 rows of 16: chunked
        request = {"x": ArrayRequest((runs, 16), np.float32), "w": ArrayRequest((16,), np.float32, unchunkable=True)}
        async with mgr.request(part, request) as response:
            assert response.chunks > 1
            assert mgr.stats().groups["solve"].live_bytes > 0
        snapshot = mgr.stats()
        summary = mgr.summary()
        history = mgr.history()
    plan, *allocations = [e for e in history.events if e.kind in (EventKind.PLAN, EventKind.ALLOCATE)]
    assert (plan.group, plan.chunks, plan.chunk_length) == ("solve", response.chunks, response.chunk_length)
    assert {(e.instance, e.label) for e in allocations} == {("solver", "x"), ("solver", "w")}
    assert [e.kind for e in history.events].count(EventKind.RELEASE) == 2
    assert history.series("group")["solve"][1][-1] == 0
    peak = snapshot.groups["solve"].peak_bytes
    assert 0 < peak <= snapshot.groups["solve"].cap_bytes  # type: ignore[operator]
    assert "solve" in summary and "solver" in summary
    facts = snapshot.to_dict()
    assert json.loads(json.dumps(facts))["groups"]["solve"]["peak_bytes"] == peak
    if backend.resource.name != "numba":  # the pools (the driver's, CuPy's) can say what they hold
        assert snapshot.pool.held is not None and snapshot.pool.held >= snapshot.pool.in_use  # type: ignore[operator]
    saved = tmp_path / "history.json"
    history.to_json(saved)
    assert History.load(saved).events == history.events
    page = render_history(history, tmp_path / "history.html")
    assert "<svg" in page.read_text()
