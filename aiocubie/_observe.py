"""Observability: stats, peaks and the allocation history of one manager, read from their owners.

It is handed the device, the account, the registry and the telemetry, reads them into frozen
snapshots, and is the one writer of peak counters and of whether a history is recorded. It
allocates nothing, holds no tickets or tasks, and never reaches back to the manager.
"""

from __future__ import annotations

import os
import time

from ._accounting import DeviceAccount
from ._backends import Device
from ._errors import ConfigurationError
from ._history import History, HistoryRecorder
from ._registry import Member, Registry
from ._stats import (
    GroupStatistics,
    ManagerStatistics,
    MemberStatistics,
    Percentiles,
    PinnedStats,
    Snapshot,
    SpillStats,
    Telemetry,
    UsageStats,
)

__all__ = ["Observer"]


class Observer:
    """Stats, peak resets and the history switch of one manager.

    Parameters
    ----------
    device : Device
        The device: its pinned staging pool (memory readings and pool facts come through the account).
    account : DeviceAccount
        The ledger, the budget and the recovery counts (read); peaks and history through it.
    registry : Registry
        Groups and members, for caps and names.
    telemetry : Telemetry
        The counters of every group and instance.
    """

    def __init__(self, device: Device, account: DeviceAccount, registry: Registry, telemetry: Telemetry) -> None:
        self._device = device
        self._account = account
        self._registry = registry
        self._telemetry = telemetry
        self._history: HistoryRecorder | None = None  # the last one recorded, kept once stopped

    def stats(self) -> Snapshot:
        """Live and peak bytes, requests, batches, chunks and latencies, per group and instance."""
        ledger = self._account.ledger
        info = self._account.memory_info()
        budget = self._account.budget
        active = self._account.options.active  # caps are enforced (and reported) in active mode only
        spills = self._account.spills
        groups = {}
        for name, counters in self._telemetry.groups.items():
            group = self._registry.groups.get(name)
            cap = budget.group_cap(group.members) if active and group is not None else None
            peak = max(ledger.peak_by_group.get(name, 0), counters.peak_bytes)
            spill = spills.group_stats(name) if spills is not None else SpillStats()
            groups[name] = UsageStats.of(counters, ledger.live_by_group.get(name, 0), peak, cap, spill)
        by_name = {m.name: m.key for m in self._registry.members.values()}
        instances = {}
        for name, counters in self._telemetry.instances.items():
            key = by_name.get(name)
            live, peak = ledger.live_by_key.get(key, 0), ledger.peak_by_key.get(key, 0)
            cap = budget.cap(key) if active and key is not None else None
            spill = spills.key_stats(key) if spills is not None and key is not None else SpillStats()
            instances[name] = UsageStats.of(counters, live, max(peak, counters.peak_bytes), cap, spill)
        pool = self._device.pinned_pool
        pinned = PinnedStats(pool.held, pool.in_use, pool.peak_in_use, pool.pinned)
        facts = self._account.resource.pool_facts()
        return Snapshot(
            Snapshot.now(),
            info.free,
            info.total,
            ledger.live,
            ledger.peak,
            groups,
            instances,
            pinned,
            time.time(),
            facts,
            self._account.recovery.stats,
            self._account.other_bytes(facts.in_use),
            {p: Percentiles.of(samples) for p, samples in self._telemetry.priorities.items() if samples},
            spills.total if spills is not None else SpillStats(),
        )

    def statistics(self, running: bool, groups: dict[str, GroupStatistics], draining: int) -> ManagerStatistics:
        """The manager's own state, with ``groups``' requests by stage (see :class:`ManagerStatistics`)."""
        registry, ledger, telemetry, budget = (
            self._registry,
            self._account.ledger,
            self._telemetry,
            self._account.budget,
        )
        members = {m.name: MemberStatistics(m.group, budget.is_manual(m.key)) for m in registry.members.values()}
        tables = {
            "groups": len(registry.groups),
            "schedulers": len(groups) + draining,
            "members": len(registry.members),
            "group counters": len(telemetry.groups),
            "instance counters": len(telemetry.instances),
            "ledger keys": len(ledger.live_by_key) + len(ledger.peak_by_key),
            "ledger groups": len(ledger.live_by_group) + len(ledger.peak_by_group),
        }
        spills, lease = self._account.spills, self._account.lease
        if spills is not None:
            tables["spillable responses"] = len(spills.records)
            tables["spill counters"] = len(spills.by_key) + len(spills.by_group)
        spilled = 0 if spills is None else spills.spilled()
        leased = None if lease is None else lease.statistics()
        return ManagerStatistics(running, groups, members, draining, len(ledger), tables, leased, spilled)

    # -- peaks -------------------------------------------------------------------------------
    def reset_peaks(self, group: str | None, member: Member | None) -> None:
        """Peaks start again from what is held now: of ``group``, of ``member``, or (neither) all.

        Raises
        ------
        RegistrationError
            For a group that does not exist.
        """
        telemetry = self._telemetry
        if group is None and member is None:
            for counters in (*telemetry.groups.values(), *telemetry.instances.values()):
                counters.peak_bytes = 0
            self._account.reset_peaks("all", every=True)
            return
        names, keys, groups = [], [], []
        if group is not None:
            name = self._registry.group(group).name
            groups.append(name)
            telemetry.group(name).peak_bytes = 0
            names.append(f"group {name!r}")
        if member is not None:
            keys.append(member.key)
            member.counters.peak_bytes = 0
            names.append(member.name)
        self._account.reset_peaks(", ".join(names), keys=keys, groups=groups)

    def member_left(self, member: Member, peak: int) -> None:
        """``member`` left holding a peak of ``peak`` bytes: keep it under its name."""
        member.counters.peak_bytes = max(member.counters.peak_bytes, peak)
        self._telemetry.retire_instance(member.name)

    def group_left(self, name: str) -> None:
        """Group ``name`` is gone: keep its peak under its name (once it holds nothing)."""
        peak = self._account.forget_group(name)
        counters = self._telemetry.groups.get(name)
        if peak is not None and counters is not None:
            counters.peak_bytes = max(counters.peak_bytes, peak)

    # -- history -----------------------------------------------------------------------------
    def record_history(
        self, enabled: bool, *, max_entries: int, stacks: bool, dump_on_oom: str | os.PathLike[str] | None
    ) -> None:
        """Start a new history (or, ``enabled=False``, stop recording); see ``MemoryManager.record_history``."""
        if not enabled:
            self._account.record_to(None)
            return
        self._history = HistoryRecorder(
            max_entries,
            stacks=stacks,
            ledger=self._account.ledger,
            names=self._registry.name_of,  # type: ignore[arg-type]
            dump_on_oom=dump_on_oom,
        )
        self._account.record_to(self._history)

    def history(self) -> History:
        """The history recorded so far.

        Raises
        ------
        ConfigurationError
            If no history was ever recorded.
        """
        if self._history is None:
            raise ConfigurationError(
                "no allocation history was recorded: call mgr.record_history() first (or set AIOCUBIE_HISTORY=1)"
            )
        return self._history.history()
