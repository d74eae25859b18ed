"""The scheduler's own cost: requests on a zero-latency device, against a bare asyncio future.

The measurement lives in the package (``aiocubie._bench``, also run by ``aiocubie bench``);
this module puts it in ``benchmarks/run``'s report. It runs the same on every machine
(``--backend`` does not change it): no device library is imported.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bench_common import Section, Settings, Table, ratio

from aiocubie import _bench


def run(device: Any, settings: Settings) -> Section:
    """Time per request of each path, as a ratio to the bare future round trip."""
    count, repeats = settings.iters(6400, 640), settings.iters(7, 3)
    results = asyncio.run(_bench.measure(count, repeats))
    section = Section()
    table = Table(
        "Scheduler cost per request on a zero-latency device (asyncio)",
        ["path", "us per request", "x bare future"],
        note=f"A loop of request + release of one 1 MiB array; the best of {repeats} runs of {count} requests, each path and the baseline alike. "
        "The device completes work as it is queued: every microsecond is aiocubie's Python.",
    )
    for label, micros, times, target in _bench.report(results):
        table.add(label, round(micros, 3), round(times, 3))
        if target is not None:
            section.target(f"per request, {label} / bare future", ratio(times, 1.0), target, "x")
    section.tables.append(table)
    return section


if __name__ == "__main__":
    for label, micros, times, _ in _bench.main():
        print(f"{label:40s} {micros:8.2f} us  {times:5.2f}x")
