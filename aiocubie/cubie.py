"""cubie's solvers on aiocubie's memory: a cubie 0.17 ``MemoryManager`` backed by an aiocubie manager.

The only module that knows cubie's API (the ``cubie`` extra). It uses aiocubie's public API only,
and keeps cubie's own bookkeeping (registrations, streams, host and pinned arrays) where cubie's
solver reads it; device arrays, budgets, chunk plans and stats are aiocubie's.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import numpy as np
from cubie.memory import mem_manager as _cubie
from cubie.memory.array_requests import ArrayRequest as CubieRequest
from cubie.memory.array_requests import ArrayResponse as CubieResponse

import aiocubie

__all__ = ["CUBIE_GRANULE", "CUBIE_HEADROOM", "CubieMemoryManager", "solve"]

_T = TypeVar("_T")
_P = ParamSpec("_P")

#: cubie's CUDA simulator swaps module globals while a kernel runs: one simulated solve at a time.
_SIMULATOR = threading.Lock()

#: cubie's chunk headroom (``CHUNK_HEADROOM_FRACTION``): a manager made here plans with it.
CUBIE_HEADROOM = _cubie.CHUNK_HEADROOM_FRACTION
#: cubie's allocation granule (``ALLOCATION_GRANULE_BYTES``), for a simulator that plans as cubie does.
CUBIE_GRANULE = _cubie.ALLOCATION_GRANULE_BYTES
#: Above this many times the free memory, a solve's batch draws a warning, as cubie's manager warns.
_OVERSUBSCRIPTION = 20


class _Loop:
    """Where the aiocubie manager runs: the async program's loop, or a loop thread of our own."""

    def __init__(self) -> None:
        self.token = anyio.lowlevel.current_token()  # built on the loop: its thread is this one
        self.thread = threading.get_ident()
        self._stop: Callable[[], None] | None = None

    @classmethod
    def start(cls, manager: aiocubie.MemoryManager) -> _Loop:
        """Run ``manager`` (entered) on a new daemon thread's loop, which never holds up exit."""
        started: dict[str, Any] = {}
        ready = threading.Event()

        async def serve() -> None:
            stop = anyio.Event()
            try:
                async with manager:
                    started["loop"], started["stop"] = cls(), stop.set
                    ready.set()
                    await stop.wait()
            except BaseException as exc:
                started["error"] = exc
                raise
            finally:
                ready.set()

        thread = threading.Thread(target=_run_quietly, args=(serve,), name="aiocubie.cubie", daemon=True)
        thread.start()
        ready.wait()
        if "error" in started:
            thread.join()
            raise started["error"]
        loop: _Loop = started["loop"]
        loop._stop = functools.partial(_stop_thread, loop, started["stop"], thread)
        return loop

    def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` on the loop thread (the aiocubie manager is not thread-safe)."""
        if threading.get_ident() == self.thread:
            return fn(*args)
        return anyio.from_thread.run_sync(fn, *args, token=self.token)

    def wait(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Await ``fn(*args)`` on the loop, from another thread."""
        if threading.get_ident() == self.thread:
            raise aiocubie.errors.ManagerStateError(
                "a cubie solve on aiocubie's memory ran on the event loop's thread, which it would block: "
                "await aiocubie.cubie.solve(solver, ...) (it runs the solve in a worker thread)"
            )
        return anyio.from_thread.run(fn, *args, token=self.token)

    def close(self) -> None:
        """Stop the loop thread this started (a program's loop runs on)."""
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()


def _run_quietly(serve: Callable[[], Any]) -> None:
    try:
        anyio.run(serve)
    except BaseException:  # raised again in the thread that started it
        pass


def _stop_thread(loop: _Loop, stop: Callable[[], None], thread: threading.Thread) -> None:
    anyio.from_thread.run_sync(stop, token=loop.token)
    thread.join()


class CubieMemoryManager(_cubie.MemoryManager):  # type: ignore[misc]
    """A cubie ``MemoryManager`` whose device memory, budgets, plans and stats are aiocubie's.

    Pass it to a cubie solver (``Solver(system, memory_manager=mm)``,
    ``solve_ivp(..., memory_manager=mm)``): the solver runs unchanged; its batches are planned
    by aiocubie against the same budgets as the program's async components, and show in the
    same ``stats()``.

    Parameters
    ----------
    manager : aiocubie.MemoryManager, optional
        A running manager (inside ``async with``): build the adapter on its loop, and run
        solves in worker threads (:func:`solve`). Not given, the adapter makes its own manager
        (with ``options``) and runs it on a loop thread until :meth:`close`.
    **options
        For the manager it makes: :class:`aiocubie.MemoryManager`'s arguments (``backend``,
        ``mode``, ``policy``, ...). ``headroom`` defaults to cubie's 0.02 and ``batch_window``
        to 1 s (a cubie batch closes when the solver asks for it, not by the window).

    Notes
    -----
    cubie's compile-time placeholder arrays (one element each, ``allocate``) and its host and
    pinned arrays stay cubie's own; every array of a batch is aiocubie's, made on aiocubie's
    group stream and handed to cubie through the CUDA array interface (on the simulator, as a
    view of the simulated memory). A label asked for again replaces its array, as in cubie.
    """

    def __init__(self, manager: aiocubie.MemoryManager | None = None, **options: Any) -> None:
        if manager is not None and options:
            raise aiocubie.errors.ConfigurationError("pass a running manager or options for a new one, not both")
        self._loop: _Loop | None
        if manager is None:
            options.setdefault("headroom", CUBIE_HEADROOM)
            options.setdefault("batch_window", 1.0)
            manager = aiocubie.MemoryManager(**options)
            self._loop = _Loop.start(manager)
        elif not manager.running:
            raise aiocubie.errors.ManagerStateError(
                "the aiocubie manager is not running: build the adapter inside `async with mgr:`"
            )
        else:
            self._loop = _Loop()
        #: The aiocubie manager: its ``stats()``, ``summary()`` and budgets include cubie's.
        self.aiocubie = manager
        self._instances: dict[int, Callable[[], Any]] = {}  # weakly, where the instance allows
        self._lock = threading.RLock()  # cubie's queues, for solves in several threads
        self._partitions: dict[tuple[str, int], tuple[int, int]] = {}
        #: True on cubie's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` when cubie was imported).
        self.simulated = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
        super().__init__(mode=self.aiocubie.budget.mode.value)

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Free cubie's arrays and stop the manager the adapter made (a given one keeps running)."""
        if self._loop is None:
            return
        self.free_all()
        self._loop.close()
        self._loop = None

    def _aio(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """``fn(*args, **kwargs)`` (a method of ``self.aiocubie``, type-checked), on the manager's loop."""
        if self._loop is None:
            raise aiocubie.errors.ManagerStateError("this cubie memory manager is closed")
        return self._loop.call(functools.partial(fn, *args, **kwargs))

    def _instance(self, instance_id: int) -> Any:
        held = self._instances.get(instance_id)
        return None if held is None else held()

    # -- what cubie reads from the device -------------------------------------------------------
    def get_memory_info(self) -> tuple[int, int]:
        """Free and total device memory, as aiocubie's backend reads them."""
        info = self._aio(self.aiocubie.pool.memory_info)
        return info.free, info.total

    def get_available_memory(self, group: str) -> int:
        return self._aio(self.aiocubie.budget.available, group)

    # -- registration and budgets ---------------------------------------------------------------
    def register(
        self,
        instance: object,
        proportion: float | None = None,
        invalidate_cache_hook: Callable[[], None] = _cubie.placeholder_invalidate,
        allocation_ready_hook: Callable[[CubieResponse], None] = _cubie.placeholder_dataready,
        stream_group: str = "default",
        owner: object | None = None,
    ) -> None:
        register = functools.partial(
            self.aiocubie.register,
            instance,
            proportion=proportion or None,  # cubie: 0 or None joins the auto pool
            stream_group=stream_group,
            invalidate_hook=functools.partial(self._invalidated, id(instance)),
            owner=instance if owner is None else owner,
        )
        self._aio(register)
        try:
            super().register(instance, proportion, invalidate_cache_hook, allocation_ready_hook, stream_group, owner)
        except BaseException:
            self._aio(self.aiocubie.unregister, instance)
            raise
        try:
            self._instances[id(instance)] = weakref.ref(instance)
        except TypeError:
            self._instances[id(instance)] = lambda: instance

    def _invalidated(self, instance_id: int) -> None:
        """aiocubie reset the context (its arrays are gone): cubie's registration drops its own."""
        settings = self.registry.get(instance_id)
        if settings is not None:
            settings.allocations.clear()
            settings.invalidate_hook()

    def release_instance(self, instance_id: int, settings: Any) -> None:
        if self.registry.get(instance_id) is settings:
            self._free_arrays(instance_id, settings)
            instance = self._instance(instance_id)
            self._instances.pop(instance_id, None)
            if instance is not None and self._loop is not None and self._aio(self.aiocubie.is_registered, instance):
                self._aio(self.aiocubie.unregister, instance)
        super().release_instance(instance_id, settings)

    def proportion(self, instance: object) -> float:
        return self._aio(self.aiocubie.budget.proportion, instance)

    def manual_proportion(self, instance: object) -> float | None:
        return self._aio(self.aiocubie.budget.manual_proportion, instance)

    def cap(self, instance: object) -> int:
        return self._aio(self.aiocubie.budget.cap, instance)

    def set_manual_proportion(self, instance: object, proportion: float) -> None:
        self._aio(self.aiocubie.budget.set_manual, instance, proportion)
        super().set_manual_proportion(instance, proportion)

    def set_manual_limit_mode(self, instance: object, proportion: float) -> None:
        if self.manual_proportion(instance) is None:
            self._aio(self.aiocubie.budget.move_to_manual, instance, proportion)
        super().set_manual_limit_mode(instance, proportion)

    def set_auto_limit_mode(self, instance: object) -> None:
        if self.manual_proportion(instance) is not None:
            self._aio(self.aiocubie.budget.set_auto, instance)
        super().set_auto_limit_mode(instance)

    def set_limit_mode(self, mode: str) -> None:
        self._aio(self.aiocubie.budget.set_mode, mode)
        super().set_limit_mode(mode)

    def change_stream_group(self, instance: object, new_group: str) -> None:
        """Move the owner's registrations (as cubie does), in aiocubie too."""
        owner_id = self.registry[id(instance)].owner_id
        members = list(self.stream_groups.get_instances_in_group(self.get_stream_group(instance)))
        moving = [m for i in members if self._owned_by(i, owner_id) and (m := self._instance(i)) is not None]
        super().change_stream_group(instance, new_group)
        for member in moving:
            self._aio(self.aiocubie.groups.move, member, new_group)

    # -- requests -------------------------------------------------------------------------------
    def allocate_queue(self, triggering_instance: object, stream: Any = None) -> None:
        """Plan and allocate the owner's queued requests as one aiocubie batch, then tell each
        of the owner's registrations (cubie 0.17's owner-scoped queues)."""
        group = self.get_stream_group(triggering_instance)
        owner_id = self.registry[id(triggering_instance)].owner_id
        peers = [p for p in self.stream_groups.get_instances_in_group(group) if self._owned_by(p, owner_id)]
        queued = self._take_queued(group, owner_id)
        if not queued:
            return
        if stream is None:
            stream = self.get_stream(triggering_instance)
        runs = next((r.total_runs for reqs in queued.values() for r in reqs.values() if r.total_runs > 1), 1)
        notaries = [p for p in peers if p not in queued]
        # keep the partition a registration's live arrays are cut to, as cubie does
        partition = self._partitions.get((group, owner_id))
        if partition is not None and not (
            any(self.registry[p].allocations for p in notaries) and -(-runs // partition[1]) == partition[0]
        ):
            partition = None
        batch = {}
        for instance_id, requests in queued.items():
            settings = self.registry[instance_id]
            if settings.last_stream is not None:  # the device is done with the arrays replaced
                settings.last_stream.synchronize()
            device = {label: r for label, r in requests.items() if r.memory == "device"}
            if device:
                batch[instance_id] = (self._instance(instance_id), _requests(device, partition))
        if self._loop is None:
            raise aiocubie.errors.ManagerStateError("this cubie memory manager is closed")
        responses, free = self._loop.wait(self._allocate, group, batch) if batch else ({}, 0)
        _warn_if_oversubscribed(batch, responses, free)
        if partition is not None:
            chunk_length, chunks = partition
        else:
            chunks, chunk_length = next(((r.chunks, r.chunk_length) for r in responses.values()), (1, runs))
        self._partitions[(group, owner_id)] = (chunk_length, chunks)
        for peer in peers:
            self.registry[peer].last_stream = stream
        self._tell(queued, notaries, responses, (chunks, chunk_length), stream)

    def _take_queued(self, group: str, owner_id: Any) -> dict[int, dict[str, CubieRequest]]:
        """Take ``owner_id``'s queued requests of ``group`` (dropping those of collected instances)."""
        queued: dict[int, dict[str, CubieRequest]] = {}
        with self._lock:
            queue = self._queued_allocations.get(group, {})
            for instance_id in list(queue):
                if self.registry.get(instance_id) is None:
                    queue.pop(instance_id)
                elif self._owned_by(instance_id, owner_id):
                    queued[instance_id] = queue.pop(instance_id)
            if not queue:
                self._queued_allocations.pop(group, None)
        return queued

    def _tell(
        self,
        queued: Mapping[int, dict[str, CubieRequest]],
        notaries: list[int],
        responses: Mapping[int, Any],
        plan: tuple[int, int],
        stream: Any,
    ) -> None:
        """Hand each queued registration its arrays, and tell the others of the owner the plan."""
        chunks, chunk_length = plan
        for instance_id, requests in queued.items():
            settings = self.registry.get(instance_id)
            if settings is None:  # collected meanwhile: aiocubie frees its arrays
                continue
            response = responses.get(instance_id)
            arrays = {} if response is None else {k: self._to_cubie(a, stream) for k, a in response.arrays.items()}
            for label, request in requests.items():  # pinned: host memory, cubie's own
                if request.memory != "device":
                    shape = self.compute_chunked_shapes({label: request}, chunk_length)[label]
                    arrays[label] = self.allocate(shape, request.dtype, request.memory, stream)
            settings.allocations.update(arrays)
            shapes = {label: tuple(a.shape) for label, a in arrays.items()}
            settings.allocation_ready_hook(
                CubieResponse(arr=arrays, chunks=chunks, chunk_length=chunk_length, chunked_shapes=shapes)
            )
        for peer in notaries:
            settings = self.registry.get(peer)
            if settings is not None:
                settings.allocation_ready_hook(CubieResponse(arr={}, chunks=chunks, chunk_length=chunk_length))

    async def _allocate(self, group: str, batch: Mapping[int, tuple[Any, dict[str, aiocubie.ArrayRequest]]]) -> Any:
        """One aiocubie batch of the owner's requests (on the loop): submit all, then close it.

        Returns the responses by instance id, and the free memory before the batch.
        """
        mgr, responses, errors = self.aiocubie, {}, []
        free = mgr.pool.memory_info().free

        async def one(instance_id: int, instance: Any, requests: dict[str, Any], *, task_status: Any) -> None:
            pending = mgr.request(instance, requests, replace=True)
            task_status.started()  # the request is submitted before this task first waits
            try:
                responses[instance_id] = await pending
            except aiocubie.errors.AiocubieError as exc:  # raised to the solver as it is, not in a group
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for instance_id, (instance, requests) in batch.items():
                await tg.start(one, instance_id, instance, requests)
            mgr.groups.flush(group)
        if errors:
            for response in responses.values():
                mgr.release(response)
            raise errors[0]
        return responses, free

    def _to_cubie(self, array: Any, stream: Any) -> Any:
        """aiocubie's array as a cubie device array, without a copy."""
        interface = array.__cuda_array_interface__
        if not self.simulated:
            return _cubie.cuda.from_cuda_array_interface(interface, owner=array, sync=False)
        # cubie's simulator: the simulated device's memory is host memory at the interface's address
        dtype, shape, strides = np.dtype(interface["typestr"]), tuple(interface["shape"]), interface["strides"]
        if strides is None:
            extent = int(np.prod(shape)) * dtype.itemsize
        else:
            extent = sum((n - 1) * s for n, s in zip(shape, strides)) + dtype.itemsize if all(shape) else 0
        if extent == 0:
            view = np.empty(shape, dtype)
        else:
            memory = (ctypes.c_byte * extent).from_address(interface["data"][0])
            view = np.ndarray(shape, dtype, buffer=memory, strides=strides)
        return _cubie.DeviceNDArray(view, stream=stream)

    # -- release --------------------------------------------------------------------------------
    def _free_arrays(self, instance_id: int, settings: Any, label: str | None = None) -> None:
        instance = self._instance(instance_id)
        labels = list(settings.allocations) if label is None else [label]
        if instance is None or self._loop is None or not labels:
            return
        if settings.last_stream is not None:
            settings.last_stream.synchronize()
        for each in labels:
            self._aio(self.aiocubie.free, each, instance)

    def free(self, array_label: str) -> None:
        for instance_id, settings in list(self.registry.items()):
            if array_label in settings.allocations:
                self._free_arrays(instance_id, settings, array_label)
        super().free(array_label)

    def free_all(self) -> None:
        for instance_id, settings in list(self.registry.items()):
            self._free_arrays(instance_id, settings)
        super().free_all()


def _warn_if_oversubscribed(
    batch: Mapping[int, tuple[Any, dict[str, aiocubie.ArrayRequest]]], responses: Mapping[int, Any], free: int
) -> None:
    """Warn, as cubie's manager does, when a planned batch asks for over 20x the memory that was free."""
    full = sum(request.nbytes for _, requests in batch.values() for request in requests.values())
    response = next(iter(responses.values()), None)
    if response is not None and full > _OVERSUBSCRIPTION * max(free, 1):
        warnings.warn(
            f"the solve's batch asks for {full} bytes, more than {_OVERSUBSCRIPTION}x the {free} bytes free: "
            f"it is walked in {response.chunks} chunks of {response.chunk_length} runs (give the solver more "
            "memory, or solve fewer runs at a time)",
            aiocubie.errors.AiocubieWarning,
            stacklevel=3,
        )


def _requests(requests: Mapping[str, CubieRequest], partition: tuple[int, int] | None) -> dict[str, Any]:
    """cubie's requests as aiocubie's (cut to ``partition``'s chunk length, unchunkable, when one is kept)."""
    converted = {}
    for label, request in requests.items():
        shape, axis = tuple(request.shape), request.chunk_axis_index
        # a run axis of length 1 stays one: aiocubie plans it as cubie does (unchunkable)
        chunkable = not request.unchunkable and axis is not None and axis < len(shape)
        if partition is not None and chunkable and shape[axis] > 1:
            shape, chunkable = _cubie.replace_with_chunked_size(shape, axis, partition[0]), False
        converted[label] = aiocubie.ArrayRequest(
            shape, request.dtype, kind=request.memory, chunk_axis=axis if chunkable else 0, unchunkable=not chunkable
        )
    return converted


async def solve(solver: Any, *args: Any, **kwargs: Any) -> Any:
    """``solver.solve(*args, **kwargs)`` awaited from an async program, in a worker thread.

    The solver's memory manager must be a :class:`CubieMemoryManager` over the running aiocubie
    manager: its batches are planned against the same budgets as the program's other
    components, while the loop keeps serving them. A cancelled caller waits for the solve to
    end (a solve cannot be stopped part way). On cubie's CUDA simulator, solves run one at a
    time (its kernels are not thread-safe); on a GPU they run side by side.

    Raises
    ------
    aiocubie.errors.ConfigurationError
        If the solver's memory manager is not a CubieMemoryManager.
    """
    if not isinstance(getattr(solver, "memory_manager", None), CubieMemoryManager):
        raise aiocubie.errors.ConfigurationError(
            "the solver's memory manager is not aiocubie's: build it with "
            "memory_manager=aiocubie.cubie.CubieMemoryManager(mgr) inside `async with mgr:`"
        )
    run = functools.partial(solver.solve, *args, **kwargs)
    if solver.memory_manager.simulated:
        run = functools.partial(_one_at_a_time, run)
    return await anyio.to_thread.run_sync(run)


def _one_at_a_time(run: Callable[[], _T]) -> _T:
    with _SIMULATOR:
        return run()
