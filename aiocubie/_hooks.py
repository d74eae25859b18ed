"""Hooks: the reclaim hooks an out-of-memory allocation calls, and the members' invalidate hooks.

Handed the registry (whose members hold their hooks) and the serving loop (async hooks run
as tasks of the manager). It owns the list of reclaim hooks that the device account reads; it
allocates nothing and never reaches back to the manager.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from ._errors import ConfigurationError, shown, warn
from ._recovery import ReclaimHook
from ._registry import Registry, await_hook, call_hook
from ._serving import Serving

__all__ = ["Hooks"]

log = logging.getLogger("aiocubie")


class Hooks:
    """Reclaim hooks (in the order added) and the calling of invalidate hooks.

    Parameters
    ----------
    registry : Registry
        The members, whose invalidate hooks are called on a context reset.
    serving : Serving
        Where async hooks run as tasks.
    """

    def __init__(self, registry: Registry, serving: Serving) -> None:
        self._registry = registry
        self._serving = serving
        #: Read live by the device account when an allocation is out of memory.
        self.reclaim: list[ReclaimHook] = []

    def add_reclaim(self, hook: ReclaimHook) -> None:
        """Call ``hook(nbytes)`` on out-of-memory (see ``PoolView.add_reclaim_hook``).

        Raises
        ------
        ConfigurationError
            If ``hook`` is not callable.
        """
        if not callable(hook):
            raise ConfigurationError(f"a reclaim hook must be callable as hook(nbytes), got {shown(hook)}")
        self.reclaim.append(hook)

    def remove_reclaim(self, hook: ReclaimHook) -> None:
        """Stop calling ``hook`` (nothing if it was not added)."""
        if hook in self.reclaim:
            self.reclaim.remove(hook)

    def invalidate(self) -> None:
        """Call every member's invalidate hook once: a plain one now, an async one as a task."""
        for member in list(self._registry.members.values()):
            hook = member.invalidate_hook  # None once the instance of a weakly held hook is gone
            if hook is None:
                continue
            what = f"invalidate hook of {member.name}"
            if member.invalidate_async:
                self._spawn(partial(call_hook, hook, (), what), what)
                continue
            try:
                result = hook()
            except Exception:
                log.exception("%s raised", what)
                continue
            if inspect.isawaitable(result):  # a plain callable that returned an awaitable
                self._spawn(partial(await_hook, result, what), what, result)

    def _spawn(self, run: Callable[[], Any], what: str, awaitable: object = None) -> None:
        """Run an async hook as a task of the manager; warn if the manager is not running."""
        if self._serving.spawn(run, name=f"aiocubie {what}"):
            return
        close = getattr(awaitable, "close", None)
        if close is not None:
            close()  # it cannot be awaited: spare the "never awaited" warning
        warn(
            f"{what} is async and the manager is not serving in this thread, so it was not run: "
            "reset the context inside `async with mgr`"
        )
