"""What a group's scheduler uses of the device account: :class:`Account`, a protocol.

:class:`~aiocubie._accounting.DeviceAccount` is the one account there is; the schedulers are
handed it and typed against this protocol, so that they stand beside the account rather than on
it. Typing only: nothing here runs on the request path.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any, Protocol

from ._budget import Budget
from ._ledger import Allocation, Ledger
from ._options import Options
from ._planner import ChunkPlan
from ._protocols import Event, RecoveryLog, StreamLike
from ._requests import ArrayResponse, RequestSet
from ._spill import Spills
from ._stats import RecoveryStats

__all__ = ["Account", "RecoverySteps"]


class RecoverySteps(Protocol):
    """What a scheduler reads of the account's out-of-memory recovery: the steps taken so far."""

    @property
    def stats(self) -> RecoveryStats:
        """The recovery steps taken so far (reclaim hook calls among them)."""


class Account(Protocol):
    """The device account as a scheduler uses it (see :class:`~aiocubie._accounting.DeviceAccount`)."""

    @property
    def options(self) -> Options:
        """The manager's options (the batch window, the policy, ...)."""

    @property
    def history(self) -> RecoveryLog | None:
        """Where a batch's failure is recorded (None: nowhere)."""

    @property
    def ledger(self) -> Ledger:
        """What is held, by whom."""

    @property
    def budget(self) -> Budget:
        """The shares and caps of the members and groups."""

    @property
    def spills(self) -> Spills | None:
        """Spilling (None: nothing spills)."""

    @property
    def recovery(self) -> RecoverySteps:
        """The out-of-memory recovery."""

    def free_memory(self, *, fresh: bool) -> int:
        """Free device memory: a recent reading, or (``fresh``) a new one."""

    def offered(self, members: Collection[Hashable], free: int, *, as_if_empty: bool = False) -> int:
        """Bytes the next batch of a group of ``members`` may take."""

    def allocate(
        self,
        entries: Sequence[tuple[Hashable, RequestSet]],
        group: str,
        plan: ChunkPlan,
        stream: StreamLike,
        copy_streams: Callable[[], tuple[StreamLike, StreamLike]] | None = None,
    ) -> tuple[list[ArrayResponse], Event]:
        """Allocate every array of a batch with ``plan``'s shapes (all or nothing); the responses and their event."""

    def respond(
        self,
        requests: RequestSet,
        allocations: list[Allocation],
        plan: ChunkPlan,
        stream: StreamLike,
        vram: int = 0,
        ready: Event | None = None,
        copy_streams: Callable[[], tuple[Any, Any]] | None = None,
    ) -> ArrayResponse:
        """The response for ``allocations`` (none: an empty response)."""

    def release(self, response: ArrayResponse | None) -> bool:
        """Free the arrays of ``response``; whether it held them (False: it holds none, was released, or is not this account's)."""
