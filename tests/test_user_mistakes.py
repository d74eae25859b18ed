"""What a new user trips on (issue 22): each mistake gets a message that says what to write.

A plain ``with mgr:``, a forgotten ``await``, a request after ``close()``, ``free`` of a label no
array has, the summary's per-group caps, and numpy arrays mixed with (simulated) CuPy arrays; on
asyncio and trio.
"""

from __future__ import annotations

import typing
from typing import Any

import numpy as np
import pytest
from simkit import TOTAL, Part, vec

from aiocubie import MemoryManager
from aiocubie._backends._sim import SimCupyArray
from aiocubie.errors import InvalidRequestError, ManagerStateError
from aiocubie.simulator import SimulatorBackend


def test_a_plain_with_says_to_write_async_with(sim: SimulatorBackend) -> None:
    mgr: Any = MemoryManager(sim)
    with pytest.raises(ManagerStateError, match=r"`async with`, not `with`: write `async with MemoryManager\(\)"):
        with mgr:
            pass


@pytest.mark.anyio
async def test_a_forgotten_await_says_to_write_await(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        pending: Any = mgr.request(part, {"x": vec(10)})  # forgot `await`
        with pytest.raises(AttributeError, match=r"'arrays': it is a request not yet awaited.*await mgr.request"):
            _ = pending.arrays
        assert not hasattr(pending, "__array_interface__")  # dunder look-ups stay plain
        with pytest.raises(InvalidRequestError, match="not awaited"):
            mgr.release(pending)
        response = await pending  # still usable: nothing was submitted
        mgr.release(response)
        assert mgr.stats().live_bytes == sim.used == 0


@pytest.mark.anyio
async def test_a_request_after_close_says_closed() -> None:
    mgr = MemoryManager(SimulatorBackend(TOTAL))
    part = Part()
    mgr.register(part)
    mgr.close()
    with pytest.raises(ManagerStateError, match="closed with close"):
        await mgr.request(part, {"x": vec(10)})


@pytest.mark.anyio
async def test_free_of_a_label_no_array_has_is_idempotent(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim) as mgr:
        part = Part()
        mgr.register(part)
        await mgr.request(part, {"x": vec(10)})
        mgr.free("nope")  # documented: nothing to free is not an error
        mgr.free("x")
        mgr.free("x")
        assert sim.used == 0


@pytest.mark.anyio
async def test_the_summary_says_caps_hold_per_group(sim: SimulatorBackend) -> None:
    async with MemoryManager(sim, mode="active", batch_window=0) as mgr:
        a, b = Part(), Part()
        mgr.register(a, proportion=0.2, stream_group="g")
        mgr.register(b, proportion=0.6, stream_group="g")
        assert "caps hold per group" not in mgr.summary()
        async with mgr.request(a, {"x": vec(TOTAL // 2 // 8, unchunkable=True)}):  # a: over its own 20%
            text = mgr.summary()
        assert "caps hold per group: an instance may use more than its own cap" in text


@pytest.mark.parametrize(
    "mix",
    [
        lambda a, h: a.__setitem__(slice(None), h),
        lambda a, h: a + h,
        lambda a, h: np.asarray(a),
    ],
    ids=["assign", "add", "asarray"],
)
def test_numpy_into_a_simulated_cupy_array_says_what_to_do(mix: typing.Any) -> None:
    device = SimCupyArray(np.zeros(3))
    with pytest.raises((TypeError, ValueError), match=r"\.set\(|\.get\(\)") as info:
        mix(device, np.ones(3))
    assert "mgr.host.to_device" in str(info.value) or "mgr.host.from_device" in str(info.value)
