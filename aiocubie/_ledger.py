"""The ledger: every array the manager has handed out, and the bytes each instance and group holds.

Pure bookkeeping: no device calls, no event loop. The manager frees the arrays the ledger
gives back; the ledger only says what is live and what was the peak.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import attrs

from ._requests import ArrayResponse, MemoryKind

__all__ = ["SPILLED", "Allocation", "Ledger"]

#: The block of an allocation whose array is spilled to host (see :meth:`Ledger.evict`): nothing to give back.
SPILLED: Any = type("Spilled", (), {"__repr__": lambda self: "SPILLED", "__slots__": ()})()


@attrs.define(eq=False)
class Allocation:
    """One live array: who asked for it, under which label, the VRAM it takes, the block under it."""

    array: Any
    label: str
    key: Hashable
    group: str
    kind: MemoryKind
    vram: int
    block: Any = None  # the resource's Block the array is made over: what the account gives back
    owner: object = None  # the ArrayResponse it belongs to; held, so its id() stays unique


class Ledger:
    """Live allocations, indexed by owner, with live and peak VRAM bytes per key and group."""

    def __init__(self) -> None:
        self._by_owner: dict[int, list[Allocation]] = {}
        self.live_by_key: dict[Hashable, int] = defaultdict(int)
        self.peak_by_key: dict[Hashable, int] = defaultdict(int)
        self.live_by_group: dict[str, int] = defaultdict(int)
        self.peak_by_group: dict[str, int] = defaultdict(int)
        self.live = 0
        self.peak = 0

    def __len__(self) -> int:
        return sum(len(allocs) for allocs in self._by_owner.values())

    def add(self, owner: object, allocations: list[Allocation], vram: int) -> None:
        """Record ``allocations`` of one key and group, ``vram`` bytes together, as held by ``owner``."""
        if not allocations:  # an empty response holds nothing and must not linger here
            return
        first = allocations[0]
        key, group = first.key, first.group
        for alloc in allocations:
            alloc.owner = owner
        self._by_owner[id(owner)] = allocations
        live = self.live = self.live + vram
        if live > self.peak:
            self.peak = live
        live = self.live_by_key[key] = self.live_by_key[key] + vram
        if live > self.peak_by_key[key]:
            self.peak_by_key[key] = live
        live = self.live_by_group[group] = self.live_by_group[group] + vram
        if live > self.peak_by_group[group]:
            self.peak_by_group[group] = live

    def bytes_of(self, kind: MemoryKind) -> int:
        """VRAM bytes of the live allocations of ``kind`` (a walk over them: for reports, not hot paths)."""
        return sum(a.vram for allocs in self._by_owner.values() for a in allocs if a.kind is kind)

    def held(self, keys: Iterable[Hashable]) -> int:
        """VRAM bytes held by ``keys`` together."""
        live, held = self.live_by_key, 0
        for key in keys:  # a loop, not sum() over a generator: read on every batch
            if key in live:
                held += live[key]
        return held

    def forget(self, key: Hashable) -> int:
        """Drop the totals of ``key`` (which holds nothing now) and return its peak."""
        self.live_by_key.pop(key, None)
        return self.peak_by_key.pop(key, 0)

    def forget_group(self, group: str) -> int:
        """Drop the totals of ``group`` (which holds nothing now) and return its peak."""
        self.live_by_group.pop(group, None)
        return self.peak_by_group.pop(group, 0)

    def regroup(self, key: Hashable, group: str) -> None:
        """Count what ``key`` holds in ``group`` from now on (its member moved there)."""
        for allocs in self._by_owner.values():
            if allocs[0].key != key:  # one owner: one key and group
                continue
            old = allocs[0].group
            if old == group:
                continue
            vram = 0
            for alloc in allocs:
                alloc.group = group
                vram += alloc.vram
            self.live_by_group[old] -= vram
            live = self.live_by_group[group] = self.live_by_group[group] + vram
            if live > self.peak_by_group[group]:
                self.peak_by_group[group] = live

    def reset_peaks(self, *, keys: Iterable[Hashable] = (), groups: Iterable[str] = (), total: bool = False) -> None:
        """Peaks start again from what is live now: of ``keys``, of ``groups``, and the total if ``total``."""
        for key in keys:
            self.peak_by_key[key] = self.live_by_key.get(key, 0)
        for group in groups:
            self.peak_by_group[group] = self.live_by_group.get(group, 0)
        if total:
            self.peak = self.live

    def holds(self, owner: object) -> bool:
        """Whether ``owner`` holds allocations here."""
        return id(owner) in self._by_owner

    def of(self, owner: object) -> list[Allocation]:
        """What ``owner`` holds here (nothing if released)."""
        return self._by_owner.get(id(owner), [])

    def pop_owner(self, owner: object) -> list[Allocation]:
        """Remove and return everything ``owner`` holds (nothing if already released)."""
        allocs = self._by_owner.pop(id(owner), None)
        if allocs is None:
            return []
        if isinstance(owner, ArrayResponse):  # a walk over it refuses from now on
            owner.lease.mark_released(owner.arrays)  # its labels: those still held are among them
        first = allocs[0]  # one owner: one key and group
        vram = 0
        for alloc in allocs:
            vram += alloc.vram
        self.live -= vram
        self.live_by_key[first.key] -= vram
        self.live_by_group[first.group] -= vram
        return allocs

    def evict(self, allocations: Iterable[Allocation]) -> int:
        """``allocations`` (held) went to host: their VRAM leaves every total; they stay with their owner
        (block :data:`SPILLED`, no bytes) until restored or released. Returns the bytes that left."""
        vram = 0
        for alloc in allocations:
            vram += alloc.vram
            self.live_by_key[alloc.key] -= alloc.vram
            self.live_by_group[alloc.group] -= alloc.vram
            alloc.vram, alloc.block, alloc.array = 0, SPILLED, None
        self.live -= vram
        return vram

    def graft(self, source: object, owner: object, labels: dict[str, str]) -> list[Allocation] | None:
        """Move what ``source`` holds to ``owner`` (totals unchanged), each allocation's label renamed by
        ``labels``, in place of ``owner``'s evicted ones of those labels; return them (None: either holds
        nothing, and nothing moved)."""
        moved, held = self._by_owner.get(id(source)), self._by_owner.get(id(owner))
        if moved is None or held is None:
            return None
        del self._by_owner[id(source)]
        names = set(labels.values())
        kept = [a for a in held if not (a.block is SPILLED and a.label in names)]
        for alloc in moved:
            alloc.label, alloc.owner = labels[alloc.label], owner
        self._by_owner[id(owner)] = kept + moved
        return moved

    def pop_where(self, predicate: Callable[[Allocation], bool]) -> list[Allocation]:
        """Remove and return every allocation for which ``predicate`` is true."""
        popped: list[Allocation] = []
        for owner, allocs in list(self._by_owner.items()):
            keep: list[Allocation] = []
            for alloc in allocs:
                (popped if predicate(alloc) else keep).append(alloc)
            if not keep:
                del self._by_owner[owner]
            elif len(keep) != len(allocs):
                self._by_owner[owner] = keep
        self._forget(popped)
        return popped

    def _forget(self, allocs: Iterable[Allocation]) -> None:
        for alloc in allocs:
            if isinstance(alloc.owner, ArrayResponse):
                alloc.owner.lease.mark_released((alloc.label,))
            self.live -= alloc.vram
            self.live_by_key[alloc.key] -= alloc.vram
            self.live_by_group[alloc.group] -= alloc.vram
