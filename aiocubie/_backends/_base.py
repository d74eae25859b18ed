"""A backend: the device, the resource it was made with, and the array maker, bundled.

What :func:`~aiocubie._backends._select.create_backend` returns and what a manager is handed.
The bundle has no behaviour of its own beyond :meth:`Backend.close`: each protocol lives in the
module named after it (``_device``, ``_resource``, ``_arrays``).
"""

from __future__ import annotations

from typing import Self

from ._arrays import ArrayMaker
from ._device import Device
from ._resource import MemoryResource

__all__ = ["Backend"]


class Backend:
    """A device with a memory resource and an array maker.

    Parameters
    ----------
    device : Device
        Streams, events, copies, memory readings.
    resource : MemoryResource
        The resource the backend was made with (named by ``allocator=``). A device account
        builds its stack on it and may swap it (``set_allocator``): read the account's for
        the one in use.
    arrays : ArrayMaker
        Arrays over the resource's blocks (its ``name`` is the array type).
    """

    __slots__ = ("arrays", "device", "resource")

    def __init__(self, device: Device, resource: MemoryResource, arrays: ArrayMaker) -> None:
        self.device = device
        self.resource = resource
        self.arrays = arrays

    @property
    def name(self) -> str:
        """The device's kind: ``"simulator"`` or ``"cuda"``."""
        return self.device.name

    @property
    def array_type(self) -> str:
        """The array type handed out for device-side kinds (``"cupy"`` or ``"numba"``)."""
        return self.arrays.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.device.device_name}: {self.resource.name} resource, {self.arrays.name} arrays>"

    def close(self) -> None:
        """Release what the device holds (threads, pools). Idempotent."""
        self.device.close()

    def __enter__(self) -> Self:
        """``with SimulatorBackend(...) as sim:`` closes the backend on exit (its stream threads)."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
