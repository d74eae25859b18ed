"""The public names: each exported from exactly one place, the top level and the manager kept small.

As trio's ``test_exports.py`` does: every name a public module lists in ``__all__`` exists, every
public name a module holds is listed, and no name is listed by two modules.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import types
from pathlib import Path

import pytest

import aiocubie

#: The public modules whose names are aiocubie's API (cubie and dask: behind their extras).
NAMESPACES = ["aiocubie", "aiocubie.errors", "aiocubie.mr", "aiocubie.planning", "aiocubie.simulator", "aiocubie.stats"]
EXTRAS = {"aiocubie.cubie": "cubie", "aiocubie.dask": "distributed"}


def public_modules() -> list[types.ModuleType]:
    names = [*NAMESPACES, *(name for name, needs in EXTRAS.items() if importlib.util.find_spec(needs))]
    return [importlib.import_module(name) for name in names]


@pytest.mark.parametrize("module", public_modules(), ids=lambda module: module.__name__)
def test_every_listed_name_exists_and_every_public_name_is_listed(module: types.ModuleType) -> None:
    listed = set(module.__all__)
    assert len(listed) == len(module.__all__), f"{module.__name__}.__all__ lists a name twice"
    missing = sorted(name for name in listed if not hasattr(module, name))
    assert not missing, f"{module.__name__}.__all__ lists names it does not have: {missing}"
    # a namespace hands on names from private modules; a module of its own (cubie, dask) defines them
    own = ("aiocubie._",) if module.__name__ in NAMESPACES else (module.__name__,)
    held = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and str(getattr(value, "__module__", "")).startswith(own)
    }
    assert held <= listed, f"{module.__name__} holds public names it does not list: {sorted(held - listed)}"


def test_each_name_is_exported_from_exactly_one_place() -> None:
    seen: dict[str, str] = {}
    for module in public_modules():
        for name in module.__all__:
            assert name not in seen, f"{name} is exported from both {seen[name]} and {module.__name__}"
            seen[name] = module.__name__


def test_the_top_level_and_the_manager_stay_small() -> None:
    assert len(aiocubie.__all__) <= 30
    manager = aiocubie.MemoryManager(backend="simulator")
    members = [name for name in dir(manager) if not name.startswith("_")]
    assert len(members) <= 25, members
    manager.close()


@pytest.mark.parametrize("name", [name.removeprefix("aiocubie.") for name in NAMESPACES[1:]])
def test_a_namespace_is_reached_from_the_package(name: str) -> None:
    assert getattr(aiocubie, name) is importlib.import_module(f"aiocubie.{name}")


def _documented_calls() -> list[tuple[str, str, str]]:
    """Every ``mgr.NAME`` and ``mgr.VIEW.NAME`` the docs, the examples and the package's own text name."""
    root = Path(aiocubie.__file__).parent.parent
    files = [
        root / "README.md",
        *root.glob("docs/**/*.md"),
        *root.glob("examples/*.py"),
        *root.glob("aiocubie/**/*.py"),
    ]
    found = set()
    for path in files:
        for first, second in re.findall(r"\bmgr\.([a-z_]+)(?:\.([a-z_]+))?", path.read_text(encoding="utf-8")):
            found.add((str(path.relative_to(root)), first, second))
    return sorted(found)


def test_the_docs_name_only_what_the_manager_has() -> None:
    # a name the manager lost to a view (mgr.prefetch -> mgr.host.prefetch) must not stay in the text
    sim = aiocubie.simulator.SimulatorBackend(1 << 20)
    mgr = aiocubie.MemoryManager(sim)
    views = {"budget": mgr.budget, "groups": mgr.groups, "host": mgr.host, "pool": mgr.pool}
    stale = [
        f"{where}: mgr.{first}" + (f".{second}" if second else "")
        for where, first, second in _documented_calls()
        if not hasattr(mgr, first) or (first in views and second and not hasattr(views[first], second))
    ]
    sim.close()
    assert not stale, f"names the manager does not have: {stale}"


def test_the_docs_check_reads_the_pages_in_docs_subfolders() -> None:
    # the docs site keeps pages in folders (docs/concepts/, docs/api/): the check above must read them
    assert any(where.startswith("docs/concepts/") for where, _, _ in _documented_calls())
