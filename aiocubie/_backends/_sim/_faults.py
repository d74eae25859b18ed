"""Faults injected into the simulator on demand: allocations, out of memory, events, copies, prefetches.

Only the simulator's device and its fault adaptor read the rules; nothing here touches memory.
"""

from __future__ import annotations

import math
import numbers
import random
import threading
from typing import Any, Literal

import numpy as np

from ..._errors import ConfigurationError, shown

__all__ = ["FaultSite", "Faults", "count", "real"]

FaultSite = Literal["allocate", "oom", "record_event", "copy", "prefetch"]
_FAULT_SITES = ("allocate", "oom", "record_event", "copy", "prefetch")


class Faults:
    """Faults to inject into a :class:`SimulatorBackend`.

    Examples
    --------
    >>> from aiocubie.simulator import SimulatorBackend
    >>> sim = SimulatorBackend(total=1 << 20)
    >>> sim.faults.inject("allocate", after=2)      # the 3rd allocation from now fails once
    >>> sim.faults.inject("oom", times=2)           # the next 2 allocations find no room
    >>> sim.faults.inject("copy", probability=0.1, times=None, seed=0)  # 10% of copies fail
    >>> sim.close()
    """

    def __init__(self) -> None:
        self._rules: dict[str, list[_Rule]] = {site: [] for site in _FAULT_SITES}
        self.fired: dict[str, int] = dict.fromkeys(_FAULT_SITES, 0)
        self._lock = threading.Lock()

    def inject(
        self,
        site: FaultSite,
        *,
        after: int = 0,
        times: int | None = 1,
        probability: float = 1.0,
        seed: int | None = None,
    ) -> None:
        """Make operations at ``site`` fail.

        Parameters
        ----------
        site : {"allocate", "oom", "record_event", "copy", "prefetch"}
            Which operation fails: ``"allocate"`` raises AllocationError (a failure the
            manager does not retry), ``"oom"`` OutOfMemoryError (no room: the manager tries
            to recover), both from ``allocate``.
        after : int
            Let this many operations at ``site`` succeed first.
        times : int or None
            How many operations fail (None: every one, until :meth:`clear`). A manager's
            out-of-memory recovery retries a failed batch: once after releasing the pool's cache,
            and once more after the reclaim hooks if there are any. So ``"oom"`` with ``times=1``
            is absorbed (the request gets its arrays; ``stats().recovery.recovered`` counts it),
            and a request raises OutOfMemoryError only when every try fails: ``times=None`` (then
            ``clear()``), or ``times`` at least the number of tries (2; 3 with reclaim hooks).
        probability : float
            Chance that an eligible operation fails (1.0: always).
        seed : int, optional
            Seed for the random draws, for reproducible tests.

        Raises
        ------
        ConfigurationError
            For an unknown site or a bad count, probability or seed (nothing is injected).
        """
        if not isinstance(site, str) or site not in self._rules:
            raise ConfigurationError(
                f"unknown fault site {shown(site)}: use one of {', '.join(map(repr, _FAULT_SITES))}"
            )
        if not count(after, 0):
            raise ConfigurationError(f"after must be an int >= 0 (operations to let through first), got {shown(after)}")
        if times is not None and not count(times, 1):
            raise ConfigurationError(f"times must be an int >= 1 or None (forever), got {shown(times)}")
        if not 0.0 <= real(probability) <= 1.0:
            raise ConfigurationError(f"probability must be a number in [0, 1], got {shown(probability)}")
        if seed is not None and not count(seed, -(2**63)):
            raise ConfigurationError(f"seed must be an int or None, got {shown(seed)}")
        rng = random.Random(None if seed is None else int(seed))  # numpy ints are not seeds
        rule = _Rule(int(after), None if times is None else int(times), float(probability), rng)
        with self._lock:
            self._rules[site].append(rule)

    def clear(self) -> None:
        """Remove every rule."""
        with self._lock:
            for rules in self._rules.values():
                rules.clear()

    def check(self, site: str) -> bool:
        """Count one operation at ``site``; True if it must fail."""
        with self._lock:
            rules = self._rules[site]
            for rule in rules:
                if rule.fires():
                    if rule.times == 0:
                        rules.remove(rule)
                    self.fired[site] += 1
                    return True
            return False


def count(value: Any, least: int) -> bool:
    """True if ``value`` is an int (not a bool) of at least ``least``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)) and int(value) >= least


def real(value: Any) -> float:
    """``value`` as a float; NaN for a bool or anything that is not a real number a float holds."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return math.nan
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        return math.nan


class _Rule:
    def __init__(self, after: int, times: int | None, probability: float, rng: random.Random) -> None:
        self.after, self.times, self.probability, self.rng = after, times, probability, rng

    def fires(self) -> bool:
        if self.after > 0:
            self.after -= 1
            return False
        if self.probability < 1.0 and self.rng.random() >= self.probability:
            return False
        if self.times is not None:
            self.times -= 1
        return True
