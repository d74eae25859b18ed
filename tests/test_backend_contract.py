"""The backend contract and user-code suites on the simulator, for every array type x allocator.

The same suites run unchanged on the GPU (tests/gpu/test_contract_gpu.py, scripts/gpu-check).
numba kernels run under numba's CUDA simulator: it is chosen here, before numba.cuda is imported.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

import aiocubie
from aiocubie import SimulatorBackend
from aiocubie._backends import ALLOCATORS, ARRAY_TYPES

if "numba.cuda" not in sys.modules:
    aiocubie.select_backend("simulator")  # sets NUMBA_ENABLE_CUDASIM=1 for the numba kernels

from backend_contract import *  # noqa: F403
from backend_contract import Contract
from user_code import *  # noqa: F403


@pytest.fixture(
    scope="module", params=[(a, t) for t in ARRAY_TYPES for a in ALLOCATORS], ids=lambda p: f"{p[1]}-{p[0]}"
)
def contract(request: pytest.FixtureRequest) -> Iterator[Contract]:
    allocator, array_type = request.param
    backend = SimulatorBackend(total=256 << 20, array_type=array_type)
    backend.set_allocator(allocator)
    yield Contract(backend, array_type, allocator)
    backend.close()
