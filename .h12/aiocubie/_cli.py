"""The command line (``python -m aiocubie`` / ``aiocubie``): info, demo and bench.

It picks the backend before anything imports numba.cuda, because numba's CUDA simulator is
chosen by NUMBA_ENABLE_CUDASIM at that first import. It holds no library logic of its own.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ._backends import select_backend
from ._errors import AiocubieError

__all__ = ["main"]

#: What ``aiocubie bench`` runs: the benchmark driver of a repository checkout.
BENCH_SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "run"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _info(args: argparse.Namespace) -> int:
    chosen, why = select_backend(args.backend)
    import aiocubie

    backend = aiocubie.create_backend(chosen)
    try:
        memory = backend.memory_info()
        rows = [
            ("backend", f"{backend.name} ({why})"),
            ("device", backend.device_name),
            ("total memory", f"{memory.total / 2**20:,.1f} MiB"),
            ("free memory", f"{memory.free / 2**20:,.1f} MiB"),
            ("allocator", backend.allocator),
            ("aiocubie", aiocubie.__version__),
            ("python", platform.python_version()),
        ]
    finally:
        backend.close()
    cupy = [p for p in ("cupy-cuda13x", "cupy-cuda12x", "cupy") if _version(p) != "not installed"]
    rows += [(p, _version(p)) for p in ("numpy", "numba", "numba-cuda", *(cupy or ["cupy"]), "anyio")]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    chosen, why = select_backend(args.backend)
    from ._demo import run_demo  # imports numba.cuda: only after the backend is chosen

    return run_demo(
        chosen, why, runs=args.runs, batches=args.batches, budget=args.budget, progress=args.progress
    )


def _bench(args: argparse.Namespace) -> int:
    script = BENCH_SCRIPT
    if not script.is_file():
        print(
            f"no benchmarks here: {script} is missing. The benchmarks live in a checkout of the "
            "aiocubie repository (git clone, then run `python -m aiocubie bench` from it).",
            file=sys.stderr,
        )
        return 1
    return subprocess.call([sys.executable, str(script), *args.bench_args], cwd=script.parent.parent)


def _positive(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiocubie", description="aiocubie: an async GPU memory allocation service."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{info,demo,bench}")
    backend = argparse.ArgumentParser(add_help=False)
    backend.add_argument(
        "--backend", choices=("auto", "simulator", "cuda"), default="auto",
        help="device to use (default: auto, the GPU if there is one, else the simulator)",
    )
    commands.add_parser("info", parents=[backend], help="the backend chosen and why, the device, versions")
    demo = commands.add_parser(
        "demo", parents=[backend],
        help="a three-stage async pipeline, chunked to fit the memory budget, checked against numpy",
    )
    demo.add_argument("--runs", type=_positive, default=30_000, help="runs per batch (default 30000)")
    demo.add_argument("--batches", type=_positive, default=3, help="batches through the pipeline (default 3)")
    demo.add_argument(
        "--budget", type=_positive, default=None, metavar="BYTES",
        help="simulated device memory in bytes (simulator only; default 1 MiB)",
    )
    demo.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    commands.add_parser(
        "bench", help="run benchmarks/run of a repository checkout (further arguments are passed on)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (2 for bad options, as argparse does)."""
    parser = _parser()
    # bench passes unknown options on to the benchmark driver; argparse's REMAINDER would
    # refuse those that start with "--".
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "bench":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.bench_args = extra
    command = {"info": _info, "demo": _demo, "bench": _bench}[args.command]
    try:
        return command(args)
    except AiocubieError as exc:
        print(f"aiocubie {args.command}: {exc}", file=sys.stderr)
        return 1
