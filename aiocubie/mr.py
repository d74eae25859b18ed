"""Memory resources a user composes, as ``rmm.mr`` and cuda.core present them.

A resource hands out blocks (:meth:`MemoryResource.allocate` / :meth:`~MemoryResource.deallocate`);
adaptors wrap an upstream resource and add one thing each. ``allocator=`` (``MemoryManager``,
``create_backend``, ``set_allocator``) takes a registered name, a resource made on the device,
or a factory called with the device::

    import aiocubie
    from aiocubie import mr

    sim = aiocubie.simulator.SimulatorBackend(8 << 30)
    stack = mr.StatisticsAdaptor(mr.LimitingAdaptor(sim.device.create_resource("cupy"), 1 << 30))
    mgr = aiocubie.MemoryManager(sim, allocator=stack)

    mr.register_allocator("capped", lambda device: mr.LimitingAdaptor(device.create_resource("driver"), 1 << 30),
                          backend="simulator")
    aiocubie.MemoryManager("simulator", allocator="capped")
"""

from __future__ import annotations

from ._backends import (
    Allocator,
    Block,
    FailureCallbackAdaptor,
    FailureHandler,
    LibraryPool,
    LimitingAdaptor,
    MemoryResource,
    PoolFacts,
    ResourceAdaptor,
    ResourceFactory,
    SharedPool,
    StatisticsAdaptor,
    allocator_names,
    register_allocator,
)

__all__ = [
    "Allocator",
    "Block",
    "FailureCallbackAdaptor",
    "FailureHandler",
    "LibraryPool",
    "LimitingAdaptor",
    "MemoryResource",
    "PoolFacts",
    "ResourceAdaptor",
    "ResourceFactory",
    "SharedPool",
    "StatisticsAdaptor",
    "allocator_names",
    "register_allocator",
]
