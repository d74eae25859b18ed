"""An allocation history as a memory snapshot in the format torch's memory viewer reads (pytorch.org/memory_viz).

The format is torch's (``torch.cuda.memory._snapshot()``, pickled): ``{"segments": [...],
"device_traces": [[...]]}``. The history records sizes, not addresses, so each stream group gets a
segment of its own in a made-up address space, its arrays packed first fit. Pure: handed a history's
records, it builds the snapshot; the only I/O is :func:`write`.
"""

from __future__ import annotations

import os
import pickle
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ._errors import ConfigurationError, shown
from ._protocols import HistoryRecord

__all__ = ["PICKLE_PROTOCOL", "snapshot", "write"]

#: torch's viewer reads pickles of protocols 2 to 4 (its own unpickler, in MemoryViz.js).
PICKLE_PROTOCOL = 4
#: Where the first group's segment starts; each next one starts this far on (made-up addresses).
_SPACING = 1 << 40
_FRAME = re.compile(r"(?P<filename>.*):(?P<line>\d+) in (?P<name>.*)")


class _Segment:
    """One stream group's segment: its blocks packed first fit, what it grew to, its stream number."""

    def __init__(self, address: int, stream: int) -> None:
        self.address, self.stream = address, stream
        self.size = 0  # the most it spanned: the segment's size
        self.live: dict[int, tuple[int, list[dict[str, Any]]]] = {}  # address -> (size, frames)
        self.opened: dict[str, Any] | None = None  # its segment_alloc entry (size set at the end)

    def place(self, nbytes: int) -> int:
        """The lowest address of a gap of ``nbytes`` (first fit)."""
        at = self.address
        for start in sorted(self.live):
            if start - at >= nbytes:
                break
            at = max(at, start + self.live[start][0])
        self.size = max(self.size, at + nbytes - self.address)
        return at

    def blocks(self) -> list[dict[str, Any]]:
        """Its blocks at the end, tiling it: what is held, and the gaps between."""
        out: list[dict[str, Any]] = []
        at = self.address
        for start in sorted(self.live):
            size, frames = self.live[start]
            if start > at:
                out.append({"address": at, "size": start - at, "requested_size": 0, "state": "inactive", "frames": []})
            out.append(
                {"address": start, "size": size, "requested_size": size, "state": "active_allocated", "frames": frames}
            )
            at = start + size
        end = self.address + self.size
        if end > at:
            out.append({"address": at, "size": end - at, "requested_size": 0, "state": "inactive", "frames": []})
        return out


def _frames(event: HistoryRecord) -> list[dict[str, Any]]:
    """Innermost first: who held it (the viewer shows this as the top frame), then where it was asked from."""
    own = {"filename": f"stream group {event.group}", "line": 0, "name": f"{event.instance}: {event.label}"}
    stack = []
    for line in reversed(event.stack or ()):
        match = _FRAME.fullmatch(line)
        if match is not None:
            stack.append({"filename": match["filename"], "line": int(match["line"]), "name": match["name"]})
    return [own, *stack]


def snapshot(events: Iterable[HistoryRecord]) -> dict[str, Any]:
    """The snapshot of a history's ``events``: every allocation and release of device bytes, in order.

    Each allocation is an ``alloc`` trace entry, each release ``free_requested`` then
    ``free_completed``; a group's first allocation opens its segment (``segment_alloc``);
    a context reset frees everything. Failures are left out (torch's ``oom`` entry needs the
    device's free bytes, which the history does not keep).
    """
    segments: dict[str, _Segment] = {}
    held: dict[tuple[str | None, str | None], list[tuple[_Segment, int]]] = {}  # (instance, label) -> oldest first
    trace: list[dict[str, Any]] = []
    for event in events:
        kind = str(getattr(event.kind, "value", event.kind))
        at = {"time_us": int(event.time * 1e6)}
        if kind == "allocate" and event.nbytes > 0:
            group = event.group or "?"
            segment = segments.get(group)
            if segment is None:
                segment = segments[group] = _Segment(_SPACING * (len(segments) + 1), len(segments) + 1)
                segment.opened = {"action": "segment_alloc", "addr": segment.address, "size": 0,
                                  "stream": segment.stream, "frames": [], **at}  # fmt: skip
                trace.append(segment.opened)
            address, frames = segment.place(event.nbytes), _frames(event)
            segment.live[address] = (event.nbytes, frames)
            held.setdefault((event.instance, event.label), []).append((segment, address))
            trace.append({"action": "alloc", "addr": address, "size": event.nbytes, "stream": segment.stream,
                          "frames": frames, **at})  # fmt: skip
        elif kind == "release" and held.get((event.instance, event.label)):
            segment, address = held[event.instance, event.label].pop(0)
            _free(trace, segment, address, at)
        elif kind == "reset" and event.detail.startswith("context"):
            for blocks in held.values():
                for segment, address in blocks:
                    _free(trace, segment, address, at)
            held.clear()
    for segment in segments.values():
        assert segment.opened is not None
        segment.opened["size"] = segment.size
    return {"segments": [_segment(s) for s in segments.values()], "device_traces": [trace]}


def _free(trace: list[dict[str, Any]], segment: _Segment, address: int, at: dict[str, int]) -> None:
    size, frames = segment.live.pop(address)
    for action in ("free_requested", "free_completed"):
        trace.append(
            {"action": action, "addr": address, "size": size, "stream": segment.stream, "frames": frames, **at}
        )


def _segment(segment: _Segment) -> dict[str, Any]:
    """A segment as torch's snapshot describes one (at the end of the history)."""
    blocks = segment.blocks()
    held = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {
        "device": 0,
        "address": segment.address,
        "total_size": segment.size,
        "allocated_size": held,
        "active_size": held,
        "requested_size": held,
        "stream": segment.stream,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }


def write(events: Sequence[HistoryRecord], path: str | os.PathLike[str]) -> Path:
    """Pickle the :func:`snapshot` of ``events`` to ``path`` (as ``torch.cuda.memory._dump_snapshot`` does).

    Raises
    ------
    ConfigurationError
        If ``path`` is not a path, or cannot be written.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigurationError(f"a memory snapshot is written to a file: pass its path, got {shown(path)}")
    out = Path(path)
    data = snapshot(events)
    try:
        with open(out, "wb") as file:
            pickle.dump(data, file, protocol=PICKLE_PROTOCOL)
    except OSError as exc:
        raise ConfigurationError(f"cannot write the memory snapshot to {str(out)!r}: {exc.strerror or exc}") from exc
    return out
