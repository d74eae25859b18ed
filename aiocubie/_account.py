"""What a group's scheduler uses of the device account: :class:`Account`, a protocol.

:class:`~aiocubie._accounting.DeviceAccount` is the one account there is; the schedulers are
handed it and typed against this protocol, so that they stand beside the account rather than on
it. Typing only: nothing here runs on the request path.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any, Protocol

from ._broker.client import BrokerLease
from ._budget import Budget
from ._ledger import Allocation, Ledger
from ._options import Options
from ._planner import ChunkPlan
from ._protocols import Event, RequestLog, StreamLike
from ._requests import ArrayResponse, RequestSet
from ._spill import Spills
from ._stats import RecoveryStats

__all__ = ["Account", "RecoverySteps"]


class RecoverySteps(Protocol):
    """What a scheduler uses of the account's recovery: the steps taken so far, and the one
    seam it awaits before a batch that does not fit whole waits, chunks or fails."""

    @property
    def stats(self) -> RecoveryStats:
        """The recovery steps taken so far (reclaim hook calls among them)."""

    @property
    def can_make_room(self) -> bool:
        """True if :meth:`make_room` may free something (an async reclaim hook is registered)."""

    async def make_room(self, nbytes: int, priority: int, group: str, timeout: float) -> int:
        """Try to free ``nbytes`` for a batch of ``priority`` in ``group`` before it waits, chunks or fails."""


class Account(Protocol):
    """The device account as a scheduler uses it (see :class:`~aiocubie._accounting.DeviceAccount`)."""

    @property
    def options(self) -> Options:
        """The manager's options (the batch window, the policy, ...)."""

    @property
    def history(self) -> RequestLog | None:
        """Where requests' way, batches' waits and failures are recorded (None: nowhere)."""

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

    @property
    def lease(self) -> BrokerLease | None:
        """The node broker's lease (None: no broker)."""

    def lease_shortfall(self, nbytes: int) -> int:
        """Bytes the lease lacks for a batch of ``nbytes`` to be offered them whole (0: none lacking, or no lease)."""

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
