"""The simulator as a benchmark device: its raw path, stream blocker and allocators.

Imports no device library, so the whole benchmark suite runs on machines without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_common import MIB, RawPath, Step

from aiocubie import MemoryKind, SimulatorBackend
from aiocubie._backends import Backend


F32 = np.dtype(np.float32)
SHAPE = (MIB // 4,)


def backend_path(backend: Backend, stream: Any) -> RawPath:
    """aiocubie's backend without the scheduler: allocate, record an event, synchronize."""

    def make(n: int) -> Step:
        def step() -> Callable[[], None]:
            arrays = [backend.allocate(SHAPE, F32, MemoryKind.DEVICE, stream) for _ in range(n)]
            backend.record_event(stream).synchronize()
            return lambda: _free_all(backend, arrays)

        return step

    return make


def _free_all(backend: Backend, arrays: list[Any]) -> None:
    for array in arrays:
        backend.free(array)


class SimDevice:
    """The simulator backend with zero stream latency: every cost measured is software."""

    name = "simulator"
    allocators = ("default",)
    array_types = ("cupy",)  # the simulator's array models cost alike: one is measured
    baseline = "raw backend: allocate + record_event + synchronize"

    def __init__(self) -> None:
        self.backend = SimulatorBackend()
        self.stream = self.backend.create_stream()

    def use(self, allocator: str) -> None:
        """The simulator's allocators behave alike: only ``default`` is measured."""

    def backend_for(self, array_type: str) -> SimulatorBackend:
        """The simulator (its CuPy-model arrays)."""
        return self.backend

    def raw_paths(self) -> dict[str, RawPath]:
        """Label -> raw path, the baseline first."""
        return {self.baseline: backend_path(self.backend, self.stream)}

    def block(self, stream: Any, seconds: float) -> Callable[[], int | None]:
        """Queue ``seconds`` of work on ``stream``; return a reader of the ns it ended at."""
        ended: list[int] = []

        def work() -> None:
            time.sleep(seconds)
            ended.append(time.perf_counter_ns())

        stream.enqueue(work)
        return lambda: ended[0] if ended else None

    def info(self) -> dict[str, Any]:
        """Device facts for the report."""
        return {"device": self.backend.device_name, "stream_latency_s": self.backend.latency}

    def close(self) -> None:
        """Stop the simulated streams."""
        self.backend.close()
