"""Shared pieces of the benchmarks: timing summaries, ratios, markdown tables, machine facts.

Pure helpers: no device library, no event loop. Every figure a benchmark reports is a
summary of samples taken in the same process as the baseline it is compared with.
"""

from __future__ import annotations

import gc
import os
import platform
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

#: The one array of the latency benchmarks: 1 MiB of float32.
MIB = 1 << 20


@dataclass
class Settings:
    """How long each benchmark runs: the full run or ``--quick`` (a smoke run of seconds)."""

    quick: bool
    backend: str  # "simulator" or "cuda"

    def iters(self, full: int, quick: int = 50) -> int:
        """Timed iterations of one measurement."""
        return quick if self.quick else full

    @property
    def requesters(self) -> tuple[int, ...]:
        """The N of the throughput benchmark."""
        return (1, 8) if self.quick else (1, 8, 64, 512)

    @property
    def idle_seconds(self) -> float:
        """How long the idle-CPU measurement waits."""
        return 0.1 if self.quick else 1.0


#: One timed iteration: do the work, return how to undo it (outside the timed span).
Step = Callable[[], Callable[[], None]]
AsyncStep = Callable[[], Awaitable[Callable[[], None]]]


#: A raw path: the step that allocates ``n`` 1 MiB arrays behind one event and waits for it.
RawPath = Callable[[int], Step]


class Device(Protocol):
    """What a benchmark needs of a device (bench_sim.SimDevice, bench_gpu.CudaDevice)."""

    name: str
    allocators: tuple[str, ...]
    array_types: tuple[str, ...]
    baseline: str  # the label of the raw path every ratio is taken against
    backend: Any
    stream: Any  # a stream of ``backend`` for the raw and bridge measurements

    def use(self, allocator: str) -> None: ...
    def backend_for(self, array_type: str) -> Any: ...
    def raw_paths(self) -> dict[str, RawPath]: ...
    def block(self, stream: Any, seconds: float) -> Callable[[], int | None]: ...
    def info(self) -> dict[str, Any]: ...
    def close(self) -> None: ...


def allocate(
    backend: Any, shape: tuple[int, ...], dtype: Any, kind: Any, stream: Any
) -> tuple[Any, Callable[[], None]]:
    """An array over a block of ``backend``'s resource, as the device account makes it, and its release."""
    import numpy as np

    dtype = np.dtype(dtype)
    resource = backend.resource
    block = resource.allocate(int(np.prod(shape)) * dtype.itemsize, kind, stream)
    return backend.arrays.make(block, shape, dtype, stream), lambda: resource.deallocate(block)


@dataclass
class Section:
    """What one benchmark module reports: its tables and the targets it checked."""

    tables: list[Table] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)

    def target(
        self, name: str, measured: float | None, limit: float, unit: str = "", *, at_least: bool = False
    ) -> None:
        """Record a target ``measured <= limit`` (``>=`` with ``at_least``); a missing measurement misses it."""
        met = measured is not None and (measured >= limit if at_least else measured <= limit)
        self.targets.append(
            {
                "target": name,
                "measured": measured,
                "limit": limit,
                "op": ">=" if at_least else "<=",
                "unit": unit,
                "met": met,
            }
        )


def time_sync(step: Step, n: int, warmup: int) -> np.ndarray[Any, Any]:
    """Nanoseconds of each of ``n`` calls of ``step`` after ``warmup`` untimed ones."""
    samples = np.empty(n, dtype=np.int64)
    for _ in range(warmup):
        step()()
    gc.collect()
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        undo = step()
        samples[i] = clock() - t0
        undo()
        del undo  # drop what it held here, not inside the next timed span
    return samples


async def time_async(step: AsyncStep, n: int, warmup: int) -> np.ndarray[Any, Any]:
    """:func:`time_sync` for a coroutine step, run in the current event loop."""
    samples = np.empty(n, dtype=np.int64)
    for _ in range(warmup):
        (await step())()
    gc.collect()
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        undo = await step()
        samples[i] = clock() - t0
        undo()
        del undo  # drop what it held here, not inside the next timed span
    return samples


def nothing() -> None:
    """An undo that has nothing to undo."""


def summary(samples_ns: Sequence[int] | np.ndarray[Any, Any]) -> dict[str, float]:
    """Median, p99, mean and min of ``samples_ns``, in microseconds."""
    data = np.asarray(samples_ns, dtype=np.float64) / 1e3
    p50, p99 = np.percentile(data, [50, 99])
    return {
        "n": int(data.size),
        "median_us": round(float(p50), 3),
        "p99_us": round(float(p99), 3),
        "mean_us": round(float(data.mean()), 3),
        "min_us": round(float(data.min()), 3),
    }


def ratio(value: float | None, baseline: float | None) -> float | None:
    """``value / baseline`` rounded for reports, or None when either is missing or zero."""
    if not value or not baseline:
        return None
    return round(value / baseline, 3)


def fmt(value: Any) -> str:
    """A table cell: floats with three significant decimals, None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


@dataclass
class Table:
    """A titled table of rows, printed as markdown and stored in the JSON as a list of dicts."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""

    def add(self, *cells: Any) -> None:
        """Append one row (as many cells as columns)."""
        assert len(cells) == len(self.columns), (cells, self.columns)
        self.rows.append(list(cells))

    def markdown(self) -> str:
        """The table as GitHub markdown, its title as a heading and its note under it."""
        lines = [f"### {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.columns))) + "|")
        lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def records(self) -> list[dict[str, Any]]:
        """The rows as dicts keyed by column."""
        return [dict(zip(self.columns, row)) for row in self.rows]


def machine(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the figures were measured on."""
    import anyio

    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "anyio": anyio.__version__ if hasattr(anyio, "__version__") else _version("anyio"),
        "aiocubie": _version("aiocubie"),
    }
    facts.update(extra or {})
    return facts


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def percent(part: float, whole: float) -> float:
    """``100 * part / whole``, rounded for reports."""
    return round(100.0 * part / whole, 3) if whole else 0.0


def flatten(tables: Iterable[Table]) -> dict[str, Any]:
    """Tables keyed by title, as the JSON stores them."""
    return {t.title: {"columns": t.columns, "rows": t.records(), "note": t.note} for t in tables}
