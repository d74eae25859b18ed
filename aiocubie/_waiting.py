"""The waiting line: batches waiting for memory, first come first served across stream groups.

Pure bookkeeping (no event loop, no device): the schedulers join it with a batch that does not
fit, ask whether an earlier batch waits, and leave it; whoever wakes them is handed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable

__all__ = ["WaitingLine"]


class WaitingLine:
    """One FIFO of waiting batches (passive mode, policy wait): a batch is served only at its head.

    Parameters
    ----------
    on_head_left : callable
        Called with no argument when the batch at the head leaves: the next one may fit now.
    """

    def __init__(self, on_head_left: Callable[[], None]) -> None:
        self._line: deque[Hashable] = deque()
        self._on_head_left = on_head_left

    def __len__(self) -> int:
        return len(self._line)

    def __contains__(self, batch: Hashable) -> bool:
        return batch in self._line

    def join(self, batch: Hashable) -> None:
        """``batch`` waits, behind every batch that waits already (nothing if it is in line)."""
        if batch not in self._line:
            self._line.append(batch)

    def first(self, batch: Hashable) -> bool:
        """True if no other batch waits ahead of ``batch`` (it is at the head, or the line is empty)."""
        return not self._line or self._line[0] is batch

    def leave(self, batch: Hashable) -> None:
        """``batch`` was served or withdrawn (nothing if it is not in line)."""
        line = self._line
        if not line:
            return
        if line[0] is batch:
            line.popleft()
            if line:
                self._on_head_left()
        else:
            try:
                line.remove(batch)
            except ValueError:
                pass
