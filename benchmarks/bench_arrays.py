"""Array construction and kernel-launch costs on the GPU, each against a baseline of the same run.

Construction: a CuPy array over a CuPy pool block, a numba DeviceNDArray over one (what
aiocubie builds), ``cuda.device_array`` (numba's own path), and ``CudaBackend.allocate`` of each
array type. Launch: a numba kernel on two handed-out arrays of each type against two arrays
numba made itself (target: numba arrays <= 1.1x). Also checks interop facts the design relies
on and records deprecation warnings raised from aiocubie's own calls.
Run on the GPU: python3 benchmarks/bench_arrays.py [--out DIR] [--name NAME]. Prints medians in us.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

N = 3000  # timed repetitions per case
SHAPE = (256, 1024)  # 1 MiB of float32
F32 = np.dtype(np.float32)


def median_us(fn: Callable[[], Any], n: int = N, warm: int = 200) -> float:
    for _ in range(warm):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1e3


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--name", default="gpu-arrays")
    args = parser.parse_args()

    import cupy
    from numba import cuda

    from aiocubie._backends._cuda import CudaBackend, _arrays, _pools
    from aiocubie._requests import MemoryKind

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        numba_backend = CudaBackend("cupy", array_type="numba")
        cupy_backend = CudaBackend("cupy", array_type="cupy")
        stream = cupy_backend.create_stream()
        for backend in (numba_backend, cupy_backend):
            for kind in MemoryKind:
                a = backend.allocate(SHAPE, F32, kind, stream)
                backend.device.zero(a, stream)
                backend.device.copy(np.ones(SHAPE, F32), a, stream)
        stream.synchronize()
    ours = [w for w in caught if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning))]

    context = cuda.current_context()
    pool = context.memory_manager.pool
    nbytes = SHAPE[0] * SHAPE[1] * 4
    results: dict[str, float] = {}

    def raw_block() -> Any:
        return pool.malloc(nbytes)

    def cupy_over_block() -> Any:
        return cupy.ndarray(SHAPE, F32, memptr=pool.malloc(nbytes))

    def numba_over_block() -> Any:
        block = pool.malloc(nbytes)
        return _arrays.numba_array(SHAPE, F32, _pools.Block(block.ptr, nbytes, block), stream, context)

    def device_array() -> Any:
        return cuda.device_array(SHAPE, F32, stream=stream)

    results["CuPy MemoryPool.malloc (baseline)"] = median_us(raw_block)
    results["cupy.ndarray over a pool block"] = median_us(cupy_over_block)
    results["numba DeviceNDArray over a pool block"] = median_us(numba_over_block)
    results["cuda.device_array (cupy plugin)"] = median_us(device_array)
    results["CudaBackend.allocate, array_type=cupy"] = median_us(
        lambda: cupy_backend.allocate(SHAPE, F32, MemoryKind.DEVICE, stream)
    )
    results["CudaBackend.allocate, array_type=numba"] = median_us(
        lambda: numba_backend.allocate(SHAPE, F32, MemoryKind.DEVICE, stream)
    )
    numba_backend.set_allocator("default")
    results["cuda.device_array (default numba manager)"] = median_us(device_array, n=1000)
    results["CudaBackend.allocate default allocator, numba"] = median_us(
        lambda: numba_backend.allocate(SHAPE, F32, MemoryKind.DEVICE, stream), n=1000
    )
    results["CudaBackend.allocate default allocator, cupy"] = median_us(
        lambda: cupy_backend.allocate(SHAPE, F32, MemoryKind.DEVICE, stream), n=1000
    )
    numba_backend.set_allocator("cupy")

    @cuda.jit
    def touch(x: Any, y: Any) -> None:  # pragma: no cover - compiled by numba
        i = cuda.grid(1)
        if i < x.shape[0]:
            y[i] = x[i]

    flat = (SHAPE[0] * SHAPE[1],)
    pairs = {
        "numba-made (cuda.device_array)": (
            cuda.device_array(flat, F32, stream=stream),
            cuda.device_array(flat, F32, stream=stream),
        ),
        "handed-out numba arrays": tuple(
            numba_backend.allocate(flat, F32, MemoryKind.DEVICE, stream) for _ in range(2)
        ),
        "handed-out CuPy arrays": tuple(cupy_backend.allocate(flat, F32, MemoryKind.DEVICE, stream) for _ in range(2)),
    }
    launch: dict[str, float] = {}
    for name, (x, y) in pairs.items():
        counter = [0]

        def go(x: Any = x, y: Any = y) -> None:
            touch[1, 32, stream](x, y)  # one tiny block: the launch's host cost, not the GPU's
            counter[0] += 1
            if counter[0] % 256 == 0:
                stream.synchronize()

        launch[name] = median_us(go)
        stream.synchronize()
    base = launch["numba-made (cuda.device_array)"]

    facts: dict[str, Any] = {}
    a = cupy_backend.allocate((4,), F32, MemoryKind.DEVICE, stream)
    facts["cupy CAI stream (current stream null)"] = a.__cuda_array_interface__.get("stream", "absent")
    from aiocubie import current_cupy_stream

    with current_cupy_stream(stream):
        facts["cupy CAI stream inside current_cupy_stream == group stream"] = a.__cuda_array_interface__.get(
            "stream"
        ) == int(stream.handle)
    b = numba_backend.allocate((4,), F32, MemoryKind.DEVICE, stream)
    facts["numba CAI stream == group stream"] = b.__cuda_array_interface__["stream"] == int(stream.handle)
    try:
        a[...] = np.arange(4, dtype=F32)
        facts["cupy setitem from numpy"] = a.get().tolist()
    except Exception as exc:
        facts["cupy setitem from numpy"] = repr(exc)
    try:
        import torch

        t0 = time.perf_counter_ns()
        for _ in range(1000):
            torch.from_dlpack(a)
        facts["torch.from_dlpack(cupy) us"] = (time.perf_counter_ns() - t0) / 1e6
    except Exception as exc:
        facts["torch"] = repr(exc)
    facts["deprecation warnings during allocate/zero/copy (all kinds, both types)"] = [
        f"{w.category.__name__} {Path(w.filename).name}:{w.lineno}: {w.message}" for w in ours
    ]

    versions = {d: metadata.version(d) for d in ("numpy", "numba-cuda", "cupy-cuda13x") if _has(d)}
    report = {
        "machine": cuda.get_current_device().name.decode()
        if isinstance(cuda.get_current_device().name, bytes)
        else str(cuda.get_current_device().name),
        "python": platform.python_version(),
        "versions": versions,
        "construction_us": results,
        "launch_us": launch,
        "launch_ratio_vs_numba_made": {k: v / base for k, v in launch.items()},
        "facts": facts,
    }
    lines = [
        f"## Array construction and launch ({report['machine']}, median of {N}, microseconds)",
        "",
        "| case | us | ratio |",
        "|---|---:|---:|",
    ]
    cbase = results["CuPy MemoryPool.malloc (baseline)"]
    lines += [f"| {k} | {v:.2f} | {v / cbase:.2f}x malloc |" for k, v in results.items()]
    lines += [f"| launch: {k} | {v:.2f} | {v / base:.2f}x numba-made |" for k, v in launch.items()]
    lines += ["", "facts: " + json.dumps(facts, default=str)]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=2, default=str))
        (args.out / f"{args.name}.md").write_text(text + "\n")
    return 0


def _has(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
