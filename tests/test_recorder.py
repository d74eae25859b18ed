"""Recorder: snapshots of mgr.stats() over time follow the bytes a pipeline holds."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.errors import ConfigurationError
from aiocubie.simulator import SimulatorBackend
from aiocubie.stats import Recorder


@pytest.mark.anyio
async def test_series_follows_live_bytes_per_group() -> None:
    async with MemoryManager(SimulatorBackend(1 << 20)) as mgr:
        solver = object()
        mgr.register(solver, stream_group="solve")
        async with Recorder(mgr, interval=0.001) as recorder:
            async with mgr.request(solver, {"a": ArrayRequest(1024, np.float64)}):
                held = recorder.take()
                await anyio.sleep(0.005)
    times, live = recorder.series("solve")
    assert held.groups["solve"].live_bytes == 8192
    assert len(times) == len(recorder.snapshots) >= 3  # entry, the one taken, exit
    assert times == sorted(times) and times[0] == 0.0
    assert live[0] == 0 and live[-1] == 0 and 8192 in live
    assert recorder.series()[1] == [s.live_bytes for s in recorder.snapshots]
    assert recorder.series("nobody")[1] == [0] * len(times)


def test_interval_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="interval must be a positive"):
        Recorder(MemoryManager(SimulatorBackend(1 << 20)), interval=0)
