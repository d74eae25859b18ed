"""While a manager serves: its event loop and the task group that owns its tasks.

One small holder, handed to the components that start tasks or wait on the loop (the stream
groups' schedulers, async hooks, copies). The manager fills it on entering ``async with`` and
empties it on closing; nothing else writes it. It knows no manager, scheduler or device.
"""

from __future__ import annotations

from collections.abc import Callable
from threading import get_ident
from typing import Any

import anyio
import anyio.abc

from ._completion import Loop

__all__ = ["Serving"]


class Serving:
    """The loop and task group a manager serves in; all None while it does not serve.

    Attributes
    ----------
    loop : Loop or None
        The running loop's primitives, between ``__aenter__`` and ``aclose``.
    task_group : TaskGroup or None
        Owns the schedulers' and async hooks' tasks; entered and exited by one task.
    owner : int or None
        The id of that task.
    """

    __slots__ = ("loop", "owner", "task_group")

    def __init__(self) -> None:
        self.loop: Loop | None = None
        self.task_group: anyio.abc.TaskGroup | None = None
        self.owner: int | None = None

    async def enter(self) -> Loop:
        """Open the task group in the calling task (its owner) and take the running loop."""
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        loop = Loop()
        self.task_group, self.loop, self.owner = task_group, loop, anyio.get_current_task().id
        return loop

    async def exit(self) -> None:
        """End the tasks and leave the task group, from its owner (from any other task: nothing).

        Only the task that entered a task group may exit it: the owner does when it leaves.
        """
        task_group = self.task_group
        if task_group is None or anyio.get_current_task().id != self.owner:
            return
        self.task_group = self.owner = None
        # the task group's scope is the innermost one here: shielded, a cancellation of the
        # caller cannot cut the wait for the scheduler and hook tasks short (it is delivered
        # at the caller's next checkpoint); cancelled, it ends those tasks
        task_group.cancel_scope.shield = True
        task_group.cancel_scope.cancel()
        await task_group.__aexit__(None, None, None)

    def here(self) -> Loop | None:
        """The loop, when serving and called from its thread (else None)."""
        loop = self.loop
        return loop if loop is not None and loop.thread == get_ident() else None

    def spawn(self, run: Callable[..., Any], *args: Any, name: str) -> bool:
        """Start ``run(*args)`` as a task of the manager; False (nothing started) when not serving here."""
        if self.task_group is None or self.here() is None:
            return False
        self.task_group.start_soon(run, *args, name=name)
        return True
