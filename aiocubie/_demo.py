# numba ships no type information: its kernel decorator and device functions are untyped.
# mypy: disable-error-code="untyped-decorator,attr-defined,no-untyped-call"
"""``python -m aiocubie demo``: three components in two stream groups push a workload larger
than the memory budget through real numba CUDA kernels, chunk by chunk, and check the result.

Import it only after :func:`aiocubie.select_backend`: it imports numba.cuda.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np
from numba import cuda
from numba.core.errors import NumbaPerformanceWarning

from ._backends import Engines, SimulatorBackend
from ._errors import ConfigurationError
from ._manager import MemoryManager
from ._planner import offered_bytes, plan_batch
from ._requests import ArrayRequest
from ._stats import Percentiles, Snapshot
from ._walk import DEFAULT_DEPTH, walk_chunks, walk_requests

__all__ = ["run_demo"]

FEATURES = 8
#: Simulated device memory when no budget is given.
DEFAULT_BUDGET = 1 << 20
#: Plans of more chunks than this are refused unless forced (each chunk is a round of copies and a launch).
MAX_CHUNKS = 5_000
#: What a chunk costs at least on the simulator (its kernels run as Python threads).
SIMULATOR_SECONDS_PER_CHUNK = 0.013
#: Share of the budget each of the three components may hold (active mode caps).
SHARE = 0.3
# numba's CUDA simulator keeps the running kernel in a module global: one launch at a time.
_SIMULATOR_LAUNCH = threading.Lock()


@cuda.jit
def scale_kernel(raw: Any, scale: Any, out: Any) -> None:  # pragma: no cover - compiled by numba
    # Grid-stride loops: correct for any launch size, so the simulator can use a tiny one.
    for j in range(cuda.grid(1), raw.shape[1], cuda.gridsize(1)):
        for i in range(raw.shape[0]):
            out[i, j] = raw[i, j] * scale[i]


@cuda.jit
def energy_kernel(x: Any, weights: Any, energy: Any) -> None:  # pragma: no cover - compiled by numba
    for j in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        acc = 0.0
        for i in range(x.shape[0]):
            acc += weights[i] * x[i, j] * x[i, j]
        energy[j] = acc


@cuda.jit
def sum_kernel(values: Any, total: Any) -> None:  # pragma: no cover - compiled by numba
    acc = 0.0
    for j in range(cuda.grid(1), values.shape[0], cuda.gridsize(1)):
        # The cast keeps the sum in float64 under the simulator too, where numpy would
        # otherwise add a Python float and a float32 in float32.
        acc += np.float64(values[j])
    cuda.atomic.add(total, 0, acc)  # one atomic per thread, not per element


class Stage:
    """A pipeline component: registers with the manager and launches its kernel per chunk."""

    def __init__(
        self, mgr: MemoryManager, name: str, group: str, proportion: float, advance: Callable[[int], None]
    ) -> None:
        self.mgr = mgr
        self.name = name
        self.advance = advance
        self.depth = DEFAULT_DEPTH  # overlapped walks: the next chunk copies in while this one computes
        mgr.register(self, stream_group=group, proportion=proportion, name=name)

    async def run_chunked(
        self,
        kernel: Any,
        requests: dict[str, ArrayRequest],
        inputs: dict[str, np.ndarray[Any, Any]],
        outputs: dict[str, np.ndarray[Any, Any]],
        args: tuple[str, ...],
    ) -> None:
        """Request ``requests`` and launch ``kernel`` on each chunk with the device arrays ``args``."""
        async with self.mgr.request(self, walk_requests(requests, self.depth)) as response:
            async for chunk in walk_chunks(response, inputs=inputs, outputs=outputs, depth=self.depth):
                await self.launch(kernel, chunk.length, *(chunk.device[label] for label in args))
                self.advance(chunk.length)

    async def launch(self, kernel: Any, size: int, *args: Any) -> None:
        """Run ``kernel`` over ``size`` items on this stage's stream and wait for it."""
        stream = self.mgr.get_stream(self)
        if isinstance(self.mgr.backend, SimulatorBackend):
            # Each simulated GPU thread is a Python thread: a small launch, queued on the
            # simulated stream so it runs after the copies before it, as on a GPU.
            # Wrapping the numpy arrays as simulator device arrays makes the kernel work on
            # them in place (strided views included), as a GPU kernel works on device memory.
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

            wrapped = [FakeCUDAArray(a) if isinstance(a, np.ndarray) else a for a in args]
            failures: list[BaseException] = []

            def work() -> None:
                try:
                    with _SIMULATOR_LAUNCH:
                        kernel[2, 32](*wrapped)
                except BaseException as exc:  # the stream's worker must survive to finish the event
                    failures.append(exc)

            stream.enqueue(work)
            await self.mgr.sync_stream(self)
            if failures:
                raise failures[0]
        else:
            kernel[min(math.ceil(size / 256), 1024), 256, stream](*args)
            await self.mgr.sync_stream(self)


