"""What the GPU tests share besides fixtures: the resource names and how to skip one that cannot be made."""

from __future__ import annotations

import pytest

#: Every resource a GPU can make, when its library is installed.
RESOURCES = ("driver", "cupy", "cupy_async", "numba")
_NEEDS = {"cupy": "cupy", "cupy_async": "cupy", "numba": "numba_cuda"}


def require(resource: str) -> None:
    """Skip the test unless the library ``resource`` needs is installed."""
    module = _NEEDS.get(resource)
    if module is not None:
        pytest.importorskip(module, reason=f"resource {resource!r} needs {module}, which is not installed")
