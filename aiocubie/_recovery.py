"""Out-of-memory recovery: free the pool's cached blocks, then call the reclaim hooks, then give up clearly.

Also the one place a scheduler awaits before a batch that does not fit whole waits, chunks or
fails (:meth:`Recovery.make_room`: the async reclaim hooks, with a deadline). Handed what it frees
through (the resource) and how to try again, on each call: it holds only the hooks, the steps
taken so far and whether hooks are running. It allocates nothing itself and knows nothing of the
ledger, the schedulers or the manager.
"""

from __future__ import annotations

import inspect
import logging
import numbers
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

import anyio
import attrs

from ._backends import MemoryResource
from ._errors import ManagerStateError, OutOfMemoryError
from ._protocols import RecoveryLog, is_async_callable
from ._stats import RecoveryStats, format_bytes

__all__ = ["RECLAIM_MAY", "ReclaimHook", "Recovery"]

log = logging.getLogger("aiocubie")

T = TypeVar("T")

#: A reclaim hook: called with the bytes an allocation needs, it frees what it can (releases
#: arrays, spills) and returns the bytes it freed, or None if it cannot say. A plain one runs on
#: the allocation's path when the device is out of memory: it may release (``release``,
#: ``free``, ``free_all``, ``unregister``, ``groups.move``); it may not allocate or reset the
#: context (see :meth:`Recovery.refuse_in_reclaim`). An ``async def`` one is awaited by the
#: group's task before a batch that does not fit whole waits, chunks or fails
#: (:meth:`Recovery.make_room`).
ReclaimHook = Callable[[int], "int | Awaitable[int | None] | None"]

#: What a reclaim hook may call, named in the refusal of anything else.
RECLAIM_MAY = "mgr.release, mgr.free, mgr.free_all, mgr.unregister and mgr.groups.move"


