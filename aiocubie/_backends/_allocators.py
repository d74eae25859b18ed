"""The allocator registry: each name ``allocator=`` takes is a factory of a memory resource, per backend.

Adding an allocator is one resource class and one :func:`register_allocator` call: the
simulator and the CUDA backend register theirs where they define them, and a user may register
more (``aiocubie.mr.register_allocator``). ``allocator=`` (the manager, ``create_backend``,
``set_allocator``) also takes a resource object, or a factory called with the device.

The names both backends register: ``driver`` the device's stream-ordered pool (cuMemAllocAsync;
the default); ``cupy`` / ``cupy_async`` CuPy's MemoryPool / MemoryAsyncPool; ``numba`` numba's
own memory manager (the numba extra); ``rmm`` the device's current RMM resource, shared with
every library that draws from RMM (the rmm extra). ``default`` is the device's own choice.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

from .._errors import UnknownAllocatorError, shown
from .._names import BACKENDS, one_of
from ._resource import MemoryResource

__all__ = [
    "DEFAULT_ALLOCATOR",
    "Allocator",
    "ResourceFactory",
    "allocator_names",
    "allocator_or_resource",
    "find_factory",
    "make_resource",
    "parse_allocator",
    "register_allocator",
    "registered",
]

#: The name of the device's own choice (``Device.default_resource``).
DEFAULT_ALLOCATOR = "default"

#: Makes a new resource on the :class:`~aiocubie._backends._device.Device` it is called with (what a
#: registered name stands for). Typed ``Any`` here: the device protocol stands on this registry.
ResourceFactory: TypeAlias = Callable[[Any], MemoryResource]
#: What ``allocator=`` takes: a registered name, a resource made on the device, or a factory.
Allocator: TypeAlias = str | MemoryResource | ResourceFactory


class _Maker(Protocol):
    """What :func:`make_resource` needs of a device."""

    device_name: str

    def create_resource(self, name: str) -> MemoryResource: ...

    def same_device(self, other: object) -> bool: ...


#: allocator name -> backend name (``"simulator"``, ``"cuda"``) -> factory, in registration order.
_FACTORIES: dict[str, dict[str, ResourceFactory]] = {}


def register_allocator(name: str, factory: ResourceFactory, *, backend: str) -> None:
    """Make ``allocator=name`` build ``factory(device)`` on ``backend``'s devices.

    Parameters
    ----------
    name : str
        The allocator's name (not ``"default"``); registering it again for the same backend
        replaces the factory.
    factory : callable
        Called with the :class:`~aiocubie._backends._device.Device`; returns a new
        :class:`~aiocubie._backends._resource.MemoryResource` (an adaptor stack too: the device
        names it ``name``).
    backend : {"simulator", "cuda"}
        The backend whose devices it serves.

    Raises
    ------
    UnknownAllocatorError
        For ``"default"``, a name that is not a non-empty string, or an unknown backend.
    """
    if not isinstance(name, str) or not name or name == DEFAULT_ALLOCATOR:
        raise UnknownAllocatorError(
            f"cannot register an allocator named {shown(name)}: use a non-empty string other than 'default'"
        )
    if backend not in BACKENDS[1:]:
        raise UnknownAllocatorError(
            f"cannot register allocator {name!r} for backend {shown(backend)}: use 'simulator' or 'cuda'"
        )
    if not callable(factory):
        raise UnknownAllocatorError(
            f"allocator {name!r}: the factory must be callable with the device, got {shown(factory)}"
        )
    _FACTORIES.setdefault(name, {})[backend] = _checked_factory(factory)


def allocator_names() -> tuple[str, ...]:
    """Every name ``allocator=`` takes: ``"default"``, then the registered ones in registration order."""
    return (DEFAULT_ALLOCATOR, *_FACTORIES)


def registered(backend: str) -> tuple[str, ...]:
    """The names registered for ``backend`` (``"default"`` not among them)."""
    return tuple(name for name, by_backend in _FACTORIES.items() if backend in by_backend)


def parse_allocator(value: Any) -> str:
    """The allocator ``value`` names: one of :func:`allocator_names`.

    Raises
    ------
    UnknownAllocatorError
        For anything else, listing the registered names.
    """
    return one_of(value, allocator_names(), "allocator", UnknownAllocatorError, _HINT)


def find_factory(name: str, backend: str) -> ResourceFactory:
    """The factory registered as ``name`` for ``backend`` (``"default"`` already resolved).

    Raises
    ------
    UnknownAllocatorError
        For a name not registered, or registered for other backends only.
    """
    by_backend = _FACTORIES.get(parse_allocator(name), {})
    factory = by_backend.get(backend)
    if factory is None:
        raise UnknownAllocatorError(
            f"allocator {name!r} is registered for the {', '.join(by_backend)} backend only, not {backend!r}: "
            f"register a factory for it (aiocubie.mr.register_allocator({name!r}, factory, backend={backend!r}))"
        )
    return lambda device: _resource_of(factory(device), f"the factory registered as allocator {name!r}")


def make_resource(device: _Maker, allocator: Allocator) -> MemoryResource:
    """The resource ``allocator`` stands for on ``device``: a name's new resource, a factory's, or the resource given.

    A resource given is used as it is: it must have been made on ``device`` (by
    ``device.create_resource`` or over one such resource, as adaptors are).

    Raises
    ------
    UnknownAllocatorError
        For a name not registered for the device's backend, a value that is none of the three, or
        a resource (given, or a factory's) made on another device.
    """
    if isinstance(allocator, MemoryResource):
        resource = allocator
    elif isinstance(allocator, str):
        resource = device.create_resource(allocator)
    elif callable(allocator):
        resource = _resource_of(_checked_factory(allocator)(device), f"the allocator factory {allocator!r}")
    else:
        raise UnknownAllocatorError(
            f"allocator must be a name ({', '.join(map(repr, allocator_names()))}), a MemoryResource or a factory "
            f"called with the device, got {shown(allocator)}"
        )
    if resource.device is not None and not device.same_device(resource.device):
        raise UnknownAllocatorError(
            f"the {resource.name!r} resource was made on another device ({resource.device.device_name}) than this "
            f"backend's ({device.device_name}): make it on this one (backend.device.create_resource(...)), or pass "
            "its name or a factory, called with this device"
        )
    return resource


def allocator_or_resource(value: Any) -> Allocator:
    """``value`` checked as ``allocator=`` takes it: a registered name (parsed), a resource or a factory.

    Raises
    ------
    UnknownAllocatorError
        For a name not registered or a value that is none of the three.
    """
    if isinstance(value, MemoryResource):
        return value
    if callable(value) and not isinstance(value, str):
        return _checked_factory(value)
    return parse_allocator(value)


def _resource_of(made: object, factory: str) -> MemoryResource:
    """``made``, what ``factory`` (a clause naming it) returned, once it is seen to be a resource.

    Raises
    ------
    UnknownAllocatorError
        For anything but a :class:`MemoryResource`.
    """
    if isinstance(made, MemoryResource):
        return made
    raise UnknownAllocatorError(f"{factory} returned {shown(made)}, not a MemoryResource")


def _checked_factory(factory: Callable[..., Any]) -> ResourceFactory:
    """``factory``, once it is seen to take the device as its one argument (where its signature says)."""
    try:
        inspect.signature(factory).bind(object())
    except TypeError:
        raise UnknownAllocatorError(
            f"an allocator factory is called with the device, and {factory!r} does not take it: pass "
            "`lambda device: ...` (e.g. lambda device: aiocubie.mr.StatisticsAdaptor(device.create_resource('driver')))"
        ) from None
    except ValueError:  # no signature to read (some builtins): called as it is
        pass
    return factory


_HINT = " (or register one: aiocubie.mr.register_allocator; or pass a MemoryResource)"
