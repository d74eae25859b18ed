"""The user-code suite's numba kernel, in a module of its own: importing it imports numba.cuda.

Module level: numba's simulator swaps the module-global ``cuda`` while a kernel runs.
"""

from __future__ import annotations

from typing import Any

from numba import cuda


@cuda.jit
def axpy(x: Any, y: Any) -> None:  # pragma: no cover - compiled by numba
    for j in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        for i in range(x.shape[0]):
            y[i, j] = 3.0 * x[i, j] - 1.0
