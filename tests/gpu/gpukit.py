"""What the GPU tests share besides fixtures: the resource names, skipping one that cannot be made, host copies."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

#: Every resource a GPU can make, when its library is installed.
RESOURCES = ("driver", "cupy", "cupy_async", "numba", "rmm")
_NEEDS = {"cupy": "cupy", "cupy_async": "cupy", "numba": "numba_cuda", "rmm": "rmm"}


def require(resource: str) -> None:
    """Skip the test unless the library ``resource`` needs is installed."""
    module = _NEEDS.get(resource)
    if module is not None:
        pytest.importorskip(module, reason=f"resource {resource!r} needs {module}, which is not installed")


def to_host(array: Any) -> np.ndarray[Any, Any]:
    """A host copy of a numpy, CuPy or numba array (its stream synchronized first by the caller)."""
    if isinstance(array, np.ndarray):
        return np.array(array)
    if hasattr(array, "copy_to_host"):
        return np.asarray(array.copy_to_host())
    return np.asarray(array.get())


def alone_on_device(why: str) -> None:
    """Skip a test that reads (or fills) the whole device when other processes share it: pytest-xdist
    workers, or clients of a node broker."""
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get("AIOCUBIE_BROKER"):
        pytest.skip(f"{why}: other pytest-xdist workers or broker clients share the device")
