"""What a group's batch leases from the node broker before it is planned (``broker=PATH``).

A scheduler holds one :class:`BatchLease` when its account has a broker's lease: it says when a batch
the lease does not cover must lease first, and leases as the policy says, in the group's task. It knows
no tickets and no socket: the account's lease does the talking.
"""

from __future__ import annotations

import anyio

from ._account import Account
from ._options import Policy
from ._planner import ChunkPlan
from ._policy import Totals

__all__ = ["BatchLease"]


class BatchLease:
    """The lease a group's batch lacks, and the wait for it (a manager without a broker lacks none).

    Attributes
    ----------
    short : tuple of int or None
        The bytes to lease for the batch whole, and for one run of it (None: nothing to lease).
    """

    __slots__ = ("_account", "_capped", "_leased", "_scope", "short")

    def __init__(self, account: Account) -> None:
        self._account = account
        self.short: tuple[int, int] | None = None
        self._leased = False  # it just leased: plan against what there is (chunk, or decide)
        self._capped = False  # and got less than it asked: the broker could never give more
        self._scope: anyio.CancelScope | None = None

    def lacks(self, totals: Totals, plan: ChunkPlan | None) -> bool:
        """True if a batch of ``totals`` whose ``plan`` now is not whole must lease first (see :attr:`short`)."""
        self.short = None
        if self._account.lease is None:
            return False
        if self._leased:  # leased for this plan already: what there is now is what there is (if a run fits)
            self._leased = False
            if plan is not None or self._capped:  # capped: the broker could give no more; the policy decides
                return False
        account = self._account
        whole = account.lease_shortfall(totals.fixed + totals.per_run * totals.runs)
        if whole:
            self.short = (whole, account.lease_shortfall(totals.fixed + totals.per_run))
        return bool(whole)

    async def take(self, priority: int = 0) -> None:
        """Lease what the batch lacks, as the policy says; then it is planned against the lease.

        ``wait`` waits for the whole batch's bytes (priority, then first come first served across the
        node; at most the node budget); ``chunk`` (and ``fail`` in passive mode) waits for one run's and
        takes what there is beyond; ``fail`` in active mode takes them whole now or fails.

        ``priority``: the batch's (a batch holds requests of one priority).

        Raises
        ------
        LeaseError
            If the broker cannot lease them (not ``wait``).
        BrokerError
            If the broker cannot be reached.
        """
        assert self.short is not None
        (whole, one_run), self.short = self.short, None
        lease, options = self._account.lease, self._account.options
        assert lease is not None
        fails = options.policy is Policy.FAIL and options.active
        granted = 0
        with anyio.CancelScope() as scope:
            self._scope = scope
            least = whole if fails or options.waits else one_run
            granted = await lease.grow(least, whole, wait=not fails, priority=priority)
        self._scope = None
        self._leased = not scope.cancelled_caught  # withdrawn from the wait: lease again if need be
        # under least: the broker capped the wait at what this client's share or the budget could ever give
        self._capped = self._leased and granted < least

    def again(self) -> None:
        """The batch changed while it waits for a lease: stop waiting (it is planned again)."""
        if self._scope is not None:
            self._scope.cancel()

    def reset(self) -> None:
        """The batch was served or ended: forget what it lacked."""
        self.short, self._leased, self._capped = None, False, False
