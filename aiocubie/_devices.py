"""DeviceSet: one MemoryManager per device of a host, and the rule that places a component.

It composes managers and delegates to them; it never touches a backend's device itself (each
manager drives its own) and never moves a registered component between devices.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Literal

from ._backends import Backend, device_count
from ._errors import ConfigurationError, RegistrationError, shown
from ._manager import MemoryManager, PendingRequest
from ._names import parse_backend, parse_device
from ._requests import ArrayRequest
from ._stats import Snapshot

__all__ = ["DeviceSet"]


def _check_options(
    function: Callable[..., Any], options: Mapping[str, Any], where: str, taken: tuple[str, ...]
) -> None:
    """Refuse keyword options ``function`` does not take (or that ``where`` sets itself)."""
    accepted = set(inspect.signature(function).parameters) - {"self", *taken}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise ConfigurationError(
            f"{where} got unknown option(s) {', '.join(map(repr, unknown))}: it takes {', '.join(sorted(accepted))}"
        )


class DeviceSet:
    """One :class:`MemoryManager` per device, and a rule that places each component on one.

    ``async with DeviceSet(...) as devices`` runs every manager; components register with the
    set, which picks their device, then request through it (or through ``manager_of``) exactly
    as through a single manager. Budgets, streams and stats stay per device.

    Placement rule (:meth:`register`): the device given explicitly; otherwise the device with
    the fewest registered members, ties broken by the most free memory, then by the lowest id.
    A component stays on its device until it is unregistered.

    Parameters
    ----------
    devices : sequence of int, or "all"
        The device ids to manage (``"all"``: every GPU the process sees; one simulated device
        when the backend is the simulator).
    backend : {"auto", "simulator", "cuda"} or callable
        A backend name, used for every device as ``MemoryManager(backend, device=d)`` (on the
        simulator, device ``d`` of a host of ``d + 1``), or ``backend(device) -> Backend`` to
        build each (``lambda d: SimulatorBackend(device=d, devices=2)`` models one host whose
        devices can prefetch to each other).
    **options
        Passed to every :class:`MemoryManager` (``mode``, ``policy``, ``allocator``,
        ``array_type``, ``batch_window``...).

    Raises
    ------
    ConfigurationError
        For an empty or repeated list of devices, a device that does not exist, an unknown
        backend name, a backend callable that builds another device's backend, or bad
        manager options.

    Examples
    --------
    >>> import anyio
    >>> from aiocubie import DeviceSet
    >>> async def main():
    ...     async with DeviceSet([0, 1], backend="simulator") as devices:
    ...         a, b = object(), object()
    ...         return devices.register(a), devices.register(b)
    >>> anyio.run(main)
    (0, 1)
    """

    def __init__(
        self,
        devices: Iterable[int] | Literal["all"] = "all",
        *,
        backend: str | Callable[[int], Backend] = "auto",
        **options: Any,
    ) -> None:
        _check_options(MemoryManager.__init__, options, "DeviceSet", ("backend", "device"))
        if not (isinstance(backend, str) or callable(backend)):
            raise ConfigurationError(
                f"backend must be a backend name ('auto', 'simulator', 'cuda') or a callable building "
                f"one device's backend, got {shown(backend)}"
            )
        if not isinstance(devices, (str, Iterable)):
            raise ConfigurationError(
                f"devices must be a list of device ids or 'all', got {shown(devices)}: e.g. [0, 1]"
            )
        if isinstance(devices, str):
            if devices != "all":
                raise ConfigurationError(f"devices must be a list of device ids or 'all', got {devices!r}")
            if not isinstance(backend, str):
                raise ConfigurationError("devices='all' needs a backend name to count devices: pass a list of ids")
            ids = list(range(device_count(parse_backend(backend))))
        else:
            given = list(devices)
            ids = [parse_device(device, what=f"devices[{i}] of {shown(given)}") for i, device in enumerate(given)]
        if not ids or len(set(ids)) != len(ids):
            raise ConfigurationError(f"devices must name each device once, and at least one: got {shown(ids)}")
        managers: dict[int, MemoryManager] = {}
        try:
            for device in sorted(ids):
                if isinstance(backend, str):
                    managers[device] = MemoryManager(backend, device=device, **options)
                else:
                    managers[device] = MemoryManager(backend(device), **options)
                    if managers[device].device != device:  # stats and placement would name the wrong device
                        raise ConfigurationError(
                            f"backend({device}) drives device {managers[device].device}, not {device}: "
                            f"build each device's backend for it, e.g. lambda d: SimulatorBackend(device=d, devices=n)"
                        )
        except BaseException:
            for manager in managers.values():
                manager.close()
            raise
        self._managers = managers
        self._stack: contextlib.AsyncExitStack | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> DeviceSet:
        async with contextlib.AsyncExitStack() as stack:
            for manager in self._managers.values():
                await stack.enter_async_context(manager)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop every manager (each frees its arrays and fails what it has pending)."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    def close(self) -> None:
        """Release every manager's backend resources (see :meth:`MemoryManager.close`).

        Every manager is closed, even when one fails; the first failure is raised after.
        """
        failure: BaseException | None = None
        for manager in self._managers.values():
            try:
                manager.close()
            except BaseException as exc:  # close the others first
                failure = failure or exc
        if failure is not None:
            raise failure

    # -- devices and placement ---------------------------------------------------------------
    @property
    def devices(self) -> tuple[int, ...]:
        """The device ids, in increasing order."""
        return tuple(self._managers)

    @property
    def managers(self) -> Mapping[int, MemoryManager]:
        """Device id -> its manager."""
        return dict(self._managers)

    def manager(self, device: int) -> MemoryManager:
        """The manager of ``device``.

        Raises
        ------
        ConfigurationError
            If ``device`` is not a device number (an int >= 0), or the set does not hold it.
        """
        found = self._managers.get(parse_device(device))  # 1.0 and True refused, as the constructor refuses them
        if found is None:
            raise ConfigurationError(f"device {shown(device)} is not in this set: it holds {list(self._managers)}")
        return found

    def members(self) -> dict[int, int]:
        """Device id -> how many components are registered there."""
        return {device: sum(map(len, m.groups.members().values())) for device, m in self._managers.items()}

    def place(self) -> int:
        """The device the next component without an explicit device goes to.

        The one with the fewest members; ties go to the most free memory, then the lowest id.
        """
        members = self.members()
        return min(self._managers, key=lambda d: (members[d], -self._managers[d].pool.memory_info().free, d))

    def register(self, instance: object, *, device: int | None = None, **options: Any) -> int:
        """Register ``instance`` on a device chosen by the placement rule, and return its id.

        Parameters
        ----------
        instance : object
            The component (held weakly, as by :meth:`MemoryManager.register`).
        device : int, optional
            Put it on this device. None: the device with the fewest members, ties broken by
            the most free memory, then the lowest id (:meth:`place`).
        **options
            Passed to :meth:`MemoryManager.register` (``stream_group``, ``proportion``, hooks...).

        Raises
        ------
        RegistrationError
            If ``instance`` is registered on a device of this set already.
        ConfigurationError
            If ``device`` is not a device number (an int >= 0) or not in this set.
        """
        if self._find(instance) is not None:
            raise RegistrationError(
                f"{type(instance).__name__} is registered on device {self.device_of(instance)} already: "
                "unregister it first to move it"
            )
        _check_options(MemoryManager.register, options, "DeviceSet.register", ("instance", "device"))
        chosen = self.place() if device is None else parse_device(device)
        self.manager(chosen).register(instance, **options)
        return chosen

    def unregister(self, instance: object) -> None:
        """Unregister ``instance`` from its device's manager (releasing what it holds there)."""
        self.manager_of(instance).unregister(instance)

    def _find(self, instance: object) -> int | None:
        for device, manager in self._managers.items():
            if manager.is_registered(instance):
                return device
        return None

    def device_of(self, instance: object) -> int:
        """The id of the device ``instance`` is registered on.

        Raises
        ------
        RegistrationError
            If it is registered on none of them.
        """
        device = self._find(instance)
        if device is None:
            raise RegistrationError(
                f"{type(instance).__name__} is not registered with this device set: call register() first"
            )
        return device

    def manager_of(self, instance: object) -> MemoryManager:
        """The manager of the device ``instance`` is registered on (see :meth:`device_of`)."""
        return self._managers[self.device_of(instance)]

    def request(
        self,
        instance: object,
        requests: Mapping[str, ArrayRequest],
        *,
        replace: bool = False,
        ordered: bool = False,
        priority: int | None = None,
    ) -> PendingRequest:
        """``instance``'s manager's :meth:`MemoryManager.request`, with its keywords (await it, or ``async with``)."""
        return self.manager_of(instance).request(
            instance, requests, replace=replace, ordered=ordered, priority=priority
        )

    # -- observability -----------------------------------------------------------------------
    def stats(self) -> dict[int, Snapshot]:
        """Device id -> that manager's :meth:`MemoryManager.stats`."""
        return {device: manager.stats() for device, manager in self._managers.items()}
