"""What users do with the arrays they are handed, for each case of the contract: the "user code" suite.

It runs on the simulator in CI (numba kernels under numba's CUDA simulator) and unchanged on the
GPU. Code here is written once for both: only the array type decides what it calls. The numba
kernel test needs numba (the numba extra) and skips, saying so, without it.
"""

from __future__ import annotations

import gc
import random
import sys
from typing import Any

import anyio
import numpy as np
import pytest
from contractkit import Contract, to_numpy

from aiocubie import ArrayRequest, MemoryManager, walk_chunks

RUNS = 10_000


def need_numba_mode(backend_name: str) -> None:
    """Skip unless numba.cuda runs in the mode the backend needs (its simulator for ours)."""
    from numba import config

    if bool(config.ENABLE_CUDASIM) != (backend_name == "simulator"):
        pytest.skip("numba.cuda was imported in the other mode than this backend needs")


def _launch(kernel: Any, backend_name: str, size: int, stream: Any, *args: Any) -> None:
    if backend_name == "simulator":
        kernel[2, 32](*args)  # each simulated GPU thread is a Python thread: keep it small
    else:
        kernel[(size + 255) // 256, 256, stream](*args)


class Solver:
    """A user's component."""


@pytest.mark.anyio
async def test_user_reads_zeroed_arrays(contract: Contract) -> None:
    async with MemoryManager(contract.backend) as mgr:
        solver = Solver()
        mgr.register(solver)
        request = {
            "d": ArrayRequest((16, 3), np.float64, zero=True),
            "m": ArrayRequest((64,), np.int32, kind="managed", zero=True, unchunkable=True),
        }
        async with mgr.request(solver, request) as response:
            for array in response.arrays.values():
                assert not to_numpy(array).any()
        assert mgr.stats().live_bytes == 0


@pytest.mark.anyio
async def test_released_batches_give_the_pool_back(contract: Contract) -> None:
    """Several tasks a group, so batches hold several requests: once every response is released
    the allocator's pool has nothing in use (no batch, ticket or event callback keeps an array), in
    a quiet manager and after its exit; a new manager on the same device starts from zero."""
    backend = contract.backend

    async def storm(mgr: MemoryManager, groups: int, tasks: int) -> list[Solver]:
        owners = [Solver() for _ in range(tasks)]  # kept by the caller: their groups stay live
        for i, owner in enumerate(owners):
            mgr.register(owner, stream_group=f"g{i % groups}")

        async def task(owner: Solver, rng: random.Random) -> None:
            for _ in range(20):
                runs = rng.choice([16, 64, 256, 1024])  # 64 KiB to 4 MiB of float32 rows of 1024
                async with mgr.request(owner, {"x": ArrayRequest((runs, 1024), np.float32, zero=rng.random() < 0.5)}):
                    await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            for i, owner in enumerate(owners):
                tg.start_soon(task, owner, random.Random(i))
        return owners

    def in_use(mgr: MemoryManager) -> int | None:
        # what a reference cycle holds goes at the next collection (the GPU item of round three
        # was held by strong references: a quiet group's last batch, the event thread's last callback)
        gc.collect()
        backend.device.synchronize()  # stream-ordered frees land
        return mgr.stats().pool.in_use

    for groups, tasks in ((1, 2), (1, 8), (4, 8)):
        async with MemoryManager(backend, batch_window=1e-3) as mgr:
            start = in_use(mgr)
            owners = await storm(mgr, groups, tasks)
            assert mgr.stats().live_bytes == 0
            assert in_use(mgr) == start, f"{tasks} tasks in {groups} group(s): pool bytes kept after every release"
            del owners
        gc.collect()
        async with MemoryManager(backend) as mgr:
            assert in_use(mgr) == start, f"{tasks} tasks in {groups} group(s): the last manager's bytes still in use"


@pytest.mark.anyio
async def test_user_cupy_arithmetic_walk(contract: Contract) -> None:
    """y = 2x + 1 chunk by chunk with the array's own arithmetic, as CuPy users write it."""
    if contract.array_type != "cupy":
        pytest.skip("numba device arrays have no arithmetic (see test_array_type_behaviour)")
    x = np.random.default_rng(0).standard_normal((4, RUNS))
    y = np.full_like(x, np.nan)
    async with MemoryManager(contract.backend) as mgr:
        solver = Solver()
        mgr.register(solver)
        requests = {
            "x": ArrayRequest(x.shape, x.dtype, chunk_axis=1),
            "y": ArrayRequest(x.shape, x.dtype, chunk_axis=1),
        }
        async with mgr.request(solver, requests) as response:
            async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}):
                chunk.device["y"][...] = 2 * chunk.device["x"] + 1
                await mgr.groups.sync(solver)
    np.testing.assert_allclose(y, 2 * x + 1)


@pytest.mark.anyio
async def test_user_numba_kernel_walk(contract: Contract) -> None:
    """A numba kernel on the group's stream over every chunk, for either array type."""
    pytest.importorskip("numba", reason="numba kernels need numba, the numba extra: pip install 'aiocubie[numba]'")
    need_numba_mode(contract.backend.name)
    from numba_kernels import axpy

    x = np.random.default_rng(1).standard_normal((3, 2_000))
    y = np.full_like(x, np.nan)
    async with MemoryManager(contract.backend) as mgr:
        solver = Solver()
        mgr.register(solver)
        requests = {
            "x": ArrayRequest(x.shape, x.dtype, chunk_axis=1),
            "y": ArrayRequest(x.shape, x.dtype, chunk_axis=1),
        }
        async with mgr.request(solver, requests) as response:
            async for chunk in walk_chunks(response, inputs={"x": x}, outputs={"y": y}):
                _launch(
                    axpy, contract.backend.name, chunk.length, response.stream, chunk.device["x"], chunk.device["y"]
                )
                await mgr.groups.sync(solver)
    np.testing.assert_allclose(y, 3.0 * x - 1.0)


@pytest.mark.anyio
async def test_user_torch_interop(contract: Contract) -> None:
    """torch sees the handed-out memory without a copy: DLPack for CuPy arrays, the CUDA array
    interface for numba's."""
    if "torch" not in sys.modules:
        torch = pytest.importorskip("torch")
    else:
        torch = sys.modules["torch"]
    async with MemoryManager(contract.backend) as mgr:
        solver = Solver()
        mgr.register(solver)
        async with mgr.request(solver, {"a": ArrayRequest((1000,), np.float32, zero=True)}) as response:
            array = response.arrays["a"]
            if contract.array_type == "cupy":
                tensor = torch.from_dlpack(array)
            elif contract.backend.name == "cuda":
                tensor = torch.as_tensor(array, device="cuda")
            else:
                pytest.skip("torch reads numba arrays through the CUDA array interface: GPU only")
            tensor += 2  # torch writes the same memory
            if tensor.is_cuda:
                torch.cuda.synchronize()
            assert np.array_equal(to_numpy(array), np.full(1000, 2, np.float32))
