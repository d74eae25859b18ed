"""Managed (unified) memory: request it, advise the driver, prefetch to the GPU and back.

The host writes the array, a prefetch moves it to device 0 before GPU work, and a prefetch to
the CPU (device=None) brings it back before the host reads it. aiocubie never asks for more
managed memory than the device has free. Runs on the simulator without a GPU.
Run: python examples/managed_prefetch.py
"""

from __future__ import annotations

import anyio
import numpy as np

import aiocubie
from aiocubie import ArrayRequest, MemoryManager


class Model:
    """Holds a table it reads on the GPU and updates from the host now and then."""


async def main() -> None:
    backend = "cuda" if aiocubie.gpu_status()[0] else "simulator"  # the simulator chosen, not fallen back to
    async with MemoryManager(backend) as mgr:
        model = Model()
        mgr.register(model, stream_group="model")
        request = {"table": ArrayRequest((1024, 64), np.float32, kind="managed", unchunkable=True)}
        async with mgr.request(model, request) as response:
            table = response.arrays["table"]
            mgr.host.advise(table, "preferred_location", device=0)  # lives on the GPU...
            mgr.host.advise(table, "accessed_by", device=None)  # ...and the CPU maps it, without faults
            table.set(np.arange(table.size, dtype=np.float32).reshape(table.shape))  # a copy in from the host
            await mgr.host.prefetch(model, table, device=0)  # to the GPU, on the model's stream
            print(f"prefetched {table.nbytes} bytes to device 0 on {mgr.backend.name}")
            # ... GPU kernels would run here on mgr.groups.stream(model) ...
            await mgr.host.prefetch(model, table, device=None)  # back to the CPU before reading
            assert float(table[-1, -1]) == table.size - 1
            print(f"prefetched back to the CPU; table[-1, -1] = {float(table[-1, -1]):.0f}")
            print(f"managed bytes held: {mgr.stats().groups['model'].live_bytes}")
    print(f"after release: {mgr.stats().live_bytes} bytes held")


if __name__ == "__main__":
    anyio.run(main)
