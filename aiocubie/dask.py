"""Dask integration: a worker plugin that gives each worker a MemoryManager on its GPU.

The only module that imports distributed (``pip install 'aiocubie[dask]'``). It schedules
nothing itself: Dask places tasks, each worker's manager serves the ``async def`` tasks that run
on that worker's event loop.
"""

from __future__ import annotations

import asyncio
import os
import sys
import weakref
from typing import Any

try:
    from distributed import WorkerPlugin, get_worker
except ImportError as exc:
    raise ImportError(f"aiocubie.dask needs Dask's distributed ({exc}): pip install 'aiocubie[dask]'") from exc

from ._backends import Backend
from ._errors import ConfigurationError, ManagerStateError
from ._manager import MemoryManager
from ._names import parse_backend, parse_device

__all__ = ["BUDGETS", "PLUGIN_NAME", "ManagerPlugin", "get_manager"]

#: The name the plugin is registered under on each worker.
PLUGIN_NAME = "aiocubie"
#: Where a worker's manager takes its budget from (``ManagerPlugin(budget=...)``): the whole
#: device, the maximum size of dask-cuda's RMM pool, or dask-cuda's ``device_memory_limit``.
BUDGETS = ("device", "rmm_maximum_pool_size", "device_memory_limit")


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
    budget : {"device", "rmm_maximum_pool_size", "device_memory_limit"}
        The device bytes each worker's manager budgets (its ``memory_limit``; caps are
        proportions of it). ``"device"`` (the default): the whole GPU.
        ``"rmm_maximum_pool_size"``: the maximum size of the RMM pool dask-cuda's RMM plugin
        installed on the worker (``LocalCUDACluster(rmm_pool_size=..., rmm_maximum_pool_size=...)``,
        or ``rmm_async=True`` with ``rmm_maximum_pool_size``). ``"device_memory_limit"``: the
        worker's dask-cuda ``device_memory_limit``, where Dask starts spilling device data to the
        host. Read on each worker at setup; a worker without it fails the setup, saying what
        to start the cluster with.
    **options
        Passed to :class:`MemoryManager`: ``mode``, ``policy``, ``headroom``,
        ``batch_window``, ``allocator``, ``array_type``, ``memory_limit`` (bytes, with the
        default ``budget`` only)...

    Raises
    ------
    ConfigurationError
        For a backend that is not a name, a device that is not an int >= 0, a budget not in
        :data:`BUDGETS`, or a budget with ``memory_limit`` (on the client). Bad manager
        options fail the plugin's setup on the workers, where ``client.register_plugin``
        reports them.

    Notes
    -----
    Under dask-cuda (``LocalCUDACluster`` or ``dask cuda worker``), register the plugin with
    ``client.register_plugin`` once the cluster is up. dask-cuda's own plugins (its RMM
    plugin among them) are set up as each worker starts, before it joins the scheduler, and
    plugins registered through the client after that, on workers that join later too. With
    ``allocator="rmm"`` the manager then wraps the RMM resource dask-cuda installed (its pool,
    ``rmm_async``'s ``CudaAsyncMemoryResource``), never replacing it. A plugin set up on a
    worker whose dask-cuda RMM plugin has not run yet (passed with the worker's own plugins)
    fails its setup: that RMM plugin would replace the resource under the manager.

    Examples
    --------
    Needs a Dask cluster with a GPU a worker (not run by the doctests):

    >>> client.register_plugin(ManagerPlugin(mode="active", policy="wait"))  # doctest: +SKIP
    >>> async def task(i):
    ...     mgr = get_manager()
    ...     ...
    >>> client.gather(client.map(task, range(8)))  # doctest: +SKIP
    """

    name = PLUGIN_NAME

    def __init__(
        self, *, device: int | None = None, backend: str = "auto", budget: str = "device", **options: Any
    ) -> None:
        if isinstance(backend, Backend) or not isinstance(backend, str):
            raise ConfigurationError(
                f"backend must be a name ('auto', 'simulator', 'cuda'), got {backend!r}: each worker builds its own"
            )
        if not isinstance(budget, str) or budget not in BUDGETS:
            raise ConfigurationError(f"unknown budget {budget!r}: use one of {', '.join(map(repr, BUDGETS))}")
        if budget != "device" and options.get("memory_limit") is not None:
            raise ConfigurationError(
                f"budget={budget!r} and memory_limit={options['memory_limit']!r} both say what each worker's "
                "manager budgets: pass one"
            )
        self.device = None if device is None else parse_device(device)  # None: the worker's first GPU
        self.backend = parse_backend(backend)
        self.budget = budget
        self.options = options
        self.manager: MemoryManager | None = None
        self._closing: asyncio.Event | None = None
        self._serving: asyncio.Task[None] | None = None
        self._tasks: weakref.WeakSet[asyncio.Task[Any]] = weakref.WeakSet()

    def __getstate__(self) -> dict[str, Any]:
        # what travels to the workers: the settings, never a running manager
        return {"device": self.device, "backend": self.backend, "budget": self.budget, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            device=state["device"], backend=state["backend"], budget=state["budget"], **state["options"]
        )

    async def setup(self, worker: Any) -> None:
        """Build the worker's manager and start serving it on the worker's event loop.

        Raises
        ------
        ConfigurationError
            Where the worker's dask-cuda RMM plugin has not run yet (with ``allocator="rmm"``
            or ``budget="rmm_maximum_pool_size"``), or the budget asked for is not there.
        """
        options = dict(self.options)
        allocator = options.get("allocator") or os.environ.get("AIOCUBIE_ALLOCATOR", "").strip()
        if allocator == "rmm" or self.budget == "rmm_maximum_pool_size":
            _rmm_setup(worker)  # the order check: dask-cuda's RMM plugin first
        if self.budget != "device":
            options["memory_limit"] = _budget_of(worker, self.budget)
        manager = MemoryManager(self.backend, device=self.device or 0, **options)
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


def _is_rmm_setup(plugin: object) -> bool:
    """Whether ``plugin`` is dask-cuda's RMM plugin (without importing dask-cuda: an instance means it is imported)."""
    plugins = sys.modules.get("dask_cuda.plugins")
    return plugins is not None and isinstance(plugin, plugins.RMMSetup)


def _rmm_setup(worker: Any) -> Any | None:
    """The dask-cuda RMM plugin that has set up ``worker``'s RMM resource; None on a worker without one.

    Raises
    ------
    ConfigurationError
        When the worker has one still to set up (aiocubie's plugin was passed with the worker's
        own plugins, and came first): it would replace the RMM resource under the manager.
    """
    for plugin in worker.plugins.values():
        if _is_rmm_setup(plugin):  # in worker.plugins: set up (distributed adds it, then runs its setup at once)
            return plugin
    # distributed sets a worker's own plugins up together as it starts; what is left is still pending
    if any(_is_rmm_setup(plugin) for plugin in getattr(worker, "_pending_plugins", ())):
        raise ConfigurationError(
            f"aiocubie's plugin is being set up on worker {worker.address} before dask-cuda's RMM plugin, which "
            "would then replace the RMM resource under the manager: register aiocubie's plugin once the cluster "
            "is up, client.register_plugin(aiocubie.dask.ManagerPlugin(...)), not with the workers' own plugins"
        )
    return None


def _budget_of(worker: Any, budget: str) -> int:
    """The device bytes ``budget`` (one of :data:`BUDGETS` but ``"device"``) names on ``worker``.

    Raises
    ------
    ConfigurationError
        When the worker does not have it, saying what to start the cluster with.
    """
    if budget == "rmm_maximum_pool_size":
        plugin = _rmm_setup(worker)
        if plugin is None:
            raise ConfigurationError(
                f"budget='rmm_maximum_pool_size' but worker {worker.address} has no dask-cuda RMM plugin: start it "
                "with dask-cuda, LocalCUDACluster(rmm_pool_size=..., rmm_maximum_pool_size=...) or `dask cuda "
                "worker --rmm-pool-size ... --rmm-maximum-pool-size ...`; or pass memory_limit=BYTES"
            )
        pooled = plugin.async_alloc or plugin.initial_pool_size is not None  # else dask-cuda installs no pool
        maximum = plugin.maximum_pool_size if pooled else None
        size = _bytes(maximum)
        if size is None:
            raise ConfigurationError(
                f"budget='rmm_maximum_pool_size' but the RMM pool dask-cuda set up on worker {worker.address} has "
                f"no maximum size (rmm_pool_size={plugin.initial_pool_size!r}, rmm_async={plugin.async_alloc!r}, "
                f"rmm_maximum_pool_size={maximum!r}): start the cluster with rmm_maximum_pool_size=... and "
                "rmm_pool_size=... or rmm_async=True; or use budget='device_memory_limit' or memory_limit=BYTES"
            )
        return size
    assert budget == "device_memory_limit", budget
    data = worker.data
    limit = _bytes(getattr(getattr(getattr(data, "device_buffer", None), "fast", None), "n", None))  # dask-cuda's LRU
    if limit is None:
        raise ConfigurationError(
            f"budget='device_memory_limit' but worker {worker.address} has no device memory limit (its data is a "
            f"{type(data).__name__}; dask-cuda's DeviceHostFile with a limit has one): start it with "
            "LocalCUDACluster(device_memory_limit=...) or `dask cuda worker --device-memory-limit ...`; or pass "
            "memory_limit=BYTES"
        )
    return limit


def _bytes(value: object) -> int | None:
    """``value`` as a whole number of bytes >= 1; None for anything else (None, 0, a string not parsed)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
        return int(value)
    return None


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
