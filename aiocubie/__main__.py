"""``python -m aiocubie`` / ``aiocubie``: the command line (info, demo, bench, history and broker).

It picks the backend before anything imports numba.cuda, because numba's CUDA simulator is
chosen by NUMBA_ENABLE_CUDASIM at that first import. It holds no library logic of its own, and
prints aiocubie's errors as one line each (with ``--debug``, their tracebacks too).
"""

from __future__ import annotations

import argparse
import decimal
import importlib.metadata
import json
import os
import platform
import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from ._backends import BACKENDS, Backend, select_backend
from ._broker import command as broker_command
from ._errors import AiocubieError, ConfigurationError

__all__ = ["main"]


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
        memory = backend.device.memory_info()
        rows = [
            ("backend", f"{backend.name} ({why})"),
            ("device", backend.device.device_name),
            ("total memory", f"{memory.total / 2**20:,.1f} MiB"),
            ("free memory", f"{memory.free / 2**20:,.1f} MiB"),
            ("allocator", backend.resource.name),
            ("arrays", _arrays_row(backend)),
            ("aiocubie", aiocubie.__version__),
            ("python", platform.python_version()),
        ]
    finally:
        backend.close()
    cupy = [p for p in ("cupy-cuda13x", "cupy-cuda12x", "cupy") if _version(p) != "not installed"]
    rows += [(p, _version(p)) for p in ("numpy", "numba", "numba-cuda", *(cupy or ["cupy"]), "anyio")]
    if backend.name == "simulator":
        rows.append(("note", "the demo runs its own simulator of --budget bytes (default 1 MiB), not this one"))
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def _arrays_row(backend: Backend) -> str:
    """The array type, and what it is on this backend (the simulator models CuPy: no CuPy needed)."""
    if backend.name == "simulator":
        return f"{backend.array_type} (the simulator's model; CuPy itself is not needed)"
    return str(backend.array_type)


def _demo(args: argparse.Namespace) -> int:
    if args.plot is not None:  # say so before the demo runs, not after
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                f"--plot {args.plot} draws with matplotlib, which is not installed: pip install 'aiocubie[plot]'"
            ) from None
    chosen, why = select_backend(args.backend)
    try:
        from ._demo import run_demo  # imports numba.cuda: only after the backend is chosen
    except ImportError as exc:
        raise ConfigurationError(
            f"the demo runs numba kernels, and numba cannot be imported ({exc}): pip install 'aiocubie[numba]'"
        ) from exc

    return run_demo(
        chosen,
        why,
        runs=args.runs,
        batches=args.batches,
        budget=args.budget,
        progress=args.progress,
        force=args.force,
        plot=args.plot,
        trace=args.trace,
    )


