"""Host memory as the user reaches it (``mgr.host``): host arrays, copies between host and device,
prefetch and advice for managed memory.

Handed the device, the serving loop and a way to find an instance's stream; it
waits for the device through the completion bridge. It keeps no state of its own, writes no
ledger or budget, and never reaches back to the manager.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from ._backends import Advice, Device, StreamLike
from ._completion import wait_event
from ._errors import AiocubieError, AllocationError, InvalidRequestError, shown
from ._requests import ArrayRequest, MemoryKind, check_device
from ._serving import Serving

__all__ = ["HostView"]


class HostView:
    """A manager's host memory, copies and managed memory: ``mgr.host``.

    Parameters
    ----------
    device : Device
        The device: copies, events, host arrays, the pinned staging pool, managed memory.
    serving : Serving
        The loop to wait on when called from it (else a thread waits).
    stream_of : callable
        ``stream_of(instance)``: the stream of a registered instance's group (raises for one
        that is not registered).
    """

    def __init__(self, device: Device, serving: Serving, stream_of: Callable[[object], Any]) -> None:
        self._device = device
        self._serving = serving
        self._stream_of = stream_of

    def array(
        self,
        shape: int | Sequence[int],
        dtype: Any,
        kind: MemoryKind | str = "pinned",
        like: np.ndarray[Any, Any] | None = None,
        *,
        pool: bool = False,
    ) -> np.ndarray[Any, Any]:
        """A C-contiguous host array, ``pinned`` or ``host``: zeros, or a copy of ``like``.

        With ``pool=True`` a pinned array comes from the pinned staging pool (the walks' pool:
        exact sizes, reused) and goes back to it when the array and its views are collected.

        Raises
        ------
        InvalidRequestError
            For a bad shape, dtype or kind, or a ``like`` of another shape or with values the
            dtype cannot hold (``1e308`` in int8).
        AllocationError
            If the host memory cannot be had.
        """
        request = ArrayRequest(shape, dtype, kind, unchunkable=True)
        if request.kind not in (MemoryKind.PINNED, MemoryKind.HOST):
            raise InvalidRequestError(f"host arrays are 'pinned' or 'host', not {request.kind.value!r}")
        if like is not None:  # checked before anything is allocated
            try:
                like_shape = np.shape(like)
            except (TypeError, ValueError) as exc:  # ragged lists
                raise InvalidRequestError(f"like={shown(like)} is not an array numpy can read: {exc}") from None
            if like_shape != request.shape:
                raise InvalidRequestError(f"like has shape {like_shape}, not {request.shape}")
        try:
            if pool and request.kind is MemoryKind.PINNED:
                # the buffer goes back when the array and every view of it are gone
                array = self._device.pinned_pool.lease(request.nbytes).view(request.dtype).reshape(request.shape)
                array.fill(0)
            else:
                array = self._device.host_array(request.shape, request.dtype, request.kind)
        except AiocubieError:
            raise
        except MemoryError as exc:  # a backend that let numpy's through
            raise AllocationError(
                f"cannot allocate a {request.kind.value} host array of {request.nbytes} bytes "
                f"({request.shape}, {request.dtype}): {exc}"
            ) from exc
        if like is not None:
            try:
                with np.errstate(
                    over="raise", invalid="raise"
                ):  # a value the dtype cannot hold is refused, not wrapped
                    array[...] = like
            except (TypeError, ValueError, OverflowError, FloatingPointError) as exc:  # text, objects, 1e308 into int8
                raise InvalidRequestError(
                    f"like={shown(like)} cannot be copied into a {request.dtype} host array: {exc}"
                ) from exc
        return array

    def release_pinned(self) -> int:
        """Unpin the free buffers of the pinned staging pool (buffers in use stay); return the bytes."""
        return self._device.pinned_pool.clear()

    async def to_device(self, instance: object, host_arrays: Sequence[Any], device_arrays: Sequence[Any]) -> None:
        """Copy each host array into its device array on ``instance``'s stream; wait until done.

        :class:`InvalidRequestError` (nothing copied) unless both are lists of arrays, paired up;
        :class:`BackendError` if a pair's shapes or dtypes differ, or the copy fails.
        """
        await self._copy(instance, host_arrays, device_arrays, ("host_arrays", "device_arrays"))

    async def from_device(self, instance: object, device_arrays: Sequence[Any], host_arrays: Sequence[Any]) -> None:
        """Copy each device array into its host array on ``instance``'s stream; wait until done
        (errors as :meth:`to_device`)."""
        await self._copy(instance, device_arrays, host_arrays, ("device_arrays", "host_arrays"))

    async def _copy(
        self, instance: object, sources: Sequence[Any], targets: Sequence[Any], names: tuple[str, str]
    ) -> None:
        # what is not a list of arrays is refused before anything is queued (the backend checks each pair)
        for given, name in ((sources, names[0]), (targets, names[1])):
            if not isinstance(given, Sequence) or isinstance(given, (str, bytes)):
                raise InvalidRequestError(
                    f"{name} must be a list of arrays, got {shown(given)}: wrap a single array in a list"
                )
            for index, array in enumerate(given):
                if not (hasattr(array, "shape") and hasattr(array, "dtype")):
                    raise InvalidRequestError(
                        f"{name}[{index}] is {shown(array)}, not an array: pass numpy arrays "
                        "(np.asarray(x)) and the arrays of a response"
                    )
        if len(sources) != len(targets):
            raise InvalidRequestError(f"{len(sources)} {names[0]} but {len(targets)} {names[1]}: pair them up")
        stream = self._stream_of(instance)
        for src, dst in zip(sources, targets):
            self._device.copy(src, dst, stream)
        await self.wait_for(stream)

    async def prefetch(self, instance: object, array: Any, device: int | Literal["own"] | None = "own") -> None:
        """Prefetch managed ``array`` to ``device`` (``"own"``: this manager's; None: the CPU)
        on ``instance``'s stream."""
        _check_managed(array, "prefetch")
        stream = self._stream_of(instance)
        self._device.prefetch(array, self._location(device), stream)
        await self.wait_for(stream)

    def _location(self, device: Any) -> Any:
        return self._device.device_id if isinstance(device, str) and device == "own" else device

    async def wait_for(self, stream: StreamLike) -> None:
        """Wait until the work queued on ``stream`` so far is done (on the loop, or in a thread)."""
        event = self._device.record_event(stream)
        loop = self._serving.here()
        await (loop.wait(event) if loop is not None else wait_event(event))

    def advise(self, array: Any, advice: Advice, device: int | Literal["own"] | None = "own") -> None:
        """Give managed-memory ``advice`` (preferred_location, accessed_by, read_mostly) about
        ``device`` (``"own"``: this manager's; None: the CPU).

        :class:`InvalidRequestError` for advice that is not a string or a device that is not an
        int >= 0 or None; :class:`BackendError` for advice the backend does not know.
        """
        if not isinstance(advice, str):  # the backend names what it knows; it needs a str to look up
            raise InvalidRequestError(
                f"advice must be a string (preferred_location, accessed_by, read_mostly), got {shown(advice)}"
            )
        _check_managed(array, "advise")
        device = check_device(self._location(device))
        self._device.advise(array, advice, device)


def _check_managed(array: Any, what: str) -> None:
    """Refuse what is not a device-side array at all (a managed one is checked by the device)."""
    if getattr(type(array), "__cuda_array_interface__", None) is None:
        raise InvalidRequestError(
            f"{what} needs a managed array (from a request with kind='managed'), got {shown(array)}: "
            "pass the array from response.arrays"
        )
