"""The waiting line: batches waiting for memory across stream groups, higher priority first.

Pure bookkeeping (no event loop, no device): the schedulers join it with a batch that does not
fit (its priority and when its oldest request came), ask whether another batch goes first, and
leave it; whoever wakes them is handed in. The order is :mod:`aiocubie._priority`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from ._priority import outranks

__all__ = ["WaitingLine"]


class WaitingLine:
    """The batches waiting for memory (passive mode, policy wait): a batch is served only when none goes first.

    Among waiting batches, the higher effective priority goes first (see
    :func:`~aiocubie._priority.rank`), then the one whose oldest request came first. A batch
    not in the line (it fits now) is held back only by a waiter of another priority that
    outranks it (:func:`~aiocubie._priority.outranks`): within one priority, a batch that fits
    is served, as it always was.

    Parameters
    ----------
    on_head_left : callable
        Called with no argument when a batch leaves and others wait: the next one may fit now.
    """

    def __init__(self, on_head_left: Callable[[], None]) -> None:
        #: batch -> (its priority, when its oldest request came); read on every inline request
        self.entries: dict[Hashable, tuple[int, float]] = {}
        self._on_head_left = on_head_left

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, batch: Hashable) -> bool:
        return batch in self.entries

    def join(self, batch: Hashable, priority: int, since: float) -> None:
        """``batch`` (of ``priority``, its oldest request come at ``since``) waits; a batch in line keeps its place."""
        if batch not in self.entries:
            self.entries[batch] = (priority, since)

    def ahead(self, batch: Hashable, priority: int, since: float, now: float, aging: float | None) -> bool:
        """True if another batch goes before ``batch`` (of ``priority``, come at ``since``), as of ``now``."""
        waiting = batch in self.entries
        mine = (priority, since)
        for other, theirs in self.entries.items():
            if other is batch:
                continue
            if waiting and theirs[0] == priority:  # one priority: first come, first served
                if theirs[1] < since:
                    return True
            elif outranks(theirs, mine, now, aging):
                return True
        return False

    def first(self, batch: Hashable, now: float = 0.0, aging: float | None = None) -> bool:
        """True if no other waiting batch goes before ``batch`` (in line; the line may be empty)."""
        entry = self.entries.get(batch)
        return entry is None or not self.ahead(batch, *entry, now, aging)

    def leave(self, batch: Hashable) -> None:
        """``batch`` was served or withdrawn (nothing if it is not in line): the rest check again.

        Any batch may have gone first (aging moves the order as time passes), so every leave
        with batches still waiting wakes them; a batch that finds another still ahead waits on.
        """
        if self.entries.pop(batch, None) is not None and self.entries:
            self._on_head_left()
