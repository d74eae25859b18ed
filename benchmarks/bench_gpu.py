"""The CUDA backend as a benchmark device: raw CuPy-pool and numba baselines, a stream blocker.

Only ``benchmarks/run --backend cuda`` imports this module: it is the one that imports
numba.cuda, CuPy and cuda.bindings.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import itertools
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import cupy
from bench_common import MIB, RawPath, Settings, Step
from bench_sim import F32, SHAPE, backend_path
from cuda.bindings import driver as binding
from numba import cuda

from aiocubie import ALLOCATORS
from aiocubie._backends import ARRAY_TYPES
from aiocubie._backends._cuda import CudaBackend, _stream_ptr

#: Kernel length before the stamp in bridge.py's measurement: allocation-sized GPU work.
KERNEL_US = 20

_HOST_FN_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_blocks: dict[int, tuple[float, list[int]]] = {}
_keys = itertools.count(1)  # 0 would arrive as None


@_HOST_FN_TYPE
def _sleep_then_stamp(key: int) -> None:
    # Runs on a CUDA driver thread: the stream waits until it returns.
    seconds, ended = _blocks.pop(key)
    time.sleep(seconds)
    ended.append(time.perf_counter_ns())


_SLEEP_FN = binding.CUhostFn(ctypes.cast(_sleep_then_stamp, ctypes.c_void_p).value)


class CudaDevice:
    """Device 0 through aiocubie's CudaBackend, plus the raw paths it is compared with."""

    name = "cuda"
    allocators = ALLOCATORS
    array_types = ARRAY_TYPES
    baseline = "raw CuPy MemoryPool.malloc + event record + synchronize"

    def __init__(self) -> None:
        self.backend = CudaBackend()
        self._others: dict[str, CudaBackend] = {}
        self._fresh_streams()

    def backend_for(self, array_type: str) -> CudaBackend:
        """A backend on the same context and allocator handing out ``array_type`` arrays."""
        if array_type == self.backend.array_type:
            return self.backend
        other = self._others.get(array_type)
        if other is None or other.allocator != self.backend.allocator:
            # the allocator is installed already: this backend starts without a context reset
            other = self._others[array_type] = CudaBackend(self.backend.allocator, array_type=array_type)
        return other

    def _fresh_streams(self) -> None:
        self.stream = self.backend.device.create_stream()
        self.numba_stream = cuda.stream()
        self.cupy_stream = cupy.cuda.Stream(non_blocking=True)
        self.pool = cupy.cuda.MemoryPool()

    def use(self, allocator: str) -> None:
        """Switch the backend's allocator plugin (a context reset) and rebuild the raw paths' streams."""
        if allocator == self.backend.allocator:
            return
        self.pool.free_all_blocks()  # before the reset: these blocks belong to the old context
        del self.stream, self.numba_stream, self.cupy_stream, self.pool
        self.backend.set_allocator(allocator)
        self._fresh_streams()

    def raw_paths(self) -> dict[str, RawPath]:
        """Label -> raw path, the baseline first."""
        plugin = self.backend.allocator
        return {
            self.baseline: self._cupy_path,
            f"raw numba device_array + event + synchronize ({plugin} plugin)": self._numba_path,
            "raw backend: CudaBackend.allocate + record_event + synchronize": backend_path(self.backend, self.stream),
        }

    def _cupy_path(self, n: int) -> Step:
        pool, stream = self.pool, self.cupy_stream

        def step() -> Callable[[], None]:
            blocks = [pool.malloc(MIB) for _ in range(n)]
            event = cupy.cuda.Event(disable_timing=True)
            event.record(stream)
            event.synchronize()
            return blocks.clear

        return step

    def _numba_path(self, n: int) -> Step:
        stream = self.numba_stream

        def step() -> Callable[[], None]:
            arrays = [cuda.device_array(SHAPE, F32, stream=stream) for _ in range(n)]
            event = cuda.event(timing=False)
            event.record(stream)
            event.synchronize()
            return arrays.clear

        return step

    def block(self, stream: Any, seconds: float) -> Callable[[], int | None]:
        """Queue a host function that sleeps ``seconds`` on ``stream``; return a reader of the ns it ended at."""
        key, ended = next(_keys), []
        _blocks[key] = (seconds, ended)
        (err,) = binding.cuLaunchHostFunc(binding.CUstream(_stream_ptr(stream)), _SLEEP_FN, key)
        if err != binding.CUresult.CUDA_SUCCESS:
            del _blocks[key]
            raise RuntimeError(f"cuLaunchHostFunc failed: {err.name}")
        return lambda: ended[0] if ended else None

    def info(self) -> dict[str, Any]:
        """Device and library facts for the report."""
        facts: dict[str, Any] = {"device": self.backend.device.device_name}
        _, total = cuda.current_context().get_memory_info()
        facts["device_memory_mib"] = int(total) >> 20
        facts["driver_version"] = cupy.cuda.runtime.driverGetVersion()
        for dist in ("numba", "numba-cuda", "cupy-cuda13x", "cupy-cuda12x", "cuda-bindings"):
            try:
                facts[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                pass
        return facts

    def mechanisms(self, settings: Settings) -> dict[str, Any]:
        """benchmarks/bridge.py's comparison of event->loop mechanisms (asyncio, a 20 us kernel) on this backend."""
        import bridge

        args = argparse.Namespace(
            rounds=settings.iters(20, 2),
            per_round=settings.iters(20, 3),
            warmup=settings.iters(3, 1),
            idle_s=settings.idle_seconds,
        )
        bench = bridge.Bench(self.backend, slots=2)
        mechanism = self.backend.event_mechanism
        try:

            async def both() -> dict[str, Any]:
                measured = await bridge.measure(args, bench, KERNEL_US)
                return {"mechanisms": measured, "idle_cpu_pct": await bridge.idle_cpu(args, bench)}

            return asyncio.run(both())
        finally:
            bench.close()
            self.backend.event_mechanism = mechanism  # bridge.Bench switches it per sample

    def walk_kit(self) -> CudaWalkKit:
        """Raw copies and a timed kernel for bench_walk."""
        return CudaWalkKit(self.backend)

    def close(self) -> None:
        """Free the raw pool and the backend's pools."""
        self.pool.free_all_blocks()
        self.backend.close()


@cuda.jit
def _spin_copy(x: Any, y: Any, ns: int) -> None:  # pragma: no cover - runs on the GPU
    # y = x, after spinning about ``ns`` nanoseconds: a kernel of a chosen length.
    slept = 0
    while slept < ns:
        cuda.nanosleep(1000)
        slept += 1000
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, x.size, step):
        y[i] = x[i]


