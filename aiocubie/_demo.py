# numba ships no type information: its kernel decorator and device functions are untyped.
# mypy: disable-error-code="untyped-decorator,attr-defined,no-untyped-call"
"""``python -m aiocubie demo``: four components in three stream groups push a workload larger
than the memory budget through real numba CUDA kernels, chunk by chunk, and check the result.

The groups work at once (the loader on the next batch while the solvers work on this one); the
two solve components ask together, so each of their batches is one request pair with one chunk
plan; every walk is overlapped. The run ends with a summary, a plot if asked for, and the check.

Import it only after :func:`aiocubie.select_backend`: it imports numba.cuda.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from numba import cuda
from numba.core.errors import NumbaPerformanceWarning

from ._backends import Engines, SimulatorBackend
from ._errors import ConfigurationError, PlanningError
from ._manager import MemoryManager
from ._planner import offered_bytes, plan_batch
from ._recorder import Recorder
from ._requests import ArrayRequest
from ._stats import Percentiles, Snapshot
from ._walks import DEFAULT_DEPTH, walk_chunks, walk_requests

__all__ = ["run_demo"]

FEATURES = 8
#: Simulated device memory when no budget is given.
DEFAULT_BUDGET = 1 << 20
#: Plans of more chunks than this are refused unless forced (each chunk is a round of copies and a launch).
MAX_CHUNKS = 5_000
#: What a chunk costs at least on the simulator (its kernels run as Python threads).
SIMULATOR_SECONDS_PER_CHUNK = 0.013
#: What a kernel's visit of one run (8 features) costs on the simulator, on a 2-core machine.
SIMULATOR_SECONDS_PER_RUN = 30e-6
#: Bytes a second of the simulator's copy engines: about as slow as its kernels, so overlap shows.
SIMULATOR_BANDWIDTH = 1e6
#: Share of the budget each of the four components may hold (active mode caps).
SHARE = 0.2
#: Runs per batch on the simulator when not given.
DEFAULT_RUNS = 20_000
#: On a GPU, when not given: a budget of at most a quarter of the device, and runs per batch
#: to match (2 Mi runs: 64 MiB an array, about 9 chunks of 7 MiB for the loader), so that chunks
#: are large enough for the copies, not the per-chunk costs, to set the pace and the overlapped
#: walk shows (with a 1 MiB budget its chunks were tiny and it lost: 0.98x on an H100).
GPU_BUDGET = 160 << 20
GPU_RUNS = 1 << 21
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


@cuda.jit
def peak_kernel(x: Any, peak: Any) -> None:  # pragma: no cover - compiled by numba
    for j in range(cuda.grid(1), x.shape[1], cuda.gridsize(1)):
        top = 0.0
        for i in range(x.shape[0]):
            top = max(top, abs(x[i, j]))
        peak[j] = top


class Stage:
    """A pipeline component: registers with the manager and launches its kernel per chunk."""

    def __init__(
        self, mgr: MemoryManager, name: str, group: str, proportion: float, advance: Callable[[int], None]
    ) -> None:
        self.mgr = mgr
        self.name = name
        self.group = group
        self.advance = advance
        self.depth = DEFAULT_DEPTH  # overlapped walks: the next chunk copies in while this one computes
        self.busy: list[tuple[float, float]] = []  # (start, end) of each batch it worked on
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
        started = time.perf_counter()
        async with self.mgr.request(self, walk_requests(requests, self.depth)) as response:
            async for chunk in walk_chunks(response, inputs=inputs, outputs=outputs, depth=self.depth):
                await self.launch(kernel, chunk.length, *(chunk.device[label] for label in args))
                self.advance(chunk.length)
        self.busy.append((started, time.perf_counter()))

    async def launch(self, kernel: Any, size: int, *args: Any) -> None:
        """Run ``kernel`` over ``size`` items on this stage's stream (on the simulator, and wait for it)."""
        stream = self.mgr.groups.stream(self)
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
            await self.mgr.groups.sync(self)
            if failures:
                raise failures[0]
        else:  # queued: the walk orders the chunk's copy out after it, so the host need not wait
            kernel[min(math.ceil(size / 256), 1024), 256, stream](*args)


def loader_requests(runs: int) -> dict[str, ArrayRequest]:
    """The loader's arrays for a batch of ``runs``."""
    return {
        "raw": ArrayRequest((FEATURES, runs), np.float32, chunk_axis=1),
        "scale": ArrayRequest(FEATURES, np.float64, unchunkable=True),
        "features": ArrayRequest((FEATURES, runs), np.float32, chunk_axis=1),
    }


