"""Dask integration: a worker plugin that gives each worker a MemoryManager on its GPU.

The only module that imports distributed (``pip install 'aiocubie[dask]'``). It schedules
nothing itself: Dask places tasks, each worker's manager serves the ``async def`` tasks that run
on that worker's event loop.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

try:
    from distributed import WorkerPlugin, get_worker
except ImportError as exc:
    raise ImportError(f"aiocubie.dask needs Dask's distributed ({exc}): pip install 'aiocubie[dask]'") from exc

from ._backends import Backend
from ._errors import ConfigurationError, ManagerStateError
from ._manager import MemoryManager
from ._options import parse_backend, parse_device

__all__ = ["PLUGIN_NAME", "ManagerPlugin", "get_manager"]

#: The name the plugin is registered under on each worker.
PLUGIN_NAME = "aiocubie"


class ManagerPlugin(WorkerPlugin):
    """A ``distributed.WorkerPlugin`` that runs a :class:`MemoryManager` on each worker.

    ``client.register_plugin(ManagerPlugin(mode="active", policy="wait"))`` builds a manager
    on every worker (and on workers that join later), runs it on the worker's event loop until
    the worker closes or the plugin is removed, then closes it, freeing what it handed out on
    that worker alone. Tasks reach it with :func:`get_manager`.

    Requests must be awaited by ``async def`` tasks: distributed runs those on the worker's
    event loop, the manager's loop. Plain functions run in the worker's threads, where awaiting
    a request fails (a manager serves its own loop's thread only).

    When Dask releases a running task that got its manager (``client.cancel``, or a dropped
    future), the plugin cancels the task: its pending request is withdrawn and what it was
    allocated while in flight is freed, as for any cancellation. Arrays a task's component
    still holds stay held until released or the component is collected.

    Parameters
    ----------
    device : int, optional
        Which GPU, among those the worker sees. None: 0, the first, which is the worker's own
        GPU when each worker has its own ``CUDA_VISIBLE_DEVICES`` (dask-cuda's
        LocalCUDACluster, or workers started with that variable set).
    backend : {"auto", "simulator", "cuda"}
        The backend each worker builds (a ``Backend`` instance cannot travel to workers).
    **options
        Passed to :class:`MemoryManager`: ``mode``, ``policy``, ``headroom``,
        ``batch_window``, ``allocator``, ``array_type``...

    Raises
    ------
    ConfigurationError
        For a backend that is not a name, or a device that is not an int >= 0 (on the client).
        Bad manager options fail the plugin's setup on the workers, where
        ``client.register_plugin`` reports them.

    Examples
    --------
    >>> client.register_plugin(ManagerPlugin(mode="active", policy="wait"))  # doctest: +SKIP
    >>> async def task(i):
    ...     mgr = get_manager()
    ...     ...
    >>> client.gather(client.map(task, range(8)))  # doctest: +SKIP
    """

    name = PLUGIN_NAME

    def __init__(self, *, device: int | None = None, backend: str = "auto", **options: Any) -> None:
        if isinstance(backend, Backend) or not isinstance(backend, str):
            raise ConfigurationError(
                f"backend must be a name ('auto', 'simulator', 'cuda'), got {backend!r}: each worker builds its own"
            )
        self.device = None if device is None else parse_device(device)  # None: the worker's first GPU
        self.backend = parse_backend(backend)
        self.options = options
        self.manager: MemoryManager | None = None
        self._closing: asyncio.Event | None = None
        self._serving: asyncio.Task[None] | None = None
        self._tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()

    def __getstate__(self) -> dict[str, Any]:
        # what travels to the workers: the settings, never a running manager
        return {"device": self.device, "backend": self.backend, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(device=state["device"], backend=state["backend"], **state["options"])  # type: ignore[misc]

    async def setup(self, worker: Any) -> None:
        """Build the worker's manager and start serving it on the worker's event loop."""
        manager = MemoryManager(self.backend, device=self.device or 0, **self.options)
        entered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        # The manager's task group must be entered and exited by one task that lives as long as
        # the manager: setup and teardown run in different tasks, so a task of our own holds it.
        self._serving = asyncio.create_task(self._serve(manager, entered, self._closing), name="aiocubie-manager")
        await entered
        self.manager = manager

    @staticmethod
    async def _serve(manager: MemoryManager, entered: asyncio.Future[None], closing: asyncio.Event) -> None:
        try:
            async with manager:
                entered.set_result(None)
                await closing.wait()
        except BaseException as exc:
            if entered.done():
                raise
            entered.set_exception(exc)

    async def teardown(self, worker: Any) -> None:
        """Close the worker's manager: fail its pending requests, free what it handed out."""
        serving, self._serving = self._serving, None
        self.manager = None
        if serving is not None and self._closing is not None:
            self._closing.set()
            await serving

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        """Cancel a running task that Dask released (``executing`` -> ``released``, which leaves
        it ``cancelled``: distributed lets a running task finish and drops its result).

        Only tasks that called :func:`get_manager` are watched; distributed names a task's
        asyncio task ``execute(<key>)``, which is how the plugin finds it.
        """
        if finish not in ("released", "cancelled") or start not in ("executing", "long-running"):
            return
        name = f"execute({key!r})"
        for task in list(self._tasks):
            if task.get_name() == name and not task.done():
                task.cancel()

    def _watch(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None:
            self._tasks.add(task)


def get_manager() -> MemoryManager:
    """The :class:`MemoryManager` of the Dask worker running the calling task.

    Call it from an ``async def`` task (it runs on the worker's event loop, where the manager
    serves requests). The task becomes cancellable by Dask (see :class:`ManagerPlugin`).

    Raises
    ------
    ManagerStateError
        Outside a task on a Dask worker, or on a worker without the plugin (register it with
        ``client.register_plugin(ManagerPlugin(...))``).
    """
    try:
        worker = get_worker()
    except ValueError as exc:
        raise ManagerStateError(
            "get_manager() gives a Dask worker's manager to a task running on that worker, and was called "
            f"outside one ({exc}): submit the code as a task (client.submit or client.map)"
        ) from exc
    plugin = worker.plugins.get(PLUGIN_NAME)
    if not isinstance(plugin, ManagerPlugin) or plugin.manager is None:
        raise ManagerStateError(
            f"worker {worker.address} has no aiocubie manager: register the plugin first, "
            "client.register_plugin(aiocubie.dask.ManagerPlugin(...))"
        )
    try:
        plugin._watch(asyncio.current_task())
    except RuntimeError:  # a plain function, in a worker thread: no task to cancel
        pass
    return plugin.manager
