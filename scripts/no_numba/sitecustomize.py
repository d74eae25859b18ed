"""Hide numba (and numba-cuda) from a Python process: put this folder first on PYTHONPATH.

Used to run the GPU suite as if numba-cuda were not installed (issue 20: "the CUDA path with CuPy
arrays, every memory kind and every allocator but numba works without numba-cuda").
"""

import sys

_HIDDEN = ("numba", "numba_cuda", "_numba_cuda_redirector")


class _HideNumba:
    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by scripts/no_numba)", name=name)
        return None


sys.meta_path.insert(0, _HideNumba())