def energy_requests(runs: int) -> dict[str, ArrayRequest]:
    """The energy solver's arrays for a batch of ``runs``."""
    return {
        "x": ArrayRequest((FEATURES, runs), np.float32, chunk_axis=1),
        "weights": ArrayRequest(FEATURES, np.float64, unchunkable=True),
        "energy": ArrayRequest(runs, np.float32),
    }


def peak_requests(runs: int) -> dict[str, ArrayRequest]:
    """The peak finder's arrays for a batch of ``runs``."""
    return {"x": ArrayRequest((FEATURES, runs), np.float32, chunk_axis=1), "peak": ArrayRequest(runs, np.float32)}


def reducer_requests(runs: int) -> dict[str, ArrayRequest]:
    """The reducer's arrays for a batch of ``runs``."""
    return {
        "energy": ArrayRequest(runs, np.float32),
        "total": ArrayRequest(1, np.float64, unchunkable=True, zero=True),
    }


#: Stream group -> the request makers of its components, in the order they register.
GROUPS: dict[str, tuple[Callable[[int], dict[str, ArrayRequest]], ...]] = {
    "load": (loader_requests,),
    "solve": (energy_requests, peak_requests),
    "reduce": (reducer_requests,),
}


class Loader(Stage):
    """Scales raw features on the device: ``features = raw * scale``."""

    async def process(self, raw: np.ndarray[Any, Any], scale: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        features = self.mgr.host.array(raw.shape, raw.dtype)
        inputs = {"raw": raw, "scale": scale}
        await self.run_chunked(
            scale_kernel, loader_requests(raw.shape[1]), inputs, {"features": features}, ("raw", "scale", "features")
        )
        return features


class Energy(Stage):
    """Per-run weighted energy: ``energy[j] = sum_i weights[i] * x[i, j] ** 2``."""

    async def process(self, x: np.ndarray[Any, Any], weights: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        energy = self.mgr.host.array(x.shape[1], np.float32)
        inputs = {"x": x, "weights": weights}
        await self.run_chunked(
            energy_kernel, energy_requests(x.shape[1]), inputs, {"energy": energy}, ("x", "weights", "energy")
        )
        return energy


class Peak(Stage):
    """Per-run peak amplitude: ``peak[j] = max_i |x[i, j]|``."""

    async def process(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        peak = self.mgr.host.array(x.shape[1], np.float32)
        await self.run_chunked(peak_kernel, peak_requests(x.shape[1]), {"x": x}, {"peak": peak}, ("x", "peak"))
        return peak


class Reducer(Stage):
    """Sums the energies of a batch into one float64 on the device."""

    async def process(self, energy: np.ndarray[Any, Any]) -> float:
        total = np.zeros(1)
        await self.run_chunked(
            sum_kernel, reducer_requests(energy.shape[0]), {"energy": energy}, {"total": total}, ("energy", "total")
        )
        return float(total[0])


def _workload(batch: int, runs: int) -> np.ndarray[Any, Any]:
    return np.random.default_rng(batch).standard_normal((FEATURES, runs), dtype=np.float32)


async def _pipeline(
    mgr: MemoryManager, share: float, runs: int, batches: int, progress: Any
) -> tuple[dict[str, list[Any]], Snapshot, list[Stage]]:
    names = ("loader", "energy", "peak", "reducer")
    bars = {name: progress.add(name, runs * batches) for name in names}
    loader = Loader(mgr, "loader", "load", share, bars["loader"])
    energy = Energy(mgr, "energy", "solve", share, bars["energy"])
    peak = Peak(mgr, "peak", "solve", share, bars["peak"])
    reducer = Reducer(mgr, "reducer", "reduce", share, bars["reducer"])
    scale = np.linspace(0.5, 2.0, FEATURES)
    weights = np.arange(1.0, FEATURES + 1)
    out: dict[str, list[Any]] = {"features": [], "energy": [], "peak": [], "total": []}
    to_solve, solve_in = anyio.create_memory_object_stream[np.ndarray[Any, Any]](1)
    to_reduce, reduce_in = anyio.create_memory_object_stream[np.ndarray[Any, Any]](1)

    def loaded(batch: int) -> np.ndarray[Any, Any]:  # a loader reads its data into page-locked memory
        return mgr.host.array((FEATURES, runs), np.float32, "pinned", like=_workload(batch, runs))

    async def load() -> None:
        async with to_solve:
            for batch in range(batches):
                features = await loader.process(loaded(batch), scale)
                out["features"].append(features)
                await to_solve.send(features)

    async def solve() -> None:
        async with solve_in, to_reduce:
            async for features in solve_in:
                # Both solve components ask at once: one batch, one chunk plan, walked in lockstep.
                found: dict[str, np.ndarray[Any, Any]] = {}

                async def run_energy() -> None:
                    found["energy"] = await energy.process(features, weights)

                async def run_peak() -> None:
                    found["peak"] = await peak.process(features)

                async with anyio.create_task_group() as both:
                    both.start_soon(run_energy)
                    both.start_soon(run_peak)
                out["energy"].append(found["energy"])
                out["peak"].append(found["peak"])
                await to_reduce.send(found["energy"])

    async def reduce() -> None:
        async with reduce_in:
            async for energies in reduce_in:
                out["total"].append(await reducer.process(energies))

    # The groups work at once: the loader on batch b + 1 while the solvers work on batch b.
    async with anyio.create_task_group() as tg:
        tg.start_soon(load)
        tg.start_soon(solve)
        tg.start_soon(reduce)
    out["scale"], out["weights"] = [scale], [weights]
    snapshot = mgr.stats()  # of the pipeline alone, while the stages live (a collected one leaves the stats)
    stages: list[Stage] = [loader, energy, peak, reducer]
    # The loader's walk of one batch again, serial (depth 1) and overlapped, on the same data:
    # the request and the walk (its busy span), not making the data or the output array.
    loader.advance = lambda runs: None
    seconds = []
    raw = loaded(0)
    for depth in (1, DEFAULT_DEPTH):
        loader.depth = depth
        features = await loader.process(raw, scale)
        started, ended = loader.busy[-1]
        seconds.append(ended - started)
        if not np.array_equal(features, out["features"][0]):
            raise AssertionError(f"the walk of depth {depth} gave other features than the pipeline's")
    out["walk_seconds"] = seconds
    del loader.busy[batches:]  # the timing walks are not part of the pipeline
    return out, snapshot, stages


def check(out: dict[str, list[Any]], runs: int) -> tuple[int, list[str]]:
    """Compare every output element with numpy; return the count checked and the mismatches."""
    scale, weights = out["scale"][0], out["weights"][0]
    checked, problems = 0, []
    for batch, (features, energy, peak, total) in enumerate(
        zip(out["features"], out["energy"], out["peak"], out["total"])
    ):
        want_features = (_workload(batch, runs) * scale[:, None]).astype(np.float32)
        want_energy = (weights[:, None] * want_features.astype(np.float64) ** 2).sum(axis=0)
        for name, got, want, rtol in (
            ("features", features, want_features, 1e-6),
            ("energy", energy, want_energy, 1e-5),
            ("peak", peak, np.abs(want_features).max(axis=0), 0.0),
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


def _kib(value: int | None) -> str:
    return "-" if value is None else f"{value / 1024:,.0f}"


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
                    _kib(s.peak_bytes),
                    _kib(s.cap_bytes),
                    _ms(s.queue_wait, "p50"),
                    _ms(s.queue_wait, "p99"),
                    _ms(s.ready_latency, "p50"),
                    _ms(s.ready_latency, "p99"),
                ]
            )
    return rows


HEADERS = [
    "",
    "requests",
    "batches",
    "chunks",
    "peak KiB",
    "cap KiB",
    "wait p50",
    "wait p99",
    "ready p50",
    "ready p99",
]


def headlines(snapshot: Snapshot, stages: list[Stage], serial: float, overlapped: float) -> list[str]:
    """What the run shows, one line each: batching and chunking per group, the groups working
    at once, and the overlapped walk."""
    lines = []
    for group, usage in snapshot.groups.items():
        members = [stage.name for stage in stages if stage.group == group]
        per_batch = usage.requests / usage.batches if usage.batches else 0.0
        cap = f" of its {_kib(usage.cap_bytes)} KiB cap" if usage.cap_bytes is not None else ""
        lines.append(
            f"{group:<7} {' + '.join(members)}: {usage.requests} requests in {usage.batches} batches "
            f"({per_batch:.3g} a batch, one chunk plan each), walked in {usage.chunks} chunks; "
            f"peak {_kib(usage.peak_bytes)} KiB{cap}"
        )
    spans = [span for stage in stages for span in stage.busy]
    if spans:
        wall = max(end for _, end in spans) - min(start for start, _ in spans)
        busy = sum(end - start for start, end in spans)
        lines.append(
            f"groups at once: the components were busy {busy:.2f} s in {wall:.2f} s of wall time "
            f"({busy / wall:.2f} at a time on average)"
        )
    lines.append(
        f"overlapped walk: one loader batch took {serial * 1e3:.1f} ms serial (depth 1) and "
        f"{overlapped * 1e3:.1f} ms overlapped (depth {DEFAULT_DEPTH}): speed-up {serial / overlapped:.2f}x"
    )
    return lines


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
    caption = "wait: request to allocation; ready: allocation to resolved (ms)"
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [HEADERS, *rows]) for i in range(len(HEADERS))]
        print(title, f"({caption})")
        for row in [HEADERS, *rows]:
            print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
        return
    table = Table(title=title, caption=caption)
    for header in HEADERS:
        table.add_column(header, justify="right" if header else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.width = max(console.width, 120)  # pipes report 80 columns: keep rows on one line
    console.print(table)


def _announce_plan(mgr: MemoryManager, share: float, runs: int, batches: int, force: bool, budget: int) -> None:
    """Print how each group's batches will be chunked; refuse absurd plans unless forced."""
    info = mgr.pool.memory_info()
    headroom, granule = mgr.options.headroom, mgr.backend.device.granule
    chunks = 0
    plans = []
    for group, makers in GROUPS.items():
        cap = math.floor(share * info.total) * len(makers)  # a group's cap: its members' caps together
        offered = offered_bytes(cap, info.free, headroom=headroom, granule=granule)
        batch = {index: walk_requests(make(runs), DEFAULT_DEPTH) for index, make in enumerate(makers)}
        try:
            plan = plan_batch(batch, offered)
        except PlanningError:
            least = _least_budget(runs, headroom, granule)
            raise ConfigurationError(
                f"--budget {budget:,} bytes is too small for the demo: group {group!r} may use {offered:,} bytes "
                f"of it, not enough for one run of its components with their chunk buffers. Give --budget "
                f"{least >> 10}KiB or more (the default on the simulator is 1MiB)"
            ) from None
        chunks += plan.chunks * batches * len(makers)
        plans.append(f"{group} {plan.chunks:,} x {plan.chunk_length:,}")
    estimate = ""
    if mgr.backend.name == "simulator":  # each stage's kernel visits each run (+ the loader's two timing walks)
        seconds = runs * (4 * batches + 2) * SIMULATOR_SECONDS_PER_RUN + chunks * SIMULATOR_SECONDS_PER_CHUNK
        estimate = f", about {seconds:,.0f} s on the simulator"
    print(f"plan (chunks x runs per batch): {', '.join(plans)}: about {chunks:,} chunk walks in all{estimate}")
    if chunks > MAX_CHUNKS and not force:
        raise ConfigurationError(
            f"the budget cuts this workload into about {chunks:,} chunks (over {MAX_CHUNKS:,}): raise --budget, "
            "lower --runs, or pass --force to run it anyway"
        )


def _least_budget(runs: int, headroom: float, granule: int) -> int:
    """About the smallest budget (a power of two, of at least 1 KiB) in which every group can plan a batch."""
    budget = 1 << 10
    while True:
        try:
            for makers in GROUPS.values():
                cap = math.floor(SHARE * budget) * len(makers)
                batch = {index: walk_requests(make(runs), DEFAULT_DEPTH) for index, make in enumerate(makers)}
                plan_batch(batch, offered_bytes(cap, budget, headroom=headroom, granule=granule))
        except PlanningError:
            budget *= 2
        else:
            return budget


def _plot(recorder: Recorder, snapshot: Snapshot, path: Path) -> str:
    """Draw live device memory per group over time, with each group's cap; say what was done."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot: matplotlib is not installed (pip install 'aiocubie[plot]'): no plot drawn"
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for group, usage in snapshot.groups.items():
        times, live = recorder.series(group)
        (line,) = ax.step(times, [b / 1024 for b in live], where="post", label=group)
        if usage.cap_bytes is not None:
            ax.axhline(usage.cap_bytes / 1024, color=line.get_color(), linestyle="--", linewidth=0.8)
    ax.set(xlabel="time (s)", ylabel="live device memory (KiB)", title="aiocubie demo: memory per stream group")
    ax.legend(title="group (dashed: its cap)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return f"plot: wrote {path}"


def _outputs(
    mgr: MemoryManager, recorder: Recorder, snapshot: Snapshot, plot: Path | None, trace: Path | None
) -> list[str]:
    """Draw the plot and write the trace asked for; say what was done, a line each."""
    lines = []
    if plot is not None:
        lines.append(_plot(recorder, snapshot, plot))
    if trace is not None:  # the history with the recorder's snapshots: the pool's and other libraries' bytes too
        written = mgr.history().to_perfetto(trace, recorder.snapshots)
        lines.append(f"trace: wrote {written} (open it in ui.perfetto.dev or chrome://tracing)")
    return lines


def workload_size(backend: str, total: int, runs: int | None, budget: int | None) -> tuple[int, int]:
    """The runs per batch and the budget of a demo on ``backend`` (a device of ``total`` bytes),
    where not given: the simulator's small defaults, or on a GPU sized to the device (see
    :data:`GPU_BUDGET`)."""
    if backend == "simulator":
        return DEFAULT_RUNS if runs is None else runs, DEFAULT_BUDGET if budget is None else budget
    if budget is None:
        budget = min(GPU_BUDGET, total // 4)
    if runs is None:  # as many runs as keep the loader's chunks about as many as with the defaults
        runs = max(DEFAULT_RUNS, GPU_RUNS * budget // GPU_BUDGET)
    return runs, budget


def _manager(backend: str, runs: int | None, budget: int | None) -> tuple[MemoryManager, float, tuple[int, int]]:
    """The demo's manager on ``backend``, each component's share of the device, and the workload's
    (runs, budget) sized to it (see :func:`workload_size`)."""
    if backend == "simulator":
        size = workload_size(backend, 0, runs, budget)
        engines = Engines(h2d_bandwidth=SIMULATOR_BANDWIDTH, d2h_bandwidth=SIMULATOR_BANDWIDTH)
        return MemoryManager(SimulatorBackend(size[1], engines=engines), mode="active"), SHARE, size
    mgr = MemoryManager("cuda", mode="active")
    total = mgr.pool.memory_info().total
    size = workload_size(backend, total, runs, budget)
    return mgr, SHARE * min(1.0, size[1] / total), size


def run_demo(
    backend: str,
    why: str,
    *,
    runs: int | None,
    batches: int,
    budget: int | None,
    progress: bool,
    force: bool = False,
    plot: Path | None = None,
    trace: Path | None = None,
) -> int:
    """Run the demo pipeline on ``backend``; print progress, a summary and the check. Return 0 if all match.

    Says first how many chunks the plan walks, and refuses more than :data:`MAX_CHUNKS` unless
    ``force``. With ``plot``, draws memory per group over time there (needs matplotlib); with
    ``trace``, records the allocation history and writes it there as a trace (Trace Event format).
    """
    mgr, share, (runs, budget) = _manager(backend, runs, budget)
    if trace is not None:  # exported at the end (and left as it is otherwise: AIOCUBIE_HISTORY may have started it)
        mgr.record_history()
    workload = FEATURES * runs * batches * 4
    print(f"backend: {mgr.backend.name} ({why}); device: {mgr.backend.device.device_name}")
    print(
        f"workload: {batches} batches x {runs:,} runs x {FEATURES} features ({workload:,} bytes of float32) "
        f"through 4 components in 3 stream groups (load, solve, reduce); budget {budget:,} bytes, "
        f"each component capped at {share:.3g} of {mgr.pool.memory_info().total:,}"
    )
    try:
        _announce_plan(mgr, share, runs, batches, force, budget)
    except BaseException:
        mgr.close()
        raise

    async def main() -> tuple[dict[str, list[Any]], Snapshot, list[Stage], Recorder]:
        # The budget makes chunks small on purpose: numba's small-grid warnings are noise here.
        warnings.simplefilter("ignore", NumbaPerformanceWarning)
        async with mgr:
            with _Progress(progress) as bars:
                async with Recorder(mgr, interval=0.005) as recorder:
                    out, snapshot, stages = await _pipeline(mgr, share, runs, batches, bars)
                return out, snapshot, stages, recorder

    started = time.perf_counter()
    try:
        out, snapshot, stages, recorder = anyio.run(main)
    finally:
        mgr.close()
    elapsed = time.perf_counter() - started
    _print_table(summary_rows(snapshot), f"aiocubie demo: {elapsed:.2f} s on {mgr.backend.name}")
    for line in (*headlines(snapshot, stages, *out["walk_seconds"]), *_outputs(mgr, recorder, snapshot, plot, trace)):
        print(line)
    checked, problems = check(out, runs)
    for problem in problems:
        print("MISMATCH:", problem)
    if problems:
        return 1
    print(f"check: all {checked:,} output elements match numpy")
    return 0
