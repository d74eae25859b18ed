"""Hide numba (and numba-cuda) from a Python process: put this folder first on PYTHONPATH.

Used to run the GPU suite as if numba-cuda were not installed (issue 20: "the CUDA path with CuPy
arrays, every memory kind and every allocator but numba works without numba-cuda"). A ``None`` in
``sys.modules`` is what "not installed" looks like to both ``import numba`` (ImportError) and
``importlib.util.find_spec("numba")`` (None).
"""

import sys

for _name in ("numba", "numba_cuda", "_numba_cuda_redirector"):
    sys.modules[_name] = None  # type: ignore[assignment]
