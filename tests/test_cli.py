"""The command line: info, demo and bench, run as users run them (in a fresh interpreter).

The demo and info run in subprocesses because choosing the simulator sets NUMBA_ENABLE_CUDASIM,
which must not leak into this test process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from simkit import needs_numba
from test_trace import check_trace_event_format

import aiocubie
from aiocubie import __main__ as _cli
from aiocubie._backends import _select


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}  # let the CLI choose, whatever this shell set
    return subprocess.run(
        [sys.executable, "-m", "aiocubie", *args], capture_output=True, text=True, timeout=120, env=env
    )


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@needs_numba
def test_demo_batches_chunks_overlaps_and_checks_every_element(tmp_path: Path) -> None:
    plot, trace = tmp_path / "demo.png", tmp_path / "demo.json"
    result = _run(
        "demo", "--backend", "simulator", "--runs", "2000", "--batches", "2", "--budget", "65536", "--no-progress",
        "--trace", str(trace), *(("--plot", str(plot)) if _has_matplotlib() else ()),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "backend: simulator (asked for)" in out
    checked = int(re.search(r"check: all ([\d,]+) output elements match numpy", out).group(1).replace(",", ""))
    assert checked == 2 * (8 * 2000 + 2000 + 2000 + 1)  # features, energies, peaks and one total per batch
    rows = {
        m.group(1): [int(v) for v in m.groups()[1:]]
        for m in re.finditer(r"(\w+) \((?:instance|group)\)\s*│\s*(\d+)\s*│\s*(\d+)\s*│\s*(\d+)", out)
    }
    assert set(rows) == {"loader", "energy", "peak", "reducer", "load", "solve", "reduce"}
    requests, batches, chunks = rows["loader"]
    assert (requests, batches) == (2, 2)
    assert chunks > batches  # the budget forced the loader's batches into chunks
    assert rows["solve"][:2] == [4, 2]  # the two solve components share each batch
    assert re.search(r"^solve +energy \+ peak: 4 requests in 2 batches \(2 a batch", out, re.M)
    assert re.search(r"^groups at once: .* \(\d+\.\d+ at a time on average\)$", out, re.M)
    assert re.search(r"^overlapped walk: .* \(depth 1\) and .* \(depth 2\): speed-up [\d.]+x$", out, re.M)
    if _has_matplotlib():
        assert f"plot: wrote {plot}" in out and plot.stat().st_size > 0
    assert f"trace: wrote {trace}" in out
    events = check_trace_event_format(json.loads(trace.read_text()))
    tracks = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"group load", "group solve", "group reduce", "loader", "energy", "peak", "reducer"} <= tracks
    requests = [e for e in events if e["ph"] == "X" and e["name"] == "request"]
    assert len(requests) == 2 + 4 + 2 + 2  # the loader's, solvers' and reducer's batches, and the two timing walks
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert counters == {"live bytes", "device memory", "allocator pool", "other libraries", "spilled to host"}


@pytest.mark.skipif(_has_matplotlib(), reason="matplotlib is installed")
def test_demo_plot_without_matplotlib_fails_before_the_demo_runs(tmp_path: Path) -> None:
    result = _run("demo", "--backend", "simulator", "--runs", "2000", "--plot", str(tmp_path / "demo.png"))
    assert result.returncode == 1
    assert "matplotlib, which is not installed" in result.stderr and "backend:" not in result.stdout


def test_info_names_the_backend_and_versions() -> None:
    result = _run("info", "--backend", "simulator")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^backend\s+simulator \(asked for\)$", result.stdout, re.M)
    for name in ("total memory", "free memory", "allocator", "numpy", "numba-cuda", "anyio"):
        assert re.search(rf"^{name}\s+\S", result.stdout, re.M), name
    assert re.search(rf"^aiocubie\s+{re.escape(aiocubie.__version__)}$", result.stdout, re.M)


def test_info_says_the_simulator_models_cupy_arrays() -> None:
    # issue 22: `info` printed "arrays cupy" beside "cupy not installed"
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "aiocubie", "info"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "AIOCUBIE_BACKEND": "simulator"},
    ).stdout
    assert "backend" in out and "simulator" in out
    assert re.search(r"arrays\s+cupy \(the simulator's model; CuPy itself is not needed\)", out)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "the following arguments are required"),
        (("demo", "--runs", "0"), "must be at least 1"),
        (("demo", "--runs", "many"), "is not a whole number"),
        (("demo", "--backend", "gpu"), "invalid choice"),
        (("frobnicate",), "invalid choice"),
    ],
)
def test_bad_options_exit_2_with_a_message(
    args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _cli.main(list(args))
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_cuda_without_a_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    # private, on purpose: the driver probe is faked to play a machine without a GPU (none is public)
    monkeypatch.setattr(_select, "_driver_devices", lambda: (0, "no GPU in this test"))
    with pytest.raises(
        aiocubie.errors.ConfigurationError, match="backend 'cuda' is not usable here: no GPU in this test"
    ):
        aiocubie.select_backend("cuda")
    with pytest.raises(aiocubie.errors.ConfigurationError, match="unknown backend 'gpu'"):
        aiocubie.select_backend("gpu")


def test_auto_follows_the_driver_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")  # restored afterwards, whatever select_backend sets
    monkeypatch.delitem(sys.modules, "numba.cuda", raising=False)  # as if not imported yet
    # private, on purpose: the driver probe is faked to play a machine without a driver (none is public)
    monkeypatch.setattr(_select, "_driver_devices", lambda: (0, "no driver here"))
    assert aiocubie.select_backend("auto") == ("simulator", "no driver here")
    assert os.environ["NUMBA_ENABLE_CUDASIM"] == "1"


def test_bench_runs_from_the_package_and_writes_only_where_asked(tmp_path: Path) -> None:
    # in a subprocess from an empty directory: nothing of the checkout is needed or written
    out = tmp_path / "bench.json"
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "aiocubie", "bench", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    for label in ("bare asyncio future round trip", "one request in a loop", "64 requesters, one group"):
        assert label in result.stdout
    rows = json.loads(out.read_text())["rows"]
    assert {row["path"] for row in rows} >= {"one request in a loop", "64 requesters, 64 groups"}
    assert all(row["us_per_request"] > 0 for row in rows)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]


def test_bench_help_lists_its_options() -> None:
    result = _run("bench", "--help")
    assert result.returncode == 0
    assert "--quick" in result.stdout and "--out" in result.stdout


def test_version() -> None:
    result = _run("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"aiocubie {aiocubie.__version__}"


@needs_numba
def test_an_aiocubie_error_inside_a_task_group_is_one_line_without_traceback() -> None:
    result = _run("demo", "--backend", "simulator", "--budget", "100", "--no-progress")
    assert result.returncode == 1
    assert "aiocubie demo: --budget 100 bytes is too small for the demo" in result.stderr
    assert "Give --budget 1KiB or more" in result.stderr
    assert "Traceback" not in result.stderr and "ExceptionGroup" not in result.stderr
    debug = _run("--debug", "demo", "--backend", "simulator", "--budget", "100", "--no-progress")
    assert debug.returncode == 1 and "Traceback" in debug.stderr


@needs_numba
def test_demo_says_its_plan_first_and_refuses_an_absurd_one_unless_forced() -> None:
    result = _run("demo", "--backend", "simulator", "--budget", "2000", "--no-progress")
    assert result.returncode == 1
    assert re.search(
        r"^plan \(chunks x runs per batch\): load [\d,]+ x \d+, .*: about [\d,]+ chunk walks in all",
        result.stdout,
        re.M,
    )
    assert "pass --force to run it anyway" in result.stderr and "Traceback" not in result.stderr
    small = _run("demo", "--backend", "simulator", "--runs", "500", "--batches", "1", "--no-progress")
    assert small.returncode == 0, small.stderr
    assert re.search(
        r"^plan \(chunks x runs per batch\): load 1 x 500, solve 1 x 500, reduce 1 x 500:", small.stdout, re.M
    )


def test_cli_takes_debug_after_the_verb_the_backend_from_the_environment_and_a_closed_pipe(tmp_path: Path) -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "AIOCUBIE_BACKEND": "bogus"}
    result = subprocess.run(
        [sys.executable, "-m", "aiocubie", "info", "--debug"], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 1 and "AIOCUBIE_BACKEND='bogus' is not a backend" in result.stderr
    assert "Traceback" in result.stderr  # --debug after the verb counts
    env["AIOCUBIE_BACKEND"] = "simulator"
    result = subprocess.run(
        [sys.executable, "-m", "aiocubie", "info"], capture_output=True, text=True, timeout=120, env=env
    )
    assert "backend       simulator (asked for)" in result.stdout
    # a reader that leaves early (aiocubie bench | head -1): no BrokenPipeError traceback
    bench = subprocess.Popen(
        [sys.executable, "-m", "aiocubie", "bench", "--quick"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert bench.stdout is not None and bench.stdout.readline()
    bench.stdout.close()
    _, err = bench.communicate(timeout=120)
    assert bench.returncode == 0 and b"BrokenPipeError" not in err


def test_history_refuses_an_output_it_cannot_draw_before_reading(tmp_path: Path) -> None:
    for out in ("x.txt", "myplot"):
        result = _run("history", str(tmp_path / "missing.json"), "--out", str(tmp_path / out))
        assert result.returncode == 1 and "name a file ending in .html" in result.stderr, result.stderr


def test_the_demo_sizes_its_workload_to_the_device() -> None:
    # on a GPU the budget and the runs grow with the device (chunks large enough for the
    # overlapped walk to win); the simulator keeps its small sizes; what is given is kept
    pytest.importorskip("numba")
    aiocubie.select_backend("simulator")  # before numba.cuda is imported: its CUDA simulator
    from aiocubie._demo import DEFAULT_BUDGET, DEFAULT_RUNS, GPU_BUDGET, GPU_RUNS, workload_size

    assert workload_size("simulator", 0, None, None) == (DEFAULT_RUNS, DEFAULT_BUDGET)
    assert workload_size("cuda", 80 << 30, None, None) == (GPU_RUNS, GPU_BUDGET)
    assert workload_size("cuda", 256 << 20, None, None) == (GPU_RUNS * 64 // 160, 64 << 20)  # a quarter of it
    assert workload_size("cuda", 80 << 30, 1000, 1 << 20) == (1000, 1 << 20)
    assert workload_size("cuda", 80 << 30, None, 1 << 20) == (DEFAULT_RUNS, 1 << 20)


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("65536", 65536),
        ("1_048_576", 1 << 20),
        ("1e6", 10**6),
        ("512KiB", 512 << 10),
        ("1MiB", 1 << 20),
        ("1GB", 10**9),
    ],
)
def test_demo_budget_takes_whole_numbers_and_units(text: str, nbytes: int) -> None:
    assert _cli._bytes(text) == nbytes


@pytest.mark.parametrize("text", ["1.5", "1e-3", "1MiBs", "lots", "1e999999"])
def test_demo_budget_says_what_it_accepts(text: str) -> None:
    with pytest.raises(
        argparse.ArgumentTypeError, match=r"not a whole number of bytes: give one such as .* 1e6, or one with a unit"
    ):
        _cli._bytes(text)
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be at least 1"):
        _cli._bytes("0")


def test_history_of_another_file_says_so_once(tmp_path: Path) -> None:
    (tmp_path / "other.json").write_text("{}")
    result = _run("history", str(tmp_path / "other.json"))
    assert result.returncode == 1
    assert result.stderr.count("not an aiocubie history") == 1, result.stderr
    assert "format None" in result.stderr and "mgr.history().to_json(path)" in result.stderr