def _bench(args: argparse.Namespace) -> int:
    from . import _bench as bench  # the scheduler-cost benchmark: no device library

    rows = bench.main(quick=args.quick)
    width = max(len(label) for label, *_ in rows)
    print(f"{'path':<{width}}  {'us/request':>10}  {'x future':>8}  target")
    for label, micros, times, target in rows:
        goal = "" if target is None else f"<= {target:g}x {'met' if times <= target else 'NOT met'}"
        print(f"{label:<{width}}  {micros:10.2f}  {times:8.2f}  {goal}")
    print(
        "(a zero-latency device: every microsecond is aiocubie's Python; device benchmarks: "
        "benchmarks/run in a checkout)"
    )
    if args.out is not None:
        records = [
            {"path": label, "us_per_request": micros, "x_future": times, "target": target}
            for label, micros, times, target in rows
        ]
        args.out.write_text(json.dumps({"quick": args.quick, "rows": records}, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


def _history(args: argparse.Namespace) -> int:
    from ._history import History
    from ._plot import check_out, render

    exports = args.perfetto is not None or args.memory_viz is not None
    draw = args.out is not None or not exports  # exports alone: no picture unless --out asks for one
    out = check_out(args.out if args.out is not None else args.file.with_suffix(".html")) if draw else None
    history = History.load(args.file)
    done = []
    if out is not None:
        done.append(f"drawn in {render(history, out)}")
    if args.perfetto is not None:
        done.append(f"traced in {history.to_perfetto(args.perfetto)} (open it in ui.perfetto.dev)")
    if args.memory_viz is not None:
        done.append(f"written for pytorch.org/memory_viz in {history.to_memory_viz(args.memory_viz)}")
    print(f"{len(history.events)} events ({history.dropped} dropped) {'; '.join(done)}")
    return 0


def _environment_backend() -> str:
    """``$AIOCUBIE_BACKEND`` (as MemoryManager reads it), else ``"auto"``."""
    name = os.environ.get("AIOCUBIE_BACKEND", "").strip()
    if not name:
        return "auto"
    if name not in ("auto", "simulator", "cuda"):
        raise ConfigurationError(
            f"AIOCUBIE_BACKEND={name!r} is not a backend: use auto, simulator or cuda, or unset it"
        )
    return name


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def _whole(text: str, units: bool) -> int | None:
    """``text`` as a whole number (``20000``, ``20_000``, ``2e4``; with ``units``, ``512KiB``, ``1MiB``, ``1GB``)."""
    match = re.fullmatch(r"\s*([0-9_.eE+-]*?)\s*([A-Za-z]*)\s*", text)
    if match is None:
        return None
    number, unit = match.groups()
    if unit.lower() not in _UNITS or (unit and not units):
        return None
    try:
        value = decimal.Decimal(number.replace("_", "")) * _UNITS[unit.lower()]
    except (decimal.InvalidOperation, decimal.Overflow):
        return None
    whole = value.is_finite() and value.adjusted() < 30 and value == value.to_integral_value()  # 1e999999999: no
    return int(value) if whole else None


def _positive(text: str) -> int:
    value = _whole(text, units=False)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: give one such as 20000, 20_000 or 2e4")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _bytes(text: str) -> int:
    value = _whole(text, units=True)
    if value is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of bytes: give one such as 1048576, 1_048_576 or 1e6, or one with a "
            "unit: 512KiB, 1MiB, 1GB (KiB, MiB, GiB: powers of 1024; kB, MB, GB: of 1000)"
        )
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1 byte")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aiocubie", description="aiocubie: an async GPU memory allocation service.")
    parser.add_argument("--version", action="version", version=f"aiocubie {_version('aiocubie')}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error too")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{info,demo,bench,history,broker}")
    debug = argparse.ArgumentParser(add_help=False)  # --debug after the verb too
    debug.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="print the traceback of an error too"
    )
    backend = argparse.ArgumentParser(add_help=False, parents=[debug])
    backend.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="device to use (default: $AIOCUBIE_BACKEND, else auto: the GPU if there is one, else the simulator)",
    )
    commands.add_parser("info", parents=[backend], help="the backend chosen and why, the device, versions")
    _demo_parser(commands, backend)
    bench = commands.add_parser(
        "bench",
        parents=[debug],
        help="the scheduler's cost per request on a zero-latency device, against a bare asyncio future",
    )
    bench.add_argument("--quick", action="store_true", help="a smoke run of a second (noisy figures)")
    bench.add_argument("--out", type=Path, default=None, metavar="FILE", help="also write the figures as JSON")
    history = commands.add_parser(
        "history",
        parents=[debug],
        help="draw an allocation history (mgr.history().to_json(FILE)), or export it for Perfetto or torch's viewer",
    )
    history.add_argument("file", type=Path, metavar="FILE.json", help="a history written by History.to_json")
    history.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="PICTURE",
        help="page.html (self-contained), or picture.png/.svg/.pdf (needs matplotlib); default FILE.html "
        "(none when only exporting)",
    )
    history.add_argument(
        "--perfetto",
        type=Path,
        default=None,
        metavar="TRACE.json",
        help="also write a trace in the Trace Event format (ui.perfetto.dev, chrome://tracing)",
    )
    history.add_argument(
        "--memory-viz",
        type=Path,
        default=None,
        metavar="SNAPSHOT.pickle",
        help="also write a snapshot that torch's memory viewer (pytorch.org/memory_viz) opens",
    )
    broker_command.add_parser(commands, debug, _bytes)
    return parser


def _demo_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], backend: argparse.ArgumentParser
) -> None:
    """The ``demo`` verb's arguments."""
    demo = commands.add_parser(
        "demo",
        parents=[backend],
        help="a three-stage async pipeline, chunked to fit the memory budget, checked against numpy",
    )
    demo.add_argument(
        "--runs",
        type=_positive,
        default=None,
        help="runs per batch (default: 20000 on the simulator; on a GPU, sized to the budget: 2 Mi for 160 MiB)",
    )
    demo.add_argument("--batches", type=_positive, default=3, help="batches through the pipeline (default 3)")
    demo.add_argument(
        "--budget",
        type=_bytes,
        default=None,
        metavar="BYTES",
        help="device memory the components share, in bytes or with a unit: 65536, 512KiB, 1MiB, 1e6 (default: "
        "1MiB simulated; on a GPU, 160MiB or a quarter of the device, if less)",
    )
    demo.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    demo.add_argument("--force", action="store_true", help="run a plan of very many small chunks anyway")
    demo.add_argument(
        "--plot", type=Path, default=None, metavar="FILE", help="draw memory per group over time (needs matplotlib)"
    )
    demo.add_argument(
        "--trace",
        type=Path,
        default=None,
        metavar="TRACE.json",
        help="record the allocation history and write it as a trace that ui.perfetto.dev opens",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (1 for an aiocubie error, 2 for bad options)."""
    args = _parser().parse_args(argv)
    command = {"info": _info, "demo": _demo, "bench": _bench, "history": _history, "broker": broker_command.run}[
        args.command
    ]
    try:
        if getattr(args, "backend", "") is None:
            args.backend = _environment_backend()
        return command(args)
    except BrokenPipeError:  # `aiocubie bench | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush does not fail again
        return 0
    except Exception as exc:
        errors = list(_aiocubie_errors(exc))
        if not errors:  # not ours: a bug, shown in full
            raise
        for error in errors:
            print(f"aiocubie {args.command}: {error}", file=sys.stderr)
        if args.debug:
            traceback.print_exception(exc)
        else:
            print("(run with --debug for the traceback)", file=sys.stderr)
        return 1


def _aiocubie_errors(exc: BaseException) -> Iterator[AiocubieError]:
    """The AiocubieErrors in ``exc``, looking inside exception groups (anyio's task groups)."""
    if isinstance(exc, AiocubieError):
        yield exc
    for inner in getattr(exc, "exceptions", ()):  # an ExceptionGroup, on any Python version
        yield from _aiocubie_errors(inner)


if __name__ == "__main__":
    sys.exit(main())
