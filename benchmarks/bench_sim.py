"""The simulator as a benchmark device: its raw path, stream blocker and allocators.

Imports no device library, so the whole benchmark suite runs on machines without a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from bench_common import MIB, RawPath, Step, allocate

from aiocubie import MemoryKind
from aiocubie._backends import Backend
from aiocubie.simulator import SimulatorBackend

F32 = np.dtype(np.float32)
SHAPE = (MIB // 4,)


def backend_path(backend: Backend, stream: Any) -> RawPath:
    """aiocubie's backend without the scheduler: allocate, record an event, synchronize."""

    def make(n: int) -> Step:
        def step() -> Callable[[], None]:
            releases = [allocate(backend, SHAPE, F32, MemoryKind.DEVICE, stream)[1] for _ in range(n)]
            backend.device.record_event(stream).synchronize()
            return lambda: _free_all(releases)

        return step

    return make


def _free_all(releases: list[Callable[[], None]]) -> None:
    for release in releases:
        release()


class SimDevice:
    """The simulator backend with zero stream latency: every cost measured is software."""

    name = "simulator"
    allocators = ("default",)
    array_types = ("cupy",)  # the simulator's array models cost alike: one is measured
    baseline = "raw backend: allocate + record_event + synchronize"

    def __init__(self) -> None:
        self.backend = SimulatorBackend()
        self.stream = self.backend.device.create_stream()

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
        return {"device": self.backend.device.device_name, "stream_latency_s": self.backend.device.latency}

    def walk_kit(self) -> SimWalkKit:
        """A simulator with copy engines, for bench_walk."""
        return SimWalkKit()

    def close(self) -> None:
        """Stop the simulated streams."""
        self.backend.close()


class SimWalkKit:
    """What bench_walk needs of the simulator: engines with a bandwidth, raw copies, a timed kernel.

    The simulator's own walk benchmark is a model check (sizes and bandwidths are small); the
    targets are for the GPU.
    """

    bandwidth = 400e6  # bytes/s per copy engine

    def __init__(self) -> None:
        from aiocubie.simulator import Engines

        self.backend = SimulatorBackend(
            1 << 30, engines=Engines(h2d_bandwidth=self.bandwidth, d2h_bandwidth=self.bandwidth)
        )

    def raw_copies(self, host_in: np.ndarray[Any, Any], host_out: np.ndarray[Any, Any], both: bool = True) -> float:
        """Seconds to copy ``host_in`` in and (with ``both``, at once) a device array out to ``host_out``."""
        backend, kind = self.backend, MemoryKind.DEVICE
        dev_in, release_in = allocate(backend, host_in.shape, host_in.dtype, kind, None)
        dev_out, release_out = allocate(backend, host_out.shape, host_out.dtype, kind, None)
        s1, s2 = backend.device.create_stream(), backend.device.create_stream()
        start = time.perf_counter()
        backend.device.copy(host_in, dev_in, s1)
        if both:
            backend.device.copy(dev_out, host_out, s2)
        backend.device.record_event(s1).synchronize()
        backend.device.record_event(s2).synchronize()
        elapsed = time.perf_counter() - start
        release_in()
        release_out()
        return elapsed

    def pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
        return self.backend.device.host_array(shape, np.dtype(dtype), MemoryKind.PINNED)

    def kernel(self, stream: Any, x: Any, y: Any, seconds: float) -> None:
        from aiocubie._backends._sim import host_data

        src, dst = host_data(x), host_data(y)
        self.backend.launch(stream, lambda: np.copyto(dst, src), duration=seconds)

    def close(self) -> None:
        self.backend.close()
