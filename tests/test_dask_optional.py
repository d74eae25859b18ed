"""aiocubie never needs Dask: only aiocubie.dask imports distributed, and says how to get it."""

from __future__ import annotations

import subprocess
import sys


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_importing_aiocubie_imports_no_dask() -> None:
    result = _python("import sys, aiocubie; assert not {'dask', 'distributed'} & set(sys.modules), sys.modules.keys()")
    assert result.returncode == 0, result.stderr


def test_aiocubie_dask_without_distributed_names_the_extra() -> None:
    result = _python("import sys; sys.modules['distributed'] = None; import aiocubie.dask")
    assert result.returncode != 0
    assert "ImportError: aiocubie.dask needs Dask's distributed" in result.stderr
    assert "pip install 'aiocubie[dask]'" in result.stderr
