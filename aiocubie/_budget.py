"""The VRAM budget: manual and auto proportions, caps, and memory available to a group.

Pure: no numba.cuda, no event loop. Keys are opaque hashables (the manager uses instance ids).
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Hashable, Iterable

from ._errors import BudgetError, shown
from ._errors import warn as warn_at_caller

__all__ = ["MIN_AUTO_POOL", "Budget", "LimitMode", "group_available"]

#: The share of VRAM always kept for the auto pool.
MIN_AUTO_POOL = 0.05
#: Above this share of its limit in use, a group draws a warning in active mode.
HIGH_USE_WARNING = 0.95
# Float slack when summing proportions given as decimals (0.1 + 0.2 ...).
_EPS = 1e-9


def _tidy(value: float) -> float:
    """``value`` without float noise: 1 - 0.9 is 0.09999999999999998 in floats; this gives 0.1.

    Only noise goes (a change under 1e-15); a real fraction such as 1/3 is kept exact.
    """
    rounded = round(value, 12)
    return rounded if abs(rounded - value) < 1e-15 else value


class LimitMode(str, enum.Enum):
    """How group limits are enforced.

    ``passive``: use free device memory, chunk only when the batch does not fit.
    ``active``: each group is limited to the sum of its members' caps minus what they hold.
    """

    PASSIVE = "passive"
    ACTIVE = "active"


def check_proportion(proportion: object) -> float:
    """Return ``proportion`` as a float in (0, 1]; raise BudgetError otherwise."""
    if isinstance(proportion, bool) or not isinstance(proportion, numbers.Real):
        raise BudgetError(f"proportion must be a number in (0, 1], got {shown(proportion)}")
    try:
        value = float(proportion)
    except (OverflowError, ValueError, TypeError):  # 10**400, Fraction(10**400, 3): no float holds it
        value = math.nan
    if not (0.0 < value <= 1.0):  # also rejects NaN
        raise BudgetError(f"proportion must be in (0, 1] (a share of VRAM, e.g. 0.25), got {shown(proportion)}")
    return value


class Budget:
    """Proportions of total VRAM for registered keys, split into a manual and an auto pool.

    Manual members keep the proportion they were given. Auto members share what the manual
    pool leaves, equally, rebalanced on every change. At least :data:`MIN_AUTO_POOL` of VRAM
    stays for the auto pool: a change that would leave less is an error while auto members
    exist, and a warning otherwise.

    Parameters
    ----------
    total : int
        Total device memory in bytes; caps are ``floor(proportion * total)``.
    """

    def __init__(self, total: int) -> None:
        if total < 0:
            raise BudgetError(f"total memory must be >= 0 bytes, got {total}")
        self.total = int(total)
        self._manual: dict[Hashable, float] = {}
        self._auto: dict[Hashable, None] = {}  # insertion-ordered set
        self._caps: dict[Hashable, int] | None = None  # every key's cap, worked out again after a change
        #: Changes so far (a share added, removed or moved): what was worked out from the caps
        #: under an older version is stale.
        self.version = 0

    # -- queries -------------------------------------------------------------------------
    def __contains__(self, key: Hashable) -> bool:
        return key in self._manual or key in self._auto

    def __len__(self) -> int:
        return len(self._manual) + len(self._auto)

    @property
    def manual_pool_proportion(self) -> float:
        """Share of VRAM given to manual members."""
        return math.fsum(self._manual.values())

    @property
    def auto_pool_proportion(self) -> float:
        """Share of VRAM split among auto members (0 when there are none)."""
        # rounded: 1 - 0.9 is 0.09999999999999998 in floats, and users read these numbers
        return _tidy(max(0.0, 1.0 - self.manual_pool_proportion)) if self._auto else 0.0

    def is_manual(self, key: Hashable) -> bool:
        """True if ``key`` has a manual proportion."""
        self._check_known(key)
        return key in self._manual

    def manual_proportion(self, key: Hashable) -> float | None:
        """``key``'s manual proportion, or None when it is in the auto pool."""
        self._check_known(key)
        return self._manual.get(key)

    def proportion(self, key: Hashable) -> float:
        """The share of VRAM ``key`` may use."""
        self._check_known(key)
        if key in self._manual:
            return self._manual[key]
        return _tidy(self.auto_pool_proportion / len(self._auto))

    def cap(self, key: Hashable) -> int:
        """The bytes ``key`` may use: ``floor(proportion * total)``."""
        return math.floor(self.proportion(key) * self.total)

    def group_cap(self, keys: Iterable[Hashable]) -> int:
        """Sum of the caps of ``keys``."""
        caps = self._caps
        if caps is None:  # read on every batch, changed rarely: worked out once per change
            caps = self._caps = {key: self.cap(key) for key in (*self._manual, *self._auto)}
        total = 0
        for key in keys:
            cap = caps.get(key)
            total += self.cap(key) if cap is None else cap  # an unknown key: cap() says so
        return total

    # -- changes -------------------------------------------------------------------------
    def add(self, key: Hashable, proportion: float | None = None) -> None:
        """Add ``key`` to the manual pool (with ``proportion``) or, if None, to the auto pool.

        Raises
        ------
        BudgetError
            If ``key`` is present, the proportion is outside (0, 1], or the change would
            overflow the budget or starve the auto pool.
        """
        if key in self:
            raise BudgetError(f"{key!r} already has a budget")
        if proportion is None:
            self._check_manual_sum(self.manual_pool_proportion, auto_members=len(self._auto) + 1)
            self._auto[key] = None
            self._changed()
        else:
            value = check_proportion(proportion)
            self._check_manual_sum(self.manual_pool_proportion + value, len(self._auto))
            self._manual[key] = value
            self._changed()

    def remove(self, key: Hashable) -> None:
        """Drop ``key``; the auto pool rebalances."""
        self._check_known(key)
        self._manual.pop(key, None)
        self._auto.pop(key, None)
        self._changed()

    def set_manual(self, key: Hashable, proportion: float) -> None:
        """Give ``key`` a manual ``proportion``, moving it out of the auto pool if needed."""
        self._check_known(key)
        value = check_proportion(proportion)
        others = math.fsum(p for k, p in self._manual.items() if k != key)
        auto_left = len(self._auto) - (key in self._auto)
        self._check_manual_sum(others + value, auto_left)
        self._auto.pop(key, None)
        self._manual[key] = value
        self._changed()

    def set_auto(self, key: Hashable) -> None:
        """Move ``key`` from the manual pool to the auto pool.

        Raises
        ------
        BudgetError
            If ``key`` is already in the auto pool.
        """
        self._check_known(key)
        if key in self._auto:
            raise BudgetError(f"{key!r} is already in the auto pool")
        others = math.fsum(p for k, p in self._manual.items() if k != key)
        self._check_manual_sum(others, len(self._auto) + 1)
        del self._manual[key]
        self._auto[key] = None
        self._changed()

    # -- helpers -------------------------------------------------------------------------
    def _changed(self) -> None:
        self._caps = None
        self.version += 1

    def _check_known(self, key: Hashable) -> None:
        if key not in self:
            raise BudgetError(f"{key!r} has no budget: register it first")

    def _check_manual_sum(self, manual: float, auto_members: int) -> None:
        if manual > 1.0 + _EPS:
            raise BudgetError(
                f"manual proportions would sum to {manual:.4g}, over 1 (already assigned: "
                f"{self.manual_pool_proportion:.4g}); lower a proportion or use the auto pool"
            )
        left = 1.0 - manual
        if left < MIN_AUTO_POOL - _EPS:
            message = (
                f"manual proportions would sum to {manual:.4g}, leaving {left:.4g} of VRAM for "
                f"the auto pool, under the {MIN_AUTO_POOL:g} minimum"
            )
            if auto_members:
                raise BudgetError(f"{message}, and {auto_members} auto member(s) need it")
            warn_at_caller(
                f"{message}: allowed while no member is in the auto pool, but a component registered "
                "later without a proportion will find too little room (give it a proportion, or lower these)"
            )


def group_available(
    mode: LimitMode, *, free: int, group_cap: int, group_held: int, group: str = "?", warn: bool = True
) -> int:
    """Bytes a stream group may use for its next batch.

    Passive mode: the device's free memory. Active mode: the group's cap (the sum of its
    members' caps) minus what its members hold, never more than the free memory; above 95%
    of the cap in use, an AiocubieWarning (unless ``warn`` is false).
    """
    if mode is LimitMode.PASSIVE:
        return max(0, free)
    if warn and group_cap > 0 and group_held > HIGH_USE_WARNING * group_cap:
        warn_at_caller(
            f"stream group {group!r} holds {group_held} of its {group_cap} bytes "
            f"({group_held / group_cap:.0%}): release arrays or raise its proportions"
        )
    return max(0, min(group_cap - group_held, free))
