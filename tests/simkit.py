"""Helpers shared by the service tests (manager, scheduler): components, requests, stream gates, event loops.

Plain functions over the real simulator backend; nothing here replaces or mocks a component.
"""

from __future__ import annotations

import importlib.util
import math
import threading
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryKind, MemoryManager
from aiocubie._backends import Backend, Block, MemoryResource
from aiocubie.errors import AiocubieWarning
from aiocubie.simulator import SimulatorBackend

TOTAL = 1_000_000  # bytes of the simulated device

#: For a test that needs numba (its arrays, its kernels, the demo): the numba extra, which CI's
#: numba-free run does not install.
needs_numba = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="needs numba, the numba extra: pip install 'aiocubie[numba]'"
)
HANG_GUARD = 10  # seconds: only a hung test takes this long


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


#: The loops the adversarial suites run on: use as ``@pytest.fixture(params=LOOPS) anyio_backend``, or
#: ``@pytest.mark.parametrize("anyio_backend", LOOPS)`` for one test among tests on asyncio and trio.
LOOPS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param("trio", id="trio"),
    pytest.param(
        ("asyncio", {"use_uvloop": True}),
        id="uvloop",
        marks=pytest.mark.skipif(not _has_uvloop(), reason="uvloop is not installed"),
    ),
]

#: The AiocubieWarning of a request that waits (policy "wait") for memory its own member holds.
WAITS_ON_ITSELF = "waits for memory its own requester"
#: For a test that provokes that warning on purpose (the member's memory held by another of its
#: tasks, released later) and checks something else: AiocubieWarnings are errors in the tests.
ignore_waits_on_itself = pytest.mark.filterwarnings(f"ignore:.*{WAITS_ON_ITSELF}:aiocubie.errors.AiocubieWarning")


def warns_waits_on_itself() -> pytest.WarningsRecorder:
    """``pytest.warns`` for the warning of a request waiting on memory its own member holds."""
    return pytest.warns(AiocubieWarning, match=WAITS_ON_ITSELF)


class Part:
    """A component to register: any weak-referenceable object will do."""


def vec(n: int, dtype: str = "float64", **kwargs: Any) -> ArrayRequest:
    """A 1-d request of ``n`` elements."""
    return ArrayRequest((n,), dtype, **kwargs)


def xy_requests(shape: tuple[int, int]) -> dict[str, ArrayRequest]:
    """A walk's requests: ``x`` in, ``y`` out, float32 of ``shape``, chunked on axis 0, two buffers each."""
    return {label: ArrayRequest(shape, np.float32, chunk_axis=0, buffers=2) for label in ("x", "y")}


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


async def interrupt_in_flight(
    mgr: MemoryManager,
    sim: SimulatorBackend,
    part: Part,
    requests: dict[str, ArrayRequest],
    interrupt: Callable[[], object],
    expected: type[BaseException],
) -> list[BaseException]:
    """Run ``interrupt()`` while ``part``'s request is allocated but its stream held shut.

    Returns the ``expected`` errors the request raised (a request that resolves anyway, or
    raises something else, fails the test).
    """
    errors: list[BaseException] = []
    used = sim.used + sum(r.nbytes for r in requests.values())

    async def in_flight() -> None:
        try:
            await mgr.request(part, requests)
        except expected as exc:
            errors.append(exc)
        else:
            raise AssertionError("the request resolved despite the interruption")

    gate = hold_stream(mgr.groups.stream(part))
    try:
        with anyio.fail_after(HANG_GUARD):
            async with anyio.create_task_group() as tg:
                tg.start_soon(in_flight)
                await wait_until(lambda: sim.used == used)
                interrupt()
    finally:
        gate.set()
    return errors


def assert_all_released(mgr: MemoryManager, sim: SimulatorBackend) -> None:
    """Accounting is back to exactly zero, in the manager and on the device (once the streams'
    queued frees ran: a block goes back when its stream reaches its free, as on a GPU)."""
    assert mgr.stats().live_bytes == 0
    sim.device.synchronize()
    assert sim.used == 0


class ByHand:
    """Allocate and free through a backend's resource and array maker, as the device account does.

    ``allocate(shape, dtype, kind, stream)`` gives an array over a fresh block; ``free(array)``
    gives that block back (a second time: the resource's error).
    """

    def __init__(self, backend: Backend, resource: MemoryResource | None = None) -> None:
        self.backend = backend
        self.resource = backend.resource if resource is None else resource
        self.blocks: dict[int, tuple[Any, Block]] = {}

    def allocate(self, shape: tuple[int, ...], dtype: Any, kind: MemoryKind | str, stream: Any) -> Any:
        dtype, kind = np.dtype(dtype), MemoryKind(kind)
        block = self.resource.allocate(math.prod(shape) * dtype.itemsize, kind, stream)
        array = self.backend.arrays.make(block, shape, dtype, stream)
        self.blocks[id(array)] = (array, block)
        return array

    def free(self, array: Any) -> None:
        _, block = self.blocks.get(id(array), (None, None))
        if block is None:
            raise AssertionError(f"not allocated here: {type(array).__name__}")
        # the handle stays behind (it would keep the memory in the pool's use); a second free of
        # the array hands the resource a stand-in, which it refuses as a block given back twice
        self.blocks[id(array)] = (None, Block(block.ptr, block.nbytes, block.kind, block.stream, None))
        self.resource.deallocate(block)
