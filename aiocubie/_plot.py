"""Pictures of an allocation history: memory over time per group and per instance, plans marked.

An edge: it reads a :class:`History` and writes a file, through matplotlib (imported only
here, only when asked) or as a self-contained HTML page (inline SVG, no scripts, nothing fetched).
It never touches a manager or a device.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

from ._errors import ConfigurationError, shown
from ._history import EventKind, History, HistoryEvent
from ._stats import format_bytes

__all__ = ["render", "to_html"]

#: Line colours, cycled (matplotlib's default cycle, so both renderings agree).
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
_MARKED = {
    EventKind.PLAN: "#555555",
    EventKind.FAILURE: "#d62728",
    EventKind.RECOVERY: "#ff7f0e",
    EventKind.SPILL: "#9467bd",
    EventKind.RESTORE: "#2ca02c",
}


_PAGES = (".html", ".htm")
_PICTURES = (".png", ".svg", ".pdf")


def check_out(out: str | os.PathLike[str]) -> Path:
    """``out`` as a Path, if :func:`render` can draw into a file of its name.

    Raises
    ------
    ConfigurationError
        If it does not end in .html, .htm, .png, .svg or .pdf.
    """
    path = Path(out)
    if path.suffix.lower() not in (*_PAGES, *_PICTURES):
        raise ConfigurationError(
            f"cannot draw a history into {str(path)!r}: name a file ending in "
            f"{', '.join((*_PAGES, *_PICTURES))} (.html needs nothing; pictures need matplotlib)"
        )
    return path


def render(history: History, out: str | os.PathLike[str]) -> Path:
    """Draw ``history`` into ``out``: ``.html`` gives a page; ``.png``, ``.svg``, ``.pdf`` need matplotlib.

    Returns
    -------
    Path
        The file written.

    Raises
    ------
    ConfigurationError
        If ``history`` is not a History, if ``out`` does not end in .html, .htm, .png, .svg or .pdf, if matplotlib is needed and not installed (``pip install 'aiocubie[plot]'``, or write
        ``.html``), or the history has no memory events to draw.
    """
    if not isinstance(history, History):
        raise ConfigurationError(
            f"render_history draws a History, got {shown(history)}: pass mgr.history() (or History.load(path))"
        )
    path = check_out(out)
    if path.suffix.lower() in _PAGES:
        path.write_text(to_html(history), encoding="utf-8")
    else:
        _matplotlib(history, path)
    return path


def _unit(peak: int) -> tuple[int, str]:
    for size, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if peak >= size:
            return size, name
    return 1, "bytes"


def _marks(history: History) -> list[tuple[float, HistoryEvent]]:
    start = history.events[0].time if history.events else 0.0
    return [(event.time - start, event) for event in history.events if event.kind in _MARKED]


def _describe(event: HistoryEvent) -> str:
    if event.kind is EventKind.PLAN:
        return (
            f"plan, group {event.group}: {event.chunks} chunk(s) of {event.chunk_length} runs, "
            f"{format_bytes(event.nbytes)} ({event.detail})"
        )
    if event.kind is EventKind.SPILL:
        return f"spill, group {event.group}: {event.instance}'s {event.label!r} to host ({format_bytes(event.nbytes)})"
    return f"{event.kind.value}, group {event.group}: {event.detail} ({format_bytes(event.nbytes)})"


def _panels(history: History) -> list[tuple[str, dict[str, tuple[list[float], list[int]]]]]:
    panels = [("stream groups", history.series("group")), ("instances", history.series("instance"))]
    if not any(series for _, series in panels):
        raise ConfigurationError("the history has no allocations or releases to draw: record some work first")
    return panels


def _matplotlib(history: History, path: Path) -> None:
    try:
        from matplotlib.figure import Figure  # no pyplot: no global state, no display needed
    except ImportError:
        raise ConfigurationError(
            f"drawing {path.name} needs matplotlib: pip install 'aiocubie[plot]', or write an .html page"
        ) from None
    panels = _panels(history)
    end = history.events[-1].time - history.events[0].time
    figure = Figure(figsize=(10, 6.5), layout="constrained")
    axes = figure.subplots(len(panels), 1, sharex=True)
    marks = _marks(history)
    for ax, (title, series) in zip(axes, panels):
        size, unit = _unit(max((max(v) for _, v in series.values() if v), default=0))
        for index, (name, (times, values)) in enumerate(sorted(series.items())):
            ax.step(
                [*times, end],
                [v / size for v in (*values, values[-1])],
                where="post",
                label=name,
                color=COLOURS[index % 9],
            )
        for t, event in marks:
            ax.axvline(t, color=_MARKED[event.kind], alpha=0.25 if event.kind is EventKind.PLAN else 0.8, lw=0.8)
        ax.set_title(f"VRAM held per {title[:-1]}", loc="left")
        ax.set_ylabel(unit)
        ax.legend(loc="upper right", fontsize="small", ncols=2)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds since the first event (grey lines: plans; orange: recovery; red: failures)")
    figure.savefig(path)


_WIDTH, _HEIGHT, _LEFT, _TOP, _BOTTOM = 900, 260, 70, 16, 28


def _svg(series: dict[str, tuple[list[float], list[int]]], marks: list[tuple[float, HistoryEvent]], end: float) -> str:
    peak = max((max(v) for _, v in series.values() if v), default=0)
    size, unit = _unit(peak)
    top = max(peak / size, 1e-9) * 1.08
    span = max(end, 1e-9)
    width, height = _WIDTH - _LEFT - 10, _HEIGHT - _TOP - _BOTTOM

    def x(t: float) -> float:
        return _LEFT + width * t / span

    def y(v: float) -> float:
        return _TOP + height * (1 - v / size / top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" font-size="11">']
    for i in range(5):  # grid and value labels
        value = top * i / 4
        yy = _TOP + height * (1 - i / 4)
        parts.append(f'<line x1="{_LEFT}" x2="{_LEFT + width}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{_LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">{value:.3g} {unit}</text>')
    for i in range(6):
        t = span * i / 5
        parts.append(f'<text x="{x(t):.1f}" y="{_HEIGHT - 8}" text-anchor="middle">{t:.3g} s</text>')
    for t, event in marks:
        colour = _MARKED[event.kind]
        parts.append(
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{_TOP}" y2="{_TOP + height}" stroke="{colour}" '
            f'stroke-opacity="{0.3 if event.kind is EventKind.PLAN else 0.9}"><title>{html.escape(_describe(event))} '
            f"at {t:.4f} s</title></line>"
        )
    for index, (name, (times, values)) in enumerate(sorted(series.items())):
        path = [f"M{x(times[0]):.1f},{y(0):.1f}"]
        for t, v in zip(times, values):
            path.append(f"H{x(t):.1f}V{y(v):.1f}")
        path.append(f"H{x(end):.1f}")
        parts.append(
            f'<path d="{"".join(path)}" fill="none" stroke="{COLOURS[index % 9]}" stroke-width="1.6">'
            f"<title>{html.escape(name)}: peak {format_bytes(max(values))}</title></path>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _legend(series: dict[str, tuple[list[float], list[int]]]) -> str:
    items = []
    for index, (name, (_, values)) in enumerate(sorted(series.items())):
        items.append(
            f'<li><span style="color:{COLOURS[index % 9]}">&#9632;</span> {html.escape(name)} '
            f"(peak {format_bytes(max(values))}, last {format_bytes(values[-1])})</li>"
        )
    return f'<ul class="legend">{"".join(items)}</ul>'


def to_html(history: History, title: str = "aiocubie allocation history") -> str:
    """A self-contained HTML page of ``history``: one SVG chart per groups and instances, hover for details.

    Raises
    ------
    ConfigurationError
        If the history has no allocations or releases to draw.
    """
    panels = _panels(history)
    end = history.events[-1].time - history.events[0].time
    marks = _marks(history)
    counts: dict[str, int] = {}
    for event in history.events:
        counts[event.kind.value] = counts.get(event.kind.value, 0) + 1
    facts = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    dropped = f" ({history.dropped} older events dropped)" if history.dropped else ""
    body: list[Any] = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(history.events)} events over {end:.4g} s{dropped}: {facts}. Grey lines mark plans, orange "
        "recovery steps, red failures; hover over a line for details.</p>",
    ]
    for name, series in panels:
        body += [f"<h2>VRAM held per {name[:-1]}</h2>", _svg(series, marks, end), _legend(series)]
    style = (
        "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}"
        "ul.legend{list-style:none;padding:0;columns:3}h2{font-size:1.05em;margin-bottom:.2em}"
    )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )
