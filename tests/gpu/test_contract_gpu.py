"""The backend contract and user-code suites, unchanged, on the GPU: every array type x allocator.

Skipped as a whole without a usable GPU, before numba.cuda is imported (the simulator run of
the same suites, tests/test_backend_contract.py, needs numba's CUDA simulator instead).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from gpukit import require

from aiocubie import gpu_status
from aiocubie._backends import ALLOCATORS, ARRAY_TYPES

USABLE, WHY = gpu_status()
if not USABLE:
    pytest.skip(f"no usable GPU: {WHY}", allow_module_level=True)

from backend_contract import *  # noqa: E402,F403
from backend_contract import Contract  # noqa: E402
from user_code import *  # noqa: E402,F403

pytestmark = pytest.mark.gpu


@pytest.fixture(
    scope="module", params=[(a, t) for t in ARRAY_TYPES for a in ALLOCATORS], ids=lambda p: f"{p[1]}-{p[0]}"
)
def contract(request: pytest.FixtureRequest, cu: Any) -> Iterator[Contract]:
    allocator, array_type = request.param
    require(allocator)
    require("numba" if array_type == "numba" else "cupy")
    backend = cu.create_cuda_backend(device=0, allocator=allocator, array_type=array_type)
    yield Contract(backend, array_type, allocator)
    backend.close()