class Recovery:
    """The out-of-memory recovery of one account.

    Parameters
    ----------
    hooks : list of callable
        The reclaim hooks, called in order (see :data:`ReclaimHook`); read live.

    Attributes
    ----------
    stats : RecoveryStats
        The recovery steps taken so far.
    history : RecoveryLog or None
        Where recovery steps are recorded (None: nowhere).
    """

    def __init__(self, hooks: list[ReclaimHook]) -> None:
        self.hooks = hooks
        self.stats = RecoveryStats()
        self.history: RecoveryLog | None = None
        self.reclaiming: str | None = None  # while hooks run: the allocation they run for
        self._refusal: ManagerStateError | None = None  # the last refusal raised inside a hook
        self._thread = threading.get_ident()  # where hooks may run for other libraries' failures

    def refuse_in_reclaim(self, call: str) -> None:
        """Raise if reclaim hooks are running: ``call`` (``"set_allocator()"``, ...) may not run in one.

        A reclaim hook runs on an allocation's path, between its tries: it may release memory;
        allocating would enter recovery again (and again), and a context reset would pull the
        device and the streams from under the allocation it runs for.

        Raises
        ------
        ManagerStateError
            Naming the call, the allocation the hooks run for and what a hook may call. Not
            caught by the recovery: the batch fails with it (unless the hook catches it).
        """
        if self.reclaiming is None:
            return
        self._refusal = ManagerStateError(
            f"{call} from a reclaim hook: the hook runs because {self.reclaiming}, and may only release "
            f"memory ({RECLAIM_MAY}); it may not allocate or reset the context. Do that after the "
            "request, outside the hook"
        )
        raise self._refusal

    def for_batch(
        self,
        retry: Callable[[], T],
        resource: MemoryResource,
        error: OutOfMemoryError,
        *,
        group: str,
        asked: int,
        batch: str,
        cap: int,
        held: Callable[[], str],
    ) -> T:
        """A batch of ``group`` found no room for ``asked`` bytes: free the cache, call the hooks, ``retry``.

        ``batch`` describes it (requests, chunks), ``cap`` bounds what a hook may say it freed, and
        ``held`` says what is held where, for the error.

        Raises
        ------
        OutOfMemoryError
            When neither step made room: what was asked, what is held and what to do.
        ManagerStateError
            When a hook called what a hook may not (see :meth:`refuse_in_reclaim`).
        """
        history = self.history
        self._count(out_of_memory=1)
        log.warning(
            "group %r: out of memory for %s (%s): freeing the pool's cached blocks", group, format_bytes(asked), error
        )
        freed = resource.release_cached()
        self._count(cache_releases=1, cache_bytes_freed=freed)
        if history is not None:
            history.recovery(group, freed, "released the pool's cached blocks")
        try:
            return self._retried(retry, group)
        except OutOfMemoryError as exc:
            error = exc
        hooks = self._plain()
        if hooks:
            reclaimed = self._call_hooks(
                hooks, asked, group, f"group {group!r} is out of memory for {format_bytes(asked)} ({batch})", cap
            )
            log.warning("group %r: %d reclaim hook(s) freed %s", group, len(hooks), format_bytes(reclaimed))
            try:
                return self._retried(retry, group)
            except OutOfMemoryError as exc:
                error = exc
        self._count(failed=1)
        message = (
            f"out of memory: group {group!r} asked for {format_bytes(asked)} ({batch}); releasing "
            f"{format_bytes(freed)} of cached pool blocks and calling {len(hooks)} reclaim hook(s) did not make "
            f"room. {held()}. Release arrays (mgr.release, mgr.free), ask for fewer runs, or register a reclaim "
            f"hook that frees or spills (mgr.pool.add_reclaim_hook). The device said: {error}"
        )
        log.error("%s", message)
        if history is not None:
            history.failure(group, asked, error)
            history.dump()
        raise OutOfMemoryError(message) from error

    def for_library(self, nbytes: int, resource: MemoryResource, cap: int) -> bool:
        """Another library's allocation of ``nbytes`` found no room in the shared pool: run the recovery.

        Releases the pool's cached blocks and calls the reclaim hooks (as for aiocubie's own
        batches); True when they freed something, so the library's allocation is tried again.
        Runs only in the thread the recovery was made in (the event loop's) and never inside a
        recovery already running: elsewhere it returns False and the library sees its own
        out-of-memory error.
        """
        if self.reclaiming is not None or threading.get_ident() != self._thread:
            return False
        what = f"another library's allocation of {format_bytes(nbytes)} found no room in the shared pool"
        self._count(out_of_memory=1)
        in_use = resource.pool_facts().in_use
        log.warning("%s: freeing the pool's cached blocks and calling the reclaim hooks", what)
        freed = resource.release_cached()
        self._count(cache_releases=1, cache_bytes_freed=freed)
        hooks, reclaimed = self._plain(), 0
        if hooks:
            try:
                reclaimed = self._call_hooks(hooks, nbytes, "(other libraries)", what, cap)
            except ManagerStateError:
                return False
        # the library retries while this says True: trust what left the pool, not what hooks say
        # they freed (a hook that says so and frees nothing would have it retry forever)
        after = resource.pool_facts().in_use
        if in_use is not None and after is not None:
            reclaimed = in_use - after
        if freed + reclaimed > 0:
            # counted as recovered so that out_of_memory == recovered + failed holds: a retry that
            # finds no room again comes back here as an out-of-memory of its own
            self._count(recovered=1)
            return True
        self._count(failed=1)
        return False

    def _plain(self) -> list[ReclaimHook]:
        """The hooks called on the allocation's path: the plain ones (async ones are :meth:`make_room`'s)."""
        return [hook for hook in self.hooks if not is_async_callable(hook)]

    @property
    def can_make_room(self) -> bool:
        """True if :meth:`make_room` has something to await (an async reclaim hook)."""
        return any(is_async_callable(hook) for hook in self.hooks)

    async def make_room(self, nbytes: int, priority: int, group: str, timeout: float) -> int:
        """Await the async reclaim hooks, in order, for a batch of ``group`` that lacks ``nbytes``.

        Called by the group's task before a batch that does not fit whole waits, chunks or fails
        (``priority`` is the batch's: what would spill for it must not be of a higher one). The
        round ends after ``timeout`` seconds: the hook awaited then is cancelled and logged, the
        rest are not called. A hook that raises is logged and skipped. Returns the bytes the
        hooks say they freed (the scheduler plans again on what the device says, not on this).
        Cancelled itself (the manager closes), it cancels the hook it awaits and lets that through.
        """
        hooks = [hook for hook in self.hooks if is_async_callable(hook)]
        what = f"group {group!r} lacks {format_bytes(nbytes)} for a batch of priority {priority}"
        called = reclaimed = 0
        with anyio.move_on_after(timeout) as deadline:
            for hook in hooks:
                called += 1
                try:
                    freed = await cast("Awaitable[int | None]", hook(nbytes))
                except Exception:
                    log.exception("async reclaim hook %r raised (%s); going on with the next one", hook, what)
                    continue
                reclaimed += self._said(hook, freed, group)
        if deadline.cancelled_caught:
            log.warning(
                "async reclaim hook %r took longer than reclaim_timeout=%ss (%s): the batch goes on without it",
                hooks[called - 1],
                timeout,
                what,
            )
        self._count(hook_calls=called, hook_bytes_freed=reclaimed, hook_timeouts=int(deadline.cancelled_caught))
        return reclaimed

    def _call_hooks(self, hooks: list[ReclaimHook], nbytes: int, group: str, why: str, cap: int) -> int:
        """Call ``hooks`` in order for ``why``; the bytes they say they freed (a refusal fails the batch)."""
        self.reclaiming = why
        called = reclaimed = 0
        try:
            for hook in hooks:
                called += 1
                reclaimed += self._call(hook, nbytes, group, cap)
        except ManagerStateError as refused:  # a hook called what it may not: the batch fails with that
            self._count(hook_calls=called, failed=1)
            log.error("group %r: %s", group, refused)
            raise
        finally:
            self.reclaiming = self._refusal = None
        self._count(hook_calls=len(hooks), hook_bytes_freed=reclaimed)
        return reclaimed

    def _retried(self, retry: Callable[[], T], group: str) -> T:
        result = retry()
        self._count(recovered=1)
        log.warning("group %r: allocation recovered from out of memory", group)
        return result

    def _call(self, hook: ReclaimHook, nbytes: int, group: str, cap: int) -> int:
        """Call one reclaim hook; the bytes it says it freed (0 if it failed or cannot say)."""
        try:
            freed = hook(nbytes)
        except Exception as exc:
            if exc is self._refusal:  # it called what a hook may not: not a hook's ordinary failure
                raise
            log.exception("reclaim hook %r raised; going on with the next step", hook)
            return 0
        if inspect.isawaitable(freed):  # not awaited on the allocation path: refuse it loudly
            getattr(freed, "close", lambda: None)()
            log.error(
                "reclaim hook %r returned an awaitable: a hook called on the allocation's path must be a "
                "plain function (an `async def` hook is awaited before a batch waits, chunks or fails)",
                hook,
            )
            return 0
        return self._said(hook, freed, group, cap)

    def _said(self, hook: object, freed: object, group: str, cap: int | None = None) -> int:
        """What ``hook`` says it freed: a whole number of bytes (numpy's too), at most ``cap``, recorded;
        anything else (None, True, a float, a negative number) counts as "cannot say": 0."""
        said = int(freed) if isinstance(freed, numbers.Integral) and not isinstance(freed, bool) else 0
        nbytes = max(said, 0) if cap is None else min(max(said, 0), cap)
        if self.history is not None:
            self.history.recovery(group, nbytes, f"reclaim hook {getattr(hook, '__qualname__', hook)!r}")
        return nbytes

    def _count(self, **steps: int) -> None:
        self.stats = attrs.evolve(self.stats, **{name: getattr(self.stats, name) + n for name, n in steps.items()})