class Loader(Stage):
    """Scales raw features on the device: ``features = raw * scale``."""

    async def process(self, raw: np.ndarray[Any, Any], scale: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        features = self.mgr.create_host_array(raw.shape, raw.dtype)
        requests = {
            "raw": ArrayRequest(raw.shape, raw.dtype, chunk_axis=1),
            "scale": ArrayRequest(scale.shape, scale.dtype, unchunkable=True),
            "features": ArrayRequest(raw.shape, raw.dtype, chunk_axis=1),
        }
        inputs = {"raw": raw, "scale": scale}
        await self.run_chunked(scale_kernel, requests, inputs, {"features": features}, ("raw", "scale", "features"))
        return features


class Solver(Stage):
    """Per-run weighted energy: ``energy[j] = sum_i weights[i] * x[i, j] ** 2``."""

    async def process(self, x: np.ndarray[Any, Any], weights: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        runs = x.shape[1]
        energy = self.mgr.create_host_array(runs, np.float32)
        requests = {
            "x": ArrayRequest(x.shape, x.dtype, chunk_axis=1),
            "weights": ArrayRequest(weights.shape, weights.dtype, unchunkable=True),
            "energy": ArrayRequest(runs, np.float32),
        }
        inputs = {"x": x, "weights": weights}
        await self.run_chunked(energy_kernel, requests, inputs, {"energy": energy}, ("x", "weights", "energy"))
        return energy


class Reducer(Stage):
    """Sums the energies of a batch into one float64 on the device."""

    async def process(self, energy: np.ndarray[Any, Any]) -> float:
        total = np.zeros(1)
        requests = {
            "energy": ArrayRequest(energy.shape, energy.dtype),
            "total": ArrayRequest(1, np.float64, unchunkable=True, zero=True),
        }
        await self.run_chunked(sum_kernel, requests, {"energy": energy}, {"total": total}, ("energy", "total"))
        return float(total[0])


def _workload(batch: int, runs: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(batch).standard_normal((FEATURES, runs), dtype=np.float32)


async def _pipeline(
    mgr: MemoryManager, share: float, runs: int, batches: int, progress: Any
) -> tuple[dict[str, list[Any]], Snapshot]:
    bars = {name: progress.add(name, runs * batches) for name in ("loader", "solver", "reducer")}
    loader = Loader(mgr, "loader", "load", share, bars["loader"])
    solver = Solver(mgr, "solver", "solve", share, bars["solver"])
    reducer = Reducer(mgr, "reducer", "solve", share, bars["reducer"])
    scale = np.linspace(0.5, 2.0, FEATURES)
    weights = np.arange(1.0, FEATURES + 1)
    out: dict[str, list[Any]] = {"features": [], "energy": [], "total": []}
    to_solver, solver_in = anyio.create_memory_object_stream[np.ndarray[Any, Any]](1)
    to_reducer, reducer_in = anyio.create_memory_object_stream[np.ndarray[Any, Any]](1)

    async def load() -> None:
        async with to_solver:
            for batch in range(batches):
                features = await loader.process(_workload(batch, runs), scale)
                out["features"].append(features)
                await to_solver.send(features)

    async def solve() -> None:
        async with solver_in, to_reducer:
            async for features in solver_in:
                energy = await solver.process(features, weights)
                out["energy"].append(energy)
                await to_reducer.send(energy)

    async def reduce() -> None:
        async with reducer_in:
            async for energy in reducer_in:
                out["total"].append(await reducer.process(energy))

    # The stages overlap: the loader works on batch b + 1 while the solver works on batch b.
    async with anyio.create_task_group() as tg:
        tg.start_soon(load)
        tg.start_soon(solve)
        tg.start_soon(reduce)
    out["scale"], out["weights"] = [scale], [weights]
    snapshot = mgr.stats()  # of the pipeline alone, while the stages live (a collected one leaves the stats)
    # The loader's walk of one batch again, serial (depth 1) and overlapped, on the same data.
    loader.advance = lambda runs: None
    seconds = []
    for depth in (1, DEFAULT_DEPTH):
        loader.depth = depth
        started = time.perf_counter()
        features = await loader.process(_workload(0, runs), scale)
        seconds.append(time.perf_counter() - started)
        if not np.array_equal(features, out["features"][0]):
            raise AssertionError(f"the walk of depth {depth} gave other features than the pipeline's")
    out["walk_seconds"] = seconds
    return out, snapshot


def check(out: dict[str, list[Any]], runs: int) -> tuple[int, list[str]]:
    """Compare every output element with numpy; return the count checked and the mismatches."""
    scale, weights = out["scale"][0], out["weights"][0]
    checked, problems = 0, []
    for batch, (features, energy, total) in enumerate(zip(out["features"], out["energy"], out["total"])):
        want_features = (_workload(batch, runs) * scale[:, None]).astype(np.float32)
        want_energy = (weights[:, None] * want_features.astype(np.float64) ** 2).sum(axis=0)
        for name, got, want, rtol in (
            ("features", features, want_features, 1e-6),
            ("energy", energy, want_energy, 1e-5),
            ("total", np.array([total]), np.array([energy.sum(dtype=np.float64)]), 1e-9),
        ):
            bad = ~np.isclose(got, want, rtol=rtol, atol=0.0)
            checked += got.size
            if bad.any():
                problems.append(f"batch {batch} {name}: {int(bad.sum())} of {got.size} elements differ from numpy")
    return checked, problems


def _ms(p: Percentiles, attr: str) -> str:
    value = getattr(p, attr)
    return "-" if value is None else f"{value * 1e3:.2f}"


def summary_rows(snapshot: Snapshot) -> list[list[str]]:
    """One row per stream group and per instance of ``mgr.stats()``."""
    rows = []
    for kind, table in (("group", snapshot.groups), ("instance", snapshot.instances)):
        for name, s in table.items():
            rows.append(
                [
                    f"{name} ({kind})",
                    str(s.requests),
                    str(s.batches),
                    str(s.chunks),
                    f"{s.peak_bytes / 1024:.0f}",
                    _ms(s.queue_wait, "p50"),
                    _ms(s.queue_wait, "p99"),
                    _ms(s.ready_latency, "p50"),
                    _ms(s.ready_latency, "p99"),
                ]
            )
    return rows


HEADERS = ["", "requests", "batches", "chunks", "peak KiB", "wait p50", "wait p99", "ready p50", "ready p99"]


class _Progress:
    """Rich progress bars when rich is installed and wanted; otherwise nothing."""

    def __init__(self, enabled: bool) -> None:
        self._bars: Any = None
        if enabled:
            try:
                from rich.progress import Progress
            except ImportError:
                return
            self._bars = Progress()

    def add(self, name: str, total: int) -> Callable[[int], None]:
        if self._bars is None:
            return lambda runs: None
        task = self._bars.add_task(name, total=total)
        return lambda runs: self._bars.advance(task, runs)

    def __enter__(self) -> _Progress:
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bars is not None:
            self._bars.stop()


def _print_table(rows: list[list[str]], title: str) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [HEADERS, *rows]) for i in range(len(HEADERS))]
        print(title, "(wait: request to allocation; ready: allocation to resolved, in ms)")
        for row in [HEADERS, *rows]:
            print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
        return
    table = Table(title=title, caption="wait: request to allocation; ready: allocation to resolved (ms)")
    for header in HEADERS:
        table.add_column(header, justify="right" if header else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.width = max(console.width, 110)  # pipes report 80 columns: keep rows on one line
    console.print(table)


def _announce_plan(mgr: MemoryManager, share: float, runs: int, batches: int, force: bool) -> None:
    """Print how the loader's batches (the largest) will be chunked; refuse absurd plans unless forced."""
    requests = walk_requests(
        {
            "raw": ArrayRequest((FEATURES, runs), np.float32, chunk_axis=1),
            "scale": ArrayRequest(FEATURES, np.float32, unchunkable=True),
            "features": ArrayRequest((FEATURES, runs), np.float32, chunk_axis=1),
        },
        DEFAULT_DEPTH,
    )
    info = mgr.memory_info()
    cap = math.floor(share * info.total)
    offered = offered_bytes(cap, info.free, headroom=mgr.options.headroom, granule=mgr.backend.granule)
    plan = plan_batch({0: requests}, offered)  # a plan that cannot fit raises here, saying why
    chunks = 3 * plan.chunks * batches  # three stages, each walking about as many chunks
    estimate = ""
    if mgr.backend.name == "simulator":
        estimate = f", at least {chunks * SIMULATOR_SECONDS_PER_CHUNK:,.0f} s on the simulator"
    print(
        f"plan: {plan.chunks:,} chunks of {plan.chunk_length:,} runs per batch: about {chunks:,} chunks in all{estimate}"
    )
    if chunks > MAX_CHUNKS and not force:
        raise ConfigurationError(
            f"the budget cuts this workload into about {chunks:,} chunks (over {MAX_CHUNKS:,}): raise --budget, "
            "lower --runs, or pass --force to run it anyway"
        )


def run_demo(
    backend: str, why: str, *, runs: int, batches: int, budget: int | None, progress: bool, force: bool = False
) -> int:
    """Run the demo pipeline on ``backend``; print progress, a summary and the check. Return 0 if all match.

    Says first how many chunks the plan walks, and refuses more than :data:`MAX_CHUNKS` unless
    ``force``.
    """
    budget = DEFAULT_BUDGET if budget is None else budget
    if backend == "simulator":
        # copy engines about as slow as the simulated kernels (1 MB/s), so that overlapping them shows
        device: Any = SimulatorBackend(budget, engines=Engines(h2d_bandwidth=1e6, d2h_bandwidth=1e6))
        share = SHARE
    else:
        device = "cuda"
    mgr = MemoryManager(device, mode="active")
    if backend != "simulator":
        share = SHARE * min(1.0, budget / mgr.memory_info().total)
    workload = FEATURES * runs * batches * 4
    print(f"backend: {mgr.backend.name} ({why}); device: {mgr.backend.device_name}")
    print(
        f"workload: {batches} batches x {runs:,} runs x {FEATURES} features ({workload:,} bytes of float32), "
        f"budget {budget:,} bytes, each component capped at {share:.3g} of {mgr.memory_info().total:,}"
    )
    try:
        _announce_plan(mgr, share, runs, batches, force)
    except BaseException:
        mgr.close()
        raise

    async def main() -> tuple[dict[str, list[Any]], Snapshot]:
        # The budget makes chunks small on purpose: numba's small-grid warnings are noise here.
        warnings.simplefilter("ignore", NumbaPerformanceWarning)
        async with mgr:
            with _Progress(progress) as bars:
                return await _pipeline(mgr, share, runs, batches, bars)

    started = time.perf_counter()
    try:
        out, snapshot = anyio.run(main)
    finally:
        mgr.close()
    elapsed = time.perf_counter() - started
    _print_table(summary_rows(snapshot), f"aiocubie demo: {elapsed:.2f} s on {mgr.backend.name}")
    serial, overlapped = out["walk_seconds"]
    print(
        f"walk of one batch: serial (depth 1) {serial * 1e3:.1f} ms, overlapped (depth {DEFAULT_DEPTH}) "
        f"{overlapped * 1e3:.1f} ms: {serial / overlapped:.2f}x faster"
    )
    checked, problems = check(out, runs)
    for problem in problems:
        print("MISMATCH:", problem)
    if problems:
        return 1
    print(f"check: all {checked:,} output elements match numpy")
    return 0
