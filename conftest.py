"""Doctest collection (``pytest --doctest-modules aiocubie``): skip modules whose optional extra is absent.

Importing them would fail collection; their examples need that extra (and mostly a GPU) anyway.
"""

from __future__ import annotations

import importlib.util


def _absent(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:  # a parent package (cuda of cuda.core) is absent
        return True


collect_ignore: list[str] = []
if _absent("cuda.core") or _absent("cuda.bindings"):
    collect_ignore.append("aiocubie/_backends/_cuda")
if _absent("numba"):
    collect_ignore += ["aiocubie/_demo.py", "aiocubie/_backends/_numba.py", "aiocubie/_backends/_sim/_numba_model.py"]
if _absent("cubie"):
    collect_ignore.append("aiocubie/cubie.py")
if _absent("distributed"):
    collect_ignore.append("aiocubie/dask.py")
