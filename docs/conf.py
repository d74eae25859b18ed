"""Sphinx configuration: MyST pages, the API reference from the numpy-style docstrings, the furo theme.

Build: ``sphinx-build -W --keep-going -b html docs OUT`` (the ``docs`` extra). CI builds it with warnings
as errors. Optional extras that are not installed are mocked for autodoc, so the reference builds
everywhere; CI installs the ``test`` and ``cubie`` extras, so there nothing but the GPU stack is mocked.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # document this checkout, not whatever aiocubie is installed

import aiocubie  # noqa: E402

project = "aiocubie"
author = "the aiocubie authors"
copyright = "the aiocubie authors"
release = aiocubie.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# the docstrings are numpy-style; napoleon reads them for autodoc
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes" as fields: a NamedTuple's fields are not described twice
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": True}

# The optional extras the documented modules import when imported (aiocubie.cubie imports cubie,
# aiocubie.dask distributed, aiocubie.testing pytest): those not installed here are mocked, so the
# reference builds without them. Only these: the GPU stack is imported lazily (never by autodoc), and a
# mock that an installed library imports (cubie's numba build and CuPy, say) can hang it.
_OPTIONAL = ["cubie", "distributed", "dask", "pytest", "pytest_asyncio"]
autodoc_mock_imports = [name for name in _OPTIONAL if importlib.util.find_spec(name) is None]

html_theme = "furo"
html_title = f"aiocubie {release}"
