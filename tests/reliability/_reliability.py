"""Helpers of the reliability suite: the load scale, and the checks that nothing was lost.

They only observe a manager, through its public read-only views (``stats()``, ``statistics()``);
they never repair what a test should have left clean. Set ``AIOCUBIE_SOAK=1`` to run load and storms at full size.
"""

from __future__ import annotations

import os
import threading

import anyio
from simkit import LOOPS as LOOPS  # the loops every adversarial suite runs on (tests in tests/ use them too)

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.errors import AiocubieError
from aiocubie.simulator import SimulatorBackend

#: Full-size load and storms (``AIOCUBIE_SOAK=1``); CI runs a scaled-down version.
SOAK = os.environ.get("AIOCUBIE_SOAK", "") not in ("", "0")


class Component:
    """A stand-in for a solver or loader: any weak-referenceable object can register."""

    def __init__(self, tag: object = None) -> None:
        self.tag = tag


def pending(mgr: MemoryManager) -> int:
    """Requests the group schedulers still hold (queued, being planned or in flight)."""
    return mgr.statistics().pending


async def settle(mgr: MemoryManager) -> None:
    """Wait until no scheduler holds a ticket (bound it with ``anyio.fail_after``)."""
    while pending(mgr):
        await anyio.sleep(0.002)


def assert_empty(mgr: MemoryManager, sim: SimulatorBackend | None = None) -> None:
    """Accounting is back to exactly zero: stats, per group and instance, ledger, device."""
    snap = mgr.stats()
    assert snap.live_bytes == 0, f"{snap.live_bytes} bytes still live"
    assert {g: s.live_bytes for g, s in snap.groups.items() if s.live_bytes} == {}
    assert {i: s.live_bytes for i, s in snap.instances.items() if s.live_bytes} == {}
    assert mgr.statistics().allocations == 0
    if sim is not None:
        assert sim.used == 0, f"the simulator still holds {sim.used} bytes"


async def outcome(mgr: MemoryManager, instance: object, requests: dict[str, ArrayRequest]) -> object:
    """Await one request: its ArrayResponse, or the AiocubieError it ended with."""
    try:
        return await mgr.request(instance, requests)
    except AiocubieError as exc:
        return exc


def _seeds() -> list[int]:
    if os.environ.get("AIOCUBIE_SEED"):
        return [int(os.environ["AIOCUBIE_SEED"])]
    return list(range(10 if SOAK else 2))


#: Seeds of the randomized suites: two in CI, ten under soak; ``AIOCUBIE_SEED=n`` runs seed n alone.
SEEDS = _seeds()


def enable_soak() -> None:
    """Full size from now on (``--soak``: this module may be imported before the option is read)."""
    global SOAK, SEEDS
    SOAK = True
    SEEDS = _seeds()


def scale(ci: int, soak: int) -> int:
    """``ci`` in CI, ``soak`` under ``--soak``."""
    return soak if SOAK else ci


def sim_stream_threads() -> int:
    """Simulator stream worker threads alive now."""
    return sum(t.name.startswith("aiocubie-sim-stream-") for t in threading.enumerate())


MiB = 1 << 20


def block(mib: float = 0.25) -> dict[str, ArrayRequest]:
    """One chunkable float32 request of about ``mib`` MiB."""
    return {"x": ArrayRequest((4, int(mib * MiB) // 16), "float32", chunk_axis=1)}
