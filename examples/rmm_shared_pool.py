"""One pool for every library: aiocubie, CuPy, numba and torch all draw from the device's RMM resource.

aiocubie's allocator "rmm" wraps the device's RMM resource (it never replaces it) with statistics and
a failure callback; ``mgr.pool.share`` routes CuPy's and numba's own allocations to it, and torch's
tensors come from a ``torch.cuda.MemPool`` on RMM's torch allocator. The summary then shows what
aiocubie holds and what the other libraries hold, in the same pool, to the byte. Needs a GPU and the
rmm extra (pip install "aiocubie[rmm]"); numba and torch parts run where they are installed.
Run: python examples/rmm_shared_pool.py
"""

from __future__ import annotations

import importlib.util

import anyio
import numpy as np

from aiocubie import ArrayRequest, MemoryManager, gpu_status

MiB = 1 << 20


class Solver:
    """A component whose arrays come through aiocubie's requests."""


async def main() -> None:
    usable, why = gpu_status()
    if not usable:
        print(f"no usable GPU ({why}): this example needs one with RMM: skipping")
        return
    if importlib.util.find_spec("rmm") is None:
        print('RMM is not installed (pip install "aiocubie[rmm]"): skipping')
        return
    import cupy

    mgr = MemoryManager("cuda", allocator="rmm", mode="active")
    libraries = ["cupy"] + (["numba"] if importlib.util.find_spec("numba_cuda") else [])
    mgr.pool.share(*libraries)
    solver = Solver()
    mgr.register(solver, proportion=0.25)
    async with mgr:
        response = await mgr.request(solver, {"state": ArrayRequest((2 * MiB,), np.float32, zero=True)})
        before = mgr.stats().other_bytes or 0
        bytes_of: dict[str, int] = {}

        kept = [cupy.ones(3 * MiB // 4, dtype=np.float32)]  # 3 MiB through RMM's CuPy allocator
        bytes_of["cupy"] = (mgr.stats().other_bytes or 0) - before - sum(bytes_of.values())
        if "numba" in libraries:
            from numba import cuda

            kept.append(cuda.device_array(MiB // 4, dtype=np.float64))  # 2 MiB through numba's memory manager
            bytes_of["numba"] = (mgr.stats().other_bytes or 0) - before - sum(bytes_of.values())
        try:
            import torch
            from rmm.allocators.torch import rmm_torch_allocator
        except ImportError:
            print("torch is not installed: the torch part is skipped")
        else:
            pool = torch.cuda.MemPool(rmm_torch_allocator.allocator())
            with torch.cuda.use_mem_pool(pool):  # plain code only: nothing here may await
                kept.append(torch.ones(MiB // 4, device="cuda"))  # 1 MiB (torch asks RMM for a whole segment)
            bytes_of["torch"] = (mgr.stats().other_bytes or 0) - before - sum(bytes_of.values())
        cupy.cuda.runtime.deviceSynchronize()

        stats = mgr.stats()
        assert stats.pool.in_use == stats.live_bytes + (stats.other_bytes or 0)  # every byte accounted for
        print(f"aiocubie holds {stats.live_bytes} bytes (state: {response.arrays['state'].nbytes})")
        for library, nbytes in bytes_of.items():
            print(f"{library} holds {nbytes} bytes in the same pool")
        print(f"pool in use: {stats.pool.in_use} = aiocubie {stats.live_bytes} + other libraries {stats.other_bytes}")
        print(mgr.summary())
        del kept


if __name__ == "__main__":
    anyio.run(main)
