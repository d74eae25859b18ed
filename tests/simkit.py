"""Helpers shared by the service tests (manager, scheduler): components, requests, stream gates.

Plain functions over the real simulator backend; nothing here replaces or mocks a component.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio

from aiocubie import ArrayRequest, MemoryManager, SimulatorBackend

TOTAL = 1_000_000  # bytes of the simulated device
HANG_GUARD = 10  # seconds: only a hung test takes this long


class Part:
    """A component to register: any weak-referenceable object will do."""


def vec(n: int, dtype: str = "float64", **kwargs: Any) -> ArrayRequest:
    """A 1-d request of ``n`` elements."""
    return ArrayRequest((n,), dtype, **kwargs)


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` until it holds (a hang fails after HANG_GUARD seconds)."""
    with anyio.fail_after(HANG_GUARD):
        while not predicate():
            await anyio.sleep(0.001)


def hold_stream(stream: Any) -> threading.Event:
    """Keep the simulator ``stream`` busy until the returned gate is set."""
    gate = threading.Event()
    stream.enqueue(lambda: gate.wait(HANG_GUARD))
    return gate


def assert_all_released(mgr: MemoryManager, sim: SimulatorBackend) -> None:
    """Accounting is back to exactly zero, in the manager and on the device."""
    assert mgr.stats().live_bytes == 0
    assert sim.used == 0
