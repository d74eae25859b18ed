"""The contract suites' backend: each (backend, resource, array type) case in turn, module-scoped.

On a machine without a GPU numba's kernels run under its CUDA simulator, chosen here before
numba.cuda is imported. A case this machine cannot make (a library not installed) is skipped
with the reason.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from contractkit import CASES, GPU, Contract

import aiocubie
from aiocubie import create_backend
from aiocubie.errors import ConfigurationError, UnknownAllocatorError

if not GPU and "numba.cuda" not in sys.modules:
    aiocubie.select_backend("simulator")  # NUMBA_ENABLE_CUDASIM=1 for the user-code suite's numba kernels


@pytest.fixture(scope="module", params=CASES)
def contract(request: pytest.FixtureRequest) -> Iterator[Contract]:
    name, resource, array_type = request.param
    kwargs = {"total": 256 << 20} if name == "simulator" else {}
    try:
        if name == "simulator":
            backend = aiocubie.simulator.SimulatorBackend(allocator=resource, array_type=array_type, **kwargs)  # type: ignore[arg-type]
        else:
            backend = create_backend(name, allocator=resource, array_type=array_type)
    except (ConfigurationError, UnknownAllocatorError) as exc:
        if "install" in str(exc):  # a library this machine lacks: the message names the extra
            pytest.skip(f"{name} cannot make resource {resource!r} with {array_type} arrays here: {exc}")
        raise
    yield Contract(backend, resource, array_type)
    backend.close()