class CudaWalkKit:
    """What bench_walk needs of the GPU: raw CuPy copies, pinned host arrays, a timed kernel."""

    def __init__(self, backend: CudaBackend) -> None:
        self.backend = backend
        self.streams = (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True))

    def raw_copies(self, host_in: Any, host_out: Any, both: bool = True) -> float:
        """Seconds for raw CuPy ``cudaMemcpyAsync`` of ``host_in`` in and (``both``: at once,
        on a second stream) of a device array out to ``host_out``."""
        dev_in = cupy.empty(host_in.shape, host_in.dtype)
        dev_out = cupy.zeros(host_out.shape, host_out.dtype)
        s1, s2 = self.streams
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        cupy.cuda.runtime.memcpyAsync(dev_in.data.ptr, host_in.ctypes.data, host_in.nbytes, 4, s1.ptr)
        if both:
            cupy.cuda.runtime.memcpyAsync(host_out.ctypes.data, dev_out.data.ptr, host_out.nbytes, 4, s2.ptr)
        s1.synchronize()
        s2.synchronize()
        return time.perf_counter() - start

    def pinned(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.backend.device.host_array(shape, dtype, "pinned")

    def kernel(self, stream: Any, x: Any, y: Any, seconds: float) -> None:
        # numba arrays viewed without a sync: numba would otherwise synchronize the legacy
        # stream a CuPy array reports, stalling the host behind every copy in flight
        x = cuda.as_cuda_array(x.reshape(-1), sync=False)
        y = cuda.as_cuda_array(y.reshape(-1), sync=False)
        _spin_copy[264, 256, stream](x, y, int(seconds * 1e9))

    def close(self) -> None:
        pass
