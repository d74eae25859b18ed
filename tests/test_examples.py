"""Every example runs as a user runs it (a fresh interpreter) and prints what it promises."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from simkit import needs_numba

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(*args: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}  # let each example choose its backend
    result = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_async_pipeline() -> None:
    out = _run(str(EXAMPLES / "async_pipeline.py"))
    chunks = [int(n) for n in re.findall(r"solver-[ab]: (\d+) chunks, all 80000 elements correct", out)]
    assert len(chunks) == 2 and chunks[0] == chunks[1] > 1  # one plan for both, and it chunks
    assert "solve group: 1 batch(es) for 2 requests" in out
    assert "post: sums of 20000 runs correct" in out


def test_broker_share() -> None:
    out = _run(str(EXAMPLES / "broker_share.py"))
    assert out.index("first: releasing") < out.index("second: served whole (1 chunk) once the first released")
    (socket,) = re.findall(r"serving (\S+) ", out)
    assert not Path(socket).parent.exists()  # its temporary folder removed (one was left a run)


def test_batch_stream() -> None:
    out = _run(str(EXAMPLES / "batch_stream.py"))
    assert re.search(r"24 batches, 3 in flight, every output right: True on (simulator|cuda)", out), out


@needs_numba
def test_data_loader() -> None:
    out = _run(str(EXAMPLES / "data_loader.py"))
    assert len(re.findall(r"batch \d: 2000 rows normalised in \d+ chunks", out)) == 4
    assert re.search(r"4 batches checked against numpy on (simulator|cuda)", out)


def test_spilling_cache() -> None:
    out = _run(str(EXAMPLES / "spilling_cache.py"))
    assert re.findall(r"solver batch \d: (\d+) chunk", out) == ["1", "1", "1"]  # whole: the table went to host
    assert out.count("intact: True") == 3
    assert "table spilled 3 times, restored 3 times" in out
    assert re.search(r"spilled: 0 B on host now, 4\.0 MiB peak; 3 spills", out)
    assert "pinned host bytes after release: 0" in out


def test_managed_prefetch() -> None:
    out = _run(str(EXAMPLES / "managed_prefetch.py"))
    assert "prefetched 262144 bytes to device 0" in out
    assert "table[-1, -1] = 65535" in out
    assert "managed bytes held: 262144" in out
    assert "after release: 0 bytes held" in out


def test_plot_stats(tmp_path: Path) -> None:
    png = tmp_path / "stats.png"
    out = _run(str(EXAMPLES / "plot_stats.py"), str(png))
    peaks = re.search(r"recorded (\d+) snapshots; peak live bytes per group: \{'load': (\d+), 'solve': (\d+)\}", out)
    assert peaks and int(peaks.group(1)) >= 2 and int(peaks.group(2)) > 0 and int(peaks.group(3)) > 0
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out and not png.exists()
    else:
        assert f"wrote {png}" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_history(tmp_path: Path) -> None:
    out = _run(str(EXAMPLES / "history.py"), str(tmp_path))
    assert re.search(r"out of memory: 2 times; .* by 1 reclaim-hook calls; 2 recovered, 0 failed", out)
    assert f"wrote {tmp_path / 'history.html'}" in out and (tmp_path / "history.json").exists()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no picture" in out
    else:
        assert (tmp_path / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_user_code_tests_pass() -> None:
    out = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLES / "test_user_code.py"), cwd=EXAMPLES.parent)
    assert re.search(r"\b2 passed\b", out)


def test_torch_interop() -> None:
    out = _run(str(EXAMPLES / "torch_interop.py"))
    assert "torch is not installed" in out or re.search(r"torch wrote 4096 bytes in place on (simulator|cuda)", out)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_every_example_is_tested(path: Path) -> None:
    assert path.stem.removeprefix("test_") in {
        "async_pipeline",
        "batch_stream",
        "broker_share",
        "cubie_pipeline",
        "dask_chunked",
        "data_loader",
        "history",
        "managed_prefetch",
        "plot_stats",
        "rmm_shared_pool",
        "spilling_cache",
        "torch_interop",
        "user_code",
    }


def test_dask_chunked() -> None:
    pytest.importorskip("distributed")
    out = _run(str(EXAMPLES / "dask_chunked.py"))
    assert len(re.findall(r"piece \d: 4096 rows in \d+ chunks on (simulator|cuda)", out)) == 8
    assert re.search(r"8 pieces on [12] worker\(s\), every result correct", out)


def test_cubie_pipeline(tmp_path: Path) -> None:
    if importlib.util.find_spec("cubie") is None:
        pytest.skip("cubie is not installed (pip install 'aiocubie[cubie]')")
    out = _run(str(EXAMPLES / "cubie_pipeline.py"), cwd=tmp_path)  # cubie writes its caches under the cwd
    solves = re.findall(r"solve [ab]: 120 runs in (\d+) chunks of \d+, identical to cubie's own memory manager", out)
    assert len(solves) == 2 and max(map(int, solves)) > 1, out  # one is planned around the other and the cache
    loaded = re.search(r"loader: (\d+) batches on the loop while the solves ran", out)
    assert loaded and int(loaded.group(1)) > 0, out
    assert "one stats table: groups ['load', 'solver']" in out


def test_history_without_a_folder_writes_nothing_where_it_runs(tmp_path: Path) -> None:
    # issue 22: it wrote history.json and history.html into the current directory
    out = _run(str(EXAMPLES / "history.py"), cwd=tmp_path)
    assert list(tmp_path.iterdir()) == []
    written = Path(re.search(r"wrote (\S+history\.html)", out).group(1))  # type: ignore[union-attr]
    assert written.exists() and written.parent.name.startswith("aiocubie-history-")


def test_dask_chunked_without_the_extra_says_how_to_install_it() -> None:
    # issue 22: a ModuleNotFoundError traceback instead of the install hint
    script = f"import sys, runpy; sys.modules['distributed'] = None; runpy.run_path({str(EXAMPLES / 'dask_chunked.py')!r}, run_name='__main__')"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "pip install 'aiocubie[dask]'" in result.stderr and "Traceback" not in result.stderr


def test_the_overlapped_walk_snippet_runs_as_written(tmp_path: Path) -> None:
    # issue 22: the snippet had "y": ... and undefined names; it is now a whole program
    page = (EXAMPLES.parent / "docs" / "concepts" / "walks.md").read_text()
    section = page[page.index("## Overlapped walks") :]
    start = section.index("```python\n") + len("```python\n")
    snippet = section[start : section.index("\n```", start)]
    (tmp_path / "snippet.py").write_text(snippet)
    out = _run(str(tmp_path / "snippet.py"))
    chunks = int(re.search(r"(\d+) chunks, y == 2x: True", out).group(1))  # type: ignore[union-attr]
    assert chunks > 1


def test_rmm_shared_pool() -> None:
    out = _run(str(EXAMPLES / "rmm_shared_pool.py"))
    if "skipping" in out:  # no GPU, or no RMM: it says so and exits cleanly
        assert re.search(r"(no usable GPU .*|RMM is not installed .*): skipping", out)
        return
    assert re.search(r"cupy holds 3145728 bytes in the same pool", out)
    assert re.search(r"pool in use: (\d+) = aiocubie 8388608 \+ other libraries (\d+)", out)


def _python_blocks() -> list[tuple[str, int, str]]:
    """Every ```python block of the README and of docs/, its subfolders too: (file, line, code dedented)."""
    fence = re.compile(r"^([ \t]*)```python\n(.*?)\n\1```", re.S | re.M)
    found = []
    root = EXAMPLES.parent
    for doc in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        text = doc.read_text()
        for match in fence.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((doc.relative_to(root).as_posix(), line, textwrap.dedent(match.group(2))))
    return found


@pytest.mark.parametrize(
    "doc, line, code", [pytest.param(*block, id=f"{block[0]}:{block[1]}") for block in _python_blocks()]
)
def test_every_python_block_in_the_docs_runs_or_says_it_is_a_fragment(
    doc: str, line: int, code: str, tmp_path: Path
) -> None:
    if code.startswith("# a fragment:"):  # it says which whole program it comes from
        return
    (tmp_path / "block.py").write_text(code)
    result = subprocess.run(
        [sys.executable, str(tmp_path / "block.py")], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, f"{doc}:{line} failed:\n{result.stderr[-2000:]}"
