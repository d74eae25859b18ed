"""Draw a trace that History.to_perfetto wrote (Trace Event format JSON) as a timeline picture, with matplotlib.

What docs/trace.png is made with: a stand-in for a screenshot of ui.perfetto.dev, drawn from the same
JSON Perfetto opens. A row per thread track (stream groups above, instances and their walks below), each
top-level slice a bar with the slices inside it in thinner bars (a request's arrays; its queued and in-flight
stretches hatched; a walk chunk's copies and body), then the "live bytes" counters per group.

    python -m aiocubie demo --backend simulator --trace demo-trace.json
    python scripts/trace_picture.py demo-trace.json docs/trace.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
#: A request's stretches drawn hatched (the rest inside it are its arrays), and a walk chunk's steps.
PHASES = {"queued": "////", "in flight": "...."}
STEPS = {"host->device": "#4c72b0", "body": "#bbbbbb", "device->host": "#dd8452"}


def _rows(events: list[dict[str, Any]]) -> list[tuple[tuple[int, int], str]]:
    """The thread tracks in their sort order: (pid, tid) and name."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    return sorted(names.items())


def _slices(events: list[dict[str, Any]], track: tuple[int, int]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """The top-level complete events of ``track``, each with the ones inside it."""
    spans = sorted(
        (e for e in events if e["ph"] == "X" and (e["pid"], e["tid"]) == track), key=lambda e: (e["ts"], -e["dur"])
    )
    out: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for span in spans:
        if out and span["ts"] + span["dur"] <= out[-1][0]["ts"] + out[-1][0]["dur"] + 1e-3:
            out[-1][1].append(span)
        else:
            out.append((span, []))
    return out


def draw(trace: dict[str, Any], out: Path) -> None:
    """Draw ``trace`` into ``out`` (a .png, .svg or .pdf)."""
    from matplotlib.figure import Figure

    events = trace["traceEvents"]
    rows = _rows(events)
    groups = [name.removeprefix("group ").split(" (")[0] for (pid, _), name in rows if pid == 1]
    colour = {group: COLOURS[i % len(COLOURS)] for i, group in enumerate(dict.fromkeys(groups))}
    figure = Figure(figsize=(10, 2.5 + 0.22 * len(rows)), layout="constrained")
    timeline, counters = figure.subplots(2, 1, sharex=True, height_ratios=(len(rows), 4))
    end = max((e["ts"] + e.get("dur", 0) for e in events if e["ph"] != "M"), default=0) / 1e6
    for y, (track, name) in enumerate(rows):
        for span, inner in _slices(events, track):
            group = span["args"].get("group") or name.removeprefix("group ").split(" (")[0]
            start, width, tint = span["ts"] / 1e6, span["dur"] / 1e6, colour.get(group, "#999999")
            timeline.broken_barh([(start, width)], (y - 0.4, 0.8), color=tint, alpha=0.25, edgecolor="white")
            for step in inner:
                box = [(step["ts"] / 1e6, step["dur"] / 1e6)]
                if step["name"] in PHASES:
                    timeline.broken_barh(
                        box, (y - 0.4, 0.8), facecolor="none", edgecolor=tint, hatch=PHASES[step["name"]]
                    )
                elif step["name"] in STEPS:
                    timeline.broken_barh(box, (y - 0.3, 0.6), color=STEPS[step["name"]], alpha=0.9)
            arrays = [e for e in inner if e["name"] not in ("allocate", "planned", "allocated", *PHASES, *STEPS)]
            for k, array in enumerate(arrays):
                height = 0.7 / max(len(arrays), 1)
                box = (y - 0.35 + k * height, height * 0.8)
                timeline.broken_barh([(array["ts"] / 1e6, array["dur"] / 1e6)], box, color=tint, alpha=0.8)
            args = span["args"]
            if span["name"] == "batch":
                words = f"{args['chunks']} chunk(s) of {args['chunk length']} runs"
            elif "arrays" in args:
                words = f"{', '.join(args['arrays'])}: {args.get('bytes', 0) / 1024:.0f} KiB"
            else:  # a wait, a walk's chunk
                words = span["name"]
            if width > len(words) * end / 140:  # room for the words
                timeline.text(start + end / 300, y, words, va="center", fontsize=7, color="#222222")
    timeline.set_yticks(range(len(rows)), [name for _, name in rows], fontsize="small")
    timeline.invert_yaxis()
    timeline.set_title("aiocubie demo, drawn from its Perfetto trace: batches per stream group, requests per instance "
                       "(hatched: queued,\nin flight; inside: arrays), and the chunks of their walks (blue: copy in, grey: body, orange: copy out)",
                       loc="left", fontsize="small")  # fmt: skip
    live = [e for e in events if e["ph"] == "C" and e["name"] == "live bytes" and e["pid"] == 1]
    for group in colour:
        times = [e["ts"] / 1e6 for e in live]
        values = [e["args"].get(group, 0) / 1024 for e in live]
        counters.step(times, values, where="post", color=colour[group], label=group)
    counters.set_ylabel("live KiB")
    counters.set_xlabel("seconds since the first event")
    counters.legend(title="live bytes per group", fontsize="small", ncols=len(colour), loc="upper right")
    counters.grid(alpha=0.3)
    figure.savefig(out, dpi=90)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    draw(json.loads(Path(argv[0]).read_text()), Path(argv[1]))
    print(f"drew {argv[0]} in {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
