"""torch on aiocubie's arrays: the handed-out CuPy arrays become torch tensors through DLPack.

No copy: torch writes the memory aiocubie handed out, on the GPU (a CUDA tensor) or, on the
simulator, in host memory (a CPU tensor). Skips the torch part where torch is not installed.
Run: python examples/torch_interop.py
"""

from __future__ import annotations

import anyio
import numpy as np

from aiocubie import ArrayRequest, MemoryManager


class Model:
    """A component that computes with torch."""


async def main() -> None:
    try:
        import torch
    except ImportError:
        print("torch is not installed (pip install torch): skipping")
        return
    async with MemoryManager("auto") as mgr:
        model = Model()
        mgr.register(model, stream_group="torch")
        async with mgr.request(model, {"w": ArrayRequest((256, 4), np.float32, zero=True)}) as response:
            w = response.arrays["w"]
            tensor = torch.from_dlpack(w)  # the same memory, no copy
            tensor += torch.arange(4, dtype=torch.float32, device=tensor.device)
            if tensor.is_cuda:
                torch.cuda.synchronize()
            assert np.array_equal(w.get(), np.tile(np.arange(4, dtype=np.float32), (256, 1)))
            print(f"torch wrote {w.nbytes} bytes in place on {mgr.backend.name} ({tensor.device.type} tensor)")


if __name__ == "__main__":
    anyio.run(main)
