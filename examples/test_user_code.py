"""Testing your own aiocubie code with pytest-asyncio and the aiocubie.testing fixtures.

Run: python -m pytest examples/test_user_code.py
The fixtures load in every pytest session once aiocubie is installed (a ``pytest11`` entry point):
no ``pytest_plugins`` line is needed. These tests use pytest-asyncio (``pip install pytest-asyncio``;
the ``test`` extra brings it); ``@pytest.mark.anyio`` tests use ``aiocubie_manager`` instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager, walk_chunks
from aiocubie.errors import AllocationError


class Smoother:
    """The code under test: a 3-point moving average of every run, chunk by chunk."""

    async def smooth(self, mgr: MemoryManager, signal: np.ndarray) -> tuple[np.ndarray, int]:
        out = np.empty_like(signal)
        requests = {"x": ArrayRequest(signal.shape, signal.dtype), "y": ArrayRequest(signal.shape, signal.dtype)}
        async with mgr.request(self, requests) as response:
            async for chunk in walk_chunks(response, inputs={"x": signal}, outputs={"y": out}):
                x, y = chunk.device["x"], chunk.device["y"]
                y[...] = x
                y[:, 1:-1] = (x[:, :-2] + x[:, 1:-1] + x[:, 2:]) / 3
            return out, response.chunks


def expected(signal: np.ndarray) -> np.ndarray:
    want = signal.copy()
    want[:, 1:-1] = (signal[:, :-2] + signal[:, 1:-1] + signal[:, 2:]) / 3
    return want


@pytest.mark.asyncio
async def test_smoother_is_right_when_the_device_is_small(aiocubie_manager_factory) -> None:
    signal = np.random.default_rng(1).standard_normal((5_000, 16))
    async with aiocubie_manager_factory(total=64 << 10) as mgr:  # 64 KiB: the 1.3 MB job is chunked
        smoother = Smoother()
        mgr.register(smoother)
        out, chunks = await smoother.smooth(mgr, signal)
    assert chunks > 1
    np.testing.assert_allclose(out, expected(signal))


@pytest.mark.asyncio
async def test_smoother_reports_an_allocation_failure(aiocubie_manager_factory) -> None:
    async with aiocubie_manager_factory() as mgr:
        mgr.backend.faults.inject("allocate")
        smoother = Smoother()
        mgr.register(smoother)
        with pytest.raises(AllocationError):
            await smoother.smooth(mgr, np.zeros((10, 4)))
        assert mgr.backend.used == 0
