"""What a walk checks before it copies: the response is one a manager served, and the host arrays match it.

Every bad host array is refused here, before anything is copied; and here is decided whether
a one-chunk walk's host arrays all go straight to their device arrays (no staging, no repacking).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._backends import geometry
from .._errors import InvalidRequestError, shown
from .._requests import ArrayResponse

__all__ = ["check_hosts", "check_served", "straight"]


def check_served(response: Any, walk: str, *, whole: bool = False) -> ArrayResponse:
    """``response`` if it is an ArrayResponse a manager served (it has a device to copy with), and
    (``whole``) fits whole."""
    if not isinstance(response, ArrayResponse):
        raise InvalidRequestError(
            f"{walk} walks an ArrayResponse (what `await mgr.request(...)` returns), got {shown(response)}"
        )
    if response.device is None:
        raise InvalidRequestError(
            f"{walk} walks a response a manager served (it copies with that manager's device); "
            "this one was built by hand"
        )
    if whole and response.chunks != 1:
        raise InvalidRequestError(
            f"{walk} walks batches that fit whole, but this response is planned in {response.chunks} "
            "chunks: walk each batch with walk_chunks, or ask for a smaller batch"
        )
    return response


def check_hosts(response: ArrayResponse, arrays: Any, role: str) -> dict[str, np.ndarray[Any, Any]]:
    """The host arrays of ``role`` checked against ``response``: every bad one is refused here,
    before anything is copied."""
    if type(arrays) is not dict and not isinstance(arrays, Mapping):
        raise InvalidRequestError(f"{role} must be a mapping of label -> full-size host array, got {shown(arrays)}")
    checked = {}
    expected = response._full_shapes()
    for label, host in arrays.items():
        if type(host) is np.ndarray:  # the common case: checked in a few comparisons
            try:
                shape, dtype = expected[label]
            except (KeyError, TypeError):  # no such label (or not a hashable one): said below
                pass
            else:
                if host.shape == shape and host.dtype == dtype and (role == "inputs" or host.flags.writeable):
                    checked[label] = host
                    continue
        if not isinstance(label, str) or label not in response.arrays:
            known = ", ".join(map(repr, response.arrays)) or "none"
            raise InvalidRequestError(
                f"{role}[{shown(label)}]: the response has no array {shown(label)} (it has {known})"
            )
        if role == "outputs" and not isinstance(host, np.ndarray):  # a copy of a list would be written, then lost
            raise InvalidRequestError(
                f"outputs[{label!r}] is a {type(host).__name__}: outputs are numpy arrays the walk writes into"
            )
        given = "" if isinstance(host, np.ndarray) else f"a {type(host).__name__}, read as "
        try:
            host = np.asarray(host)
        except (TypeError, ValueError) as exc:  # ragged lists, objects numpy cannot read
            raise InvalidRequestError(f"{role}[{label!r}] is not an array numpy can read: {exc}") from None
        full, dtype = expected[label]
        if host.shape != full or host.dtype != dtype:
            raise InvalidRequestError(
                f"{role}[{label!r}] is {given}{shown(host.shape)} {host.dtype}, but the request was for "
                f"{full} {dtype}: pass the full-size (unchunked) host array"
                + (f" as a numpy array (np.asarray(x, dtype=np.{dtype.name}))" if given else "")
            )
        if role == "outputs" and not host.flags.writeable:
            raise InvalidRequestError(
                f"outputs[{label!r}] is read-only: the walk copies each chunk's results into it; "
                "pass a writable array (np.empty_like(x), or x.copy())"
            )
        checked[label] = host
    device = response.device
    if device is not None:  # a released response's host array: packed on the host, so no copy would refuse it
        for host in checked.values():
            device.check_host(host)
    return checked


def straight(
    response: ArrayResponse, ins: dict[str, np.ndarray[Any, Any]], outs: dict[str, np.ndarray[Any, Any]]
) -> bool:
    """Whether every host array of a one-chunk walk goes straight to or from its device array:
    pinned, of the device array's shape, in rows the copy engines can follow."""
    device, arrays = response.device, response.arrays
    for hosts in (ins, outs):
        for label, host in hosts.items():
            target = arrays[label]
            if host.shape != target.shape or not device.is_pinned(host):
                return False
            if host.flags.c_contiguous and _c_contiguous(target):
                continue  # one block each side (a batch stream's arrays): no geometry to work out
            if geometry(host.shape, host.itemsize, host.strides, target.strides) is None:
                return False
    return True


def _c_contiguous(array: Any) -> bool:
    """Whether a device array (CuPy, numba, numpy) says it is C-contiguous."""
    flags = getattr(array, "flags", None)
    if flags is None:
        return False
    try:
        return bool(flags.c_contiguous)
    except AttributeError:  # numba's flags are a dict
        return bool(flags["C_CONTIGUOUS"])
