"""Smoke test of the benchmark suite: ``benchmarks/run --quick`` on the simulator writes a sound report.

No timing is asserted: figures on a CI machine are noise. Runs the script in a subprocess, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("core", "history", "latency", "throughput", "bridge", "chunking", "walk")


def _bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``benchmarks/<script> args...`` from the checkout, as a user would."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_quick_simulator_run_writes_json_and_markdown(tmp_path: Path) -> None:
    result = _bench("run", "--quick", "--backend", "simulator", "--out", str(tmp_path), "--name", "smoke")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert {
        "schema",
        "name",
        "backend",
        "quick",
        "command",
        "started",
        "seconds",
        "machine",
        "targets",
        "benchmarks",
    } <= set(report)
    assert (report["name"], report["backend"], report["quick"]) == ("smoke", "simulator", True)
    assert {"hostname", "cpus", "python", "device"} <= set(report["machine"])
    assert set(report["benchmarks"]) == set(BENCHMARKS)
    for name, section in report["benchmarks"].items():
        assert section["error"] is None, f"{name}: {section['error']}"
        assert section["tables"], name
        for table in section["tables"].values():
            assert table["rows"] and all(set(row) == set(table["columns"]) for row in table["rows"])
    for target in report["targets"]:
        assert {"target", "measured", "limit", "op", "met"} <= set(target)
    markdown = (tmp_path / "smoke.md").read_text()
    assert "Request->ready latency" in markdown and "Chunked batches" in markdown
    assert "| allocator |" in result.stdout  # the table is printed too


def test_simulator_run_does_not_import_gpu_libraries(tmp_path: Path) -> None:
    code = (
        "import runpy, sys; sys.argv = ['benchmarks/run', '--quick', '--only', 'chunking', "
        f"'--out', {str(tmp_path)!r}]\n"
        "try:\n    runpy.run_path('benchmarks/run', run_name='__main__')\nexcept SystemExit as exit:\n"
        "    assert not exit.code, exit.code\n"
        "assert 'cupy' not in sys.modules and 'numba.cuda' not in sys.modules, 'GPU library imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_multigpu_benchmark_quick_on_the_simulator(tmp_path: Path) -> None:
    """bench_multigpu --quick: the device set and Dask both run, and every peak is within its cap."""
    out = tmp_path / "multigpu.md"
    result = _bench("bench_multigpu.py", "--quick", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    table = out.read_text()
    assert "| device set, one program |" in table and "| Dask, one worker per GPU |" in table
    assert table.count("| yes |") == 4 and "| NO |" not in table


def test_multigpu_benchmark_runs_dask_cuda_on_gpus_only() -> None:
    """bench_multigpu --dask-cuda (LocalCUDACluster with RMM pools) needs the cuda backend: on the simulator, a clear exit."""
    result = _bench("bench_multigpu.py", "--quick", "--dask-cuda")
    assert (
        result.returncode == 2 and "--dask-cuda runs the Dask part on GPUs: use it with --backend cuda" in result.stderr
    )


def test_multigpu_benchmark_on_a_simulated_node_of_eight(tmp_path: Path) -> None:
    """bench_multigpu --gpus 8 (issue 24 on the simulator): a lane per device, every peak within its cap."""
    out = tmp_path / "multigpu8.md"
    result = _bench("bench_multigpu.py", "--quick", "--gpus", "8", "--no-dask", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    table = out.read_text()
    assert "a simulated host of 8 devices" in table and "| throughput 8 / one device" in table and ">= 7.0x" in table
    assert [f"| device set | {d} | lane-{d} |" in table for d in range(8)] == [True] * 8
    assert table.count("| yes |") == 8 and "| NO |" not in table


def test_pipeline_benchmark_checks_every_job_on_the_simulator(tmp_path: Path) -> None:
    # every output element of every job is checked inside the script: a wrong walk exits non-zero
    result = _bench("bench_pipeline.py", "--quick", "--profile", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "simulator-pipeline.json").read_text())
    jobs = [row["job"] for row in report["rows"]]
    assert len([job for job in jobs if job.startswith("pinned")]) == 5
    assert {"pageable first, 2-D", "stream one at a time", "stream 4 tasks, one group"} <= set(jobs)
    assert all(row["aiocubie_s"] > 0 and row["hand_s"] is None for row in report["rows"])
    assert 0 <= report["profile"]["activation_share"] < 1


def test_stream_host_benchmark_counts_calls_and_checks_every_output(tmp_path: Path) -> None:
    # every output of every batch is checked inside the script: a wrong walk exits non-zero
    out = tmp_path / "host.json"
    result = _bench("bench_stream_host.py", "--batches", "8", "--runs", "1", "--rounds", "1", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    (figures,) = json.loads(out.read_text())["best"].values()
    assert len(figures) == 8  # two devices, four loaders
    assert any(name.endswith("walk_batches, 4 in flight") for name in figures)
    assert all(f["calls"] > 0 and f["cpu_us"] > 0 and f["wall_us"] > 0 for f in figures.values())


def test_bench_pressure_measures_the_high_priority_wait_against_an_idle_manager(tmp_path: Path) -> None:
    result = _bench("bench_pressure.py", "--quick", "--only", "c", "--out", str(tmp_path), "--name", "pressure")
    assert result.returncode == 0, result.stderr
    rows = json.loads((tmp_path / "pressure.json").read_text())["priority"]
    assert [row["case"] for row in rows] == [
        "idle manager",
        "6 low streams, high priority",
        "6 low streams, same priority",
    ]
    assert all(row["n"] == 5 and row["p50_s"] > 0 for row in rows)


def test_pressure_benchmark_spills_and_checks_every_output(tmp_path: Path) -> None:
    # every output of every batch is checked inside the script; the run with spilling must complete every batch
    result = _bench("bench_pressure.py", "--quick", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "simulator-pressure.json").read_text())
    assert [row["what"] for row in report["spill"]][-1] == "spill + restore"
    assert all(row["GB/s"] > 0 and row["raw GB/s"] > 0 for row in report["spill"])
    spilling, fail, wait, chunk = report["pipeline"]
    assert spilling["completed"] and spilling["errors"] == 0 and spilling["batches"] == spilling["of"]
    assert spilling["spills"] > 0 and spilling["chunks per batch"] == 1.0
    assert not wait["completed"]  # without spilling the caches never go
    for run in (fail, chunk):  # passive mode: both chunk (down to a run a chunk), refused where not one run fits
        assert run["errors"] or run["chunks per batch"] > 1 or not run["completed"]
