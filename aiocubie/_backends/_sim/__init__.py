"""The simulator backend: a device modelled on the CPU, so the whole service runs without a GPU.

One concept a module: ``_device`` (streams, events, engines and their timeline, copies, managed
memory), ``_memory`` (the device's bytes as a resource, CuPy's pool model as an adaptor, injected
allocation faults as an adaptor), ``_arrays`` (CuPy-model arrays over blocks; numba's model in
``_numba_model``, the numba extra), ``_streams``, ``_faults``. :class:`SimulatorBackend` bundles
them. It imports neither numba nor CuPy (numba only when numba arrays are asked for).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..._errors import ConfigurationError, shown
from ..._names import MAX_NBYTES, MemoryKind, parse_device
from .._allocators import Allocator, make_resource
from .._base import Backend
from .._resource import Block
from ._arrays import SimArrays, SimCupyArray, host_data
from ._device import TIMELINE_LENGTH, Engines, SimDevice, TimelineEntry
from ._faults import Faults, count, real
from ._memory import SimFaults, SimMemory, SimPool, SimShared, SimState
from ._streams import SimEvent, SimStream

__all__ = [
    "DEFAULT_TOTAL",
    "TIMELINE_LENGTH",
    "Engines",
    "Faults",
    "SimArrays",
    "SimCupyArray",
    "SimDevice",
    "SimEvent",
    "SimFaults",
    "SimMemory",
    "SimPool",
    "SimShared",
    "SimStream",
    "SimulatorBackend",
    "TimelineEntry",
    "host_data",
]

#: Device memory of a simulator made without a ``total`` (8 GiB).
DEFAULT_TOTAL = 8 << 30


def _numba_array() -> Callable[..., Any]:
    from ._numba_model import numba_model  # imports numba: only when numba arrays are asked for

    return numba_model()


class SimulatorBackend(Backend):
    """A faithful CPU model of a CUDA device: a :class:`SimDevice`, a resource over its memory, arrays.

    Parameters
    ----------
    total : int
        Device memory in bytes (default 8 GiB).
    latency : float
        Seconds each item of stream work (allocation fill, copy, event) takes.
    granule : int
        Bytes the planner keeps free (as a GPU allocator's rounding would need).
    reserved : int
        Bytes taken by "other processes" at the start (see :meth:`occupy`).
    engines : Engines, optional
        Bandwidths and latencies of the copy engines and kernels (default: instant).
    allocator : str or callable, optional
        The resource the backend starts with: a registered name (None: ``"default"``, the
        device's ``"driver"`` model, which caches nothing; ``"cupy"`` and ``"cupy_async"`` keep
        freed device blocks cached, as CuPy's pools do), or a factory called with the new
        :class:`SimDevice` (``lambda device: StatisticsAdaptor(device.create_resource("cupy"))``).
    array_type : {"cupy", "numba"}, optional
        What device-side arrays model: ``cupy.ndarray`` (the default) or numba's
        ``DeviceNDArray`` (the numba extra).
    device : int
        Which device of the simulated host this backend is (default 0).
    devices : int, optional
        How many devices the simulated host has (None: ``device + 1``). Each backend models
        one device with its own memory; managed memory can be prefetched (and advised) to
        any device id below ``devices``.

    Raises
    ------
    ConfigurationError
        For a setting of the wrong type or out of range (``SimulatorBackend("1GB")``,
        ``SimulatorBackend(-1)``, ``device=2, devices=2``), an unknown array type, or numba
        arrays without numba.
    UnknownAllocatorError
        For an unknown allocator.

    Attributes
    ----------
    device : SimDevice
        The device: :attr:`SimDevice.faults`, :attr:`SimDevice.timeline`, :meth:`SimDevice.launch`,
        :meth:`SimDevice.occupy` (also reachable from the backend, as below).
    """

    device: SimDevice

    def __init__(
        self,
        total: int = DEFAULT_TOTAL,
        *,
        latency: float = 0.0,
        granule: int = 0,
        reserved: int = 0,
        allocator: Allocator | None = None,
        array_type: str | None = None,
        engines: Engines | None = None,
        device: int = 0,
        devices: int | None = None,
    ) -> None:
        device = parse_device(device)
        if devices is None:
            devices = int(device) + 1
        if not count(devices, 1) or device >= devices:
            raise ConfigurationError(
                f"devices must be the simulated host's device count, an int > device ({device}), got {shown(devices)}"
            )
        engines = Engines() if engines is None else engines
        if not isinstance(engines, Engines):
            raise ConfigurationError(f"engines must be an aiocubie.simulator.Engines, got {shown(engines)}")
        if not count(total, 1) or total > MAX_NBYTES:
            raise ConfigurationError(
                f"total must be the device's memory in bytes, an int from 1 to 2**63 - 1 (e.g. 8 << 30), "
                f"got {shown(total)}"
            )
        if not count(reserved, 0) or reserved > total:
            raise ConfigurationError(f"reserved must be an int of bytes in 0..total ({total}), got {shown(reserved)}")
        if not count(granule, 0) or granule > total:
            raise ConfigurationError(f"granule must be an int of bytes in 0..total ({total}), got {shown(granule)}")
        if not 0.0 <= real(latency) < math.inf:
            raise ConfigurationError(f"latency must be a finite number of seconds >= 0, got {shown(latency)}")
        arrays = SimArrays(array_type, _numba_array)
        state = SimState(total=int(total), reserved=int(reserved))
        sim = SimDevice(
            state,
            latency=float(latency),
            granule=int(granule),
            engines=engines,
            device=int(device),
            devices=int(devices),
        )
        super().__init__(sim, make_resource(sim, "default" if allocator is None else allocator), arrays)

    # -- what tests and demos reach for: the device's model ----------------------------------
    @property
    def faults(self) -> Faults:
        """Inject allocation, event, copy and prefetch failures (see :class:`Faults`)."""
        return self.device.faults

    @property
    def timeline(self) -> list[TimelineEntry]:
        """The copies and kernels the engines ran, oldest first: a list taken now, so it slices
        (``sim.timeline[:3]``) and does not change under you (see :attr:`SimDevice.timeline`)."""
        entries = self.device.timeline
        while True:
            try:
                return list(entries)
            except RuntimeError:  # a stream's worker appended while it was read: read again
                continue

    @property
    def total(self) -> int:
        """The device's memory in bytes."""
        return self.device.state.total

    @property
    def used(self) -> int:
        """Device bytes of blocks in use (those a pool caches not counted)."""
        state = self.device.state
        return state.used - sum(state.cached)

    @property
    def cached(self) -> list[int]:
        """Sizes of the free device blocks the pool caches (allocators ``cupy`` and ``cupy_async``)."""
        return self.device.state.cached

    @property
    def resets(self) -> int:
        """Context resets so far."""
        return self.device.resets

    def library_allocate(self, nbytes: int) -> Block:
        """Pretend another library of this process (CuPy, numba, torch through RMM's hooks) took ``nbytes`` of device memory.

        With an ``rmm`` resource made on this device, the bytes come from its pool (RMM's current
        device resource): they count in its ``pool_facts`` and, out of memory, its failure handler
        (the manager's recovery) runs first. Otherwise they come straight from the device.

        Raises
        ------
        OutOfMemoryError
            When there is no room, even after the failure handler ran.
        """
        shared = self.device.shared
        if shared is not None:
            return shared.allocate_for_library(nbytes)
        return SimMemory(self.device.state, "driver").allocate(nbytes, MemoryKind.DEVICE, None)

    def library_free(self, block: Block) -> None:
        """Give back a block :meth:`library_allocate` took."""
        shared = self.device.shared
        if shared is not None:
            shared.free_for_library(block)
        else:
            SimMemory(self.device.state, "driver").deallocate(block)

    def occupy(self, nbytes: int) -> None:
        """Pretend another process took (positive) or released (negative) ``nbytes`` (see :meth:`SimDevice.occupy`)."""
        self.device.occupy(nbytes)

    def launch(
        self, stream: SimStream, work: Callable[[], None] | None = None, *, duration: float = 0.0, tag: object = None
    ) -> None:
        """Queue a kernel on ``stream`` (see :meth:`SimDevice.launch`)."""
        self.device.launch(stream, work, duration=duration, tag=tag)
