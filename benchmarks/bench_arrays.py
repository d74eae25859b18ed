"""Array construction and kernel-launch costs on the GPU, each against a baseline of the same run.

Construction: a CuPy array over a CuPy pool block, a numba DeviceNDArray over one (what
aiocubie builds), ``cuda.device_array`` (numba's own path, drawing from aiocubie's resource through
the EMM plugin), and a backend's allocate + make of each array type. Launch: a numba kernel on two handed-out arrays of each type against two arrays
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

    from aiocubie._backends import Backend, Block
    from aiocubie._backends._cuda import create_cuda_backend
    from aiocubie._backends._numba import install_memory_manager
    from aiocubie._requests import MemoryKind

    def allocate(backend: Backend, shape: tuple[int, ...], kind: MemoryKind = MemoryKind.DEVICE) -> Any:
        block = backend.resource.allocate(int(np.prod(shape)) * F32.itemsize, kind, stream)
        return backend.arrays.make(block, shape, F32, stream)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        numba_backend = create_cuda_backend(device=0, allocator="cupy", array_type="numba")
        cupy_backend = create_cuda_backend(device=0, allocator="cupy", array_type="cupy")
        stream = cupy_backend.device.create_stream()
        for backend in (numba_backend, cupy_backend):
            for kind in MemoryKind:
                a = allocate(backend, SHAPE, kind)
                backend.device.zero(a, stream)
                backend.device.copy(np.ones(SHAPE, F32), a, stream)
        stream.sync()
    ours = [w for w in caught if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning))]

    pool = cupy.cuda.MemoryPool()
    nbytes = SHAPE[0] * SHAPE[1] * 4
    results: dict[str, float] = {}

    def raw_block() -> Any:
        return pool.malloc(nbytes)

    def cupy_over_block() -> Any:
        return cupy.ndarray(SHAPE, F32, memptr=pool.malloc(nbytes))

    def numba_over_block() -> Any:
        block = pool.malloc(nbytes)
        return numba_backend.arrays.make(Block(block.ptr, nbytes, MemoryKind.DEVICE, stream, block), SHAPE, F32, stream)

    def device_array() -> Any:
        return cuda.device_array(SHAPE, F32, stream=stream)

    results["CuPy MemoryPool.malloc (baseline)"] = median_us(raw_block)
    results["cupy.ndarray over a pool block"] = median_us(cupy_over_block)
    results["numba DeviceNDArray over a pool block"] = median_us(numba_over_block)
    results["cuda.device_array (EMM plugin over the cupy resource)"] = median_us(device_array)
    results["cupy resource allocate + make, array_type=cupy"] = median_us(lambda: allocate(cupy_backend, SHAPE))
    results["cupy resource allocate + make, array_type=numba"] = median_us(lambda: allocate(numba_backend, SHAPE))
    install_memory_manager(cupy_backend.device, None)
    results["cuda.device_array (numba's own manager)"] = median_us(device_array, n=1000)
    driver_numba = create_cuda_backend(device=0, allocator="driver", array_type="numba")
    driver_cupy = create_cuda_backend(device=0, allocator="driver", array_type="cupy")
    install_memory_manager(cupy_backend.device, None)
    results["driver resource allocate + make, numba"] = median_us(lambda: allocate(driver_numba, SHAPE), n=1000)
    results["driver resource allocate + make, cupy"] = median_us(lambda: allocate(driver_cupy, SHAPE), n=1000)
    install_memory_manager(cupy_backend.device, cupy_backend.resource)

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
        "handed-out numba arrays": tuple(allocate(numba_backend, flat) for _ in range(2)),
        "handed-out CuPy arrays": tuple(allocate(cupy_backend, flat) for _ in range(2)),
    }
    launch: dict[str, float] = {}
    for name, (x, y) in pairs.items():
        counter = [0]

        def go(x: Any = x, y: Any = y) -> None:
            touch[1, 32, stream](x, y)  # one tiny block: the launch's host cost, not the GPU's
            counter[0] += 1
            if counter[0] % 256 == 0:
                stream.sync()

        launch[name] = median_us(go)
        stream.sync()
    base = launch["numba-made (cuda.device_array)"]

    facts: dict[str, Any] = {}
    a = allocate(cupy_backend, (4,))
    facts["cupy CAI stream (current stream null)"] = a.__cuda_array_interface__.get("stream", "absent")
    from aiocubie import current_cupy_stream

    with current_cupy_stream(stream):
        facts["cupy CAI stream inside current_cupy_stream == group stream"] = a.__cuda_array_interface__.get(
            "stream"
        ) == int(stream.handle)
    b = allocate(numba_backend, (4,))
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

    versions = {d: metadata.version(d) for d in ("numpy", "numba-cuda", "cupy-cuda13x", "cuda-core") if _has(d)}
    report = {
        "machine": cupy_backend.device.device_name,
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
