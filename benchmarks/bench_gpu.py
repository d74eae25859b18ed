"""The CUDA backend as a benchmark device: raw CuPy-pool (and numba) baselines, a stream blocker.

Only ``benchmarks/run --backend cuda`` imports this module: it is the one that imports CuPy and
cuda.bindings (and numba, where installed, for its raw path alone).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import importlib.util
import itertools
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import cupy
import numpy as np
from bench_common import MIB, RawPath, Settings, Step
from bench_sim import F32, SHAPE, backend_path
from cuda.bindings import driver as binding

from aiocubie._backends import Backend
from aiocubie._backends._cuda import create_cuda_backend, current_cupy_stream, stream_handle

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


def _numba_installed() -> bool:
    try:
        return importlib.util.find_spec("numba_cuda") is not None
    except ImportError:  # hidden (scripts/no_numba)
        return False


class CudaDevice:
    """Device 0 through aiocubie's CUDA backend (one per resource and array type), plus the raw paths."""

    name = "cuda"
    baseline = "raw CuPy MemoryPool.malloc + event record + synchronize"

    def __init__(self) -> None:
        numba = _numba_installed()
        self.allocators: tuple[str, ...] = ("driver", "cupy", "cupy_async", *(("numba",) if numba else ()))
        self.array_types: tuple[str, ...] = ("cupy", *(("numba",) if numba else ()))
        self._backends: dict[tuple[str, str], Backend] = {}
        self.allocator = self.allocators[0]
        self.backend = self.backend_for("cupy")
        self.stream = self.backend.device.create_stream()
        self.cupy_stream = cupy.cuda.Stream(non_blocking=True)
        self.pool = cupy.cuda.MemoryPool()

    def backend_for(self, array_type: str) -> Backend:
        """A backend on the allocator in use handing out ``array_type`` arrays (made once)."""
        key = (self.allocator, array_type)
        backend = self._backends.get(key)
        if backend is None:
            backend = self._backends[key] = create_cuda_backend(
                device=0, allocator=self.allocator, array_type=array_type
            )
        return backend

    def use(self, allocator: str) -> None:
        """Measure ``allocator`` from now on (its own backends; no context reset is needed)."""
        self.allocator = allocator
        self.backend = self.backend_for("cupy")
        self.stream = self.backend.device.create_stream()

    def raw_paths(self) -> dict[str, RawPath]:
        """Label -> raw path, the baseline first."""
        paths = {
            self.baseline: self._cupy_path,
            f"raw backend: {self.allocator} resource allocate + CuPy array + record_event + synchronize": backend_path(
                self.backend, self.stream
            ),
        }
        if "numba" in self.array_types:
            paths["raw numba device_array + event + synchronize"] = self._numba_path
        return paths

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
        from numba import cuda

        stream = cuda.stream()

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
        (err,) = binding.cuLaunchHostFunc(binding.CUstream(stream_handle(stream)), _SLEEP_FN, key)
        if err != binding.CUresult.CUDA_SUCCESS:
            del _blocks[key]
            raise RuntimeError(f"cuLaunchHostFunc failed: {err.name}")
        return lambda: ended[0] if ended else None

    def info(self) -> dict[str, Any]:
        """Device and library facts for the report."""
        device = self.backend.device
        facts: dict[str, Any] = {"device": device.device_name, "device_memory_mib": device.memory_info().total >> 20}
        facts["driver_version"] = cupy.cuda.runtime.driverGetVersion()
        for dist in ("cuda-core", "cuda-bindings", "cupy-cuda13x", "cupy-cuda12x", "numba", "numba-cuda"):
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
        try:

            async def both() -> dict[str, Any]:
                measured = await bridge.measure(args, bench, KERNEL_US)
                return {"mechanisms": measured, "idle_cpu_pct": await bridge.idle_cpu(args, bench)}

            return asyncio.run(both())
        finally:
            bench.close()

    def walk_kit(self) -> CudaWalkKit:
        """Raw copies and a timed kernel for bench_walk."""
        return CudaWalkKit(self.backend)

    def close(self) -> None:
        """Free the raw pool and every backend's pools."""
        self.pool.free_all_blocks()
        for backend in self._backends.values():
            backend.resource.release_cached()
            backend.close()


_SPIN_COPY = r"""
extern "C" __global__ void spin_copy(const unsigned char* x, unsigned char* y, long long n, long long ns) {
    // y = x, after spinning about ns nanoseconds: a kernel of a chosen length
    long long slept = 0;
    while (slept < ns) { __nanosleep(1000); slept += 1000; }
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = x[i];
}
"""


class CudaWalkKit:
    """What bench_walk needs of the GPU: raw CuPy copies, pinned host arrays, a timed kernel."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.streams = (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True))
        self._spin = cupy.RawModule(code=_SPIN_COPY).get_function("spin_copy")

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
        with current_cupy_stream(stream):
            self._spin((264,), (256,), (x, y, np.int64(x.nbytes), np.int64(int(seconds * 1e9))))

    def close(self) -> None:
        pass
