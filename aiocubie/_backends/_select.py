"""Picking a backend: whether a GPU is usable, how many devices there are, and making the backend.

The one place a backend is chosen and built; the CUDA backend through ``_cuda.create_cuda_backend``
alone, imported only when a GPU is asked for (so that ``import aiocubie`` needs neither cuda.core
nor CuPy nor numba).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

from .._errors import ConfigurationError, warn
from .._names import BACKENDS, parse_backend, parse_device
from ._allocators import Allocator, allocator_or_resource
from ._arrays import parse_array_type
from ._base import Backend
from ._sim import DEFAULT_TOTAL, SimulatorBackend

__all__ = ["BACKENDS", "create_backend", "device_count", "gpu_status", "select_backend"]

log = logging.getLogger("aiocubie")


def _driver_devices() -> tuple[int, str]:
    # Ask the driver directly: importing a CUDA library first would fix numba's choice between
    # the GPU and its simulator (NUMBA_ENABLE_CUDASIM) before the caller can make it.
    for library in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            driver = ctypes.CDLL(library)
            break
        except OSError:
            continue
    else:
        return 0, "no CUDA driver (libcuda) on this machine"
    if (status := driver.cuInit(0)) != 0:
        return 0, f"the CUDA driver failed to initialise (cuInit error {status})"
    count = ctypes.c_int(0)
    if (status := driver.cuDeviceGetCount(ctypes.byref(count))) != 0 or count.value == 0:
        return 0, f"the CUDA driver sees no device (error {status})"
    return count.value, f"{count.value} CUDA device(s)"


def _check_name(name: str) -> None:
    parse_backend(name)


def gpu_status() -> tuple[bool, str]:
    """Whether a usable CUDA GPU is present, and why (or why not).

    Probes the CUDA driver without importing any CUDA library when there is no GPU, so callers
    can still choose numba's simulator (NUMBA_ENABLE_CUDASIM=1) afterwards.
    """
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False, "NUMBA_ENABLE_CUDASIM=1 selects numba's CUDA simulator"
    devices, why = _driver_devices()
    if not devices:
        return False, why
    try:
        from ._cuda import cuda_usable
    except ImportError as exc:  # name what is missing, not aiocubie's internal import
        missing = exc.name if exc.name and not exc.name.startswith("aiocubie") else None
        what = f"{missing!r} is not installed" if missing else f"it cannot be imported ({exc})"
        return False, (
            f"{why}, but aiocubie's CUDA backend needs cuda-core, cuda-bindings and CuPy and {what}: "
            "pip install 'aiocubie[cuda12]' or 'aiocubie[cuda13]'"
        )
    return cuda_usable()


def device_count(name: str = "auto") -> int:
    """How many devices backend ``name`` offers: the GPUs this process sees, or 1 for the simulator.

    ``"auto"`` counts the GPUs when a usable one is present (else 1, the simulator's).
    ``CUDA_VISIBLE_DEVICES`` limits and renumbers the GPUs a process sees.

    Raises
    ------
    ConfigurationError
        For an unknown backend name, or ``"cuda"`` without a usable GPU.
    """
    _check_name(name)
    if name == "simulator":
        return 1
    usable, why = gpu_status()
    if not usable and name == "cuda":
        raise ConfigurationError(f"backend 'cuda' is not usable here: {why}; use 'simulator'")
    return _driver_devices()[0] if usable else 1


def create_backend(
    name: str = "auto",
    *,
    allocator: Allocator | None = None,
    array_type: str | None = None,
    device: int = 0,
    devices: int | None = None,
) -> Backend:
    """Create the backend ``name``: ``"auto"``, ``"simulator"`` or ``"cuda"``, on ``device``.

    ``"auto"`` picks ``"cuda"`` when a usable GPU is present and the simulator otherwise, and
    logs which and why at INFO level.

    Parameters
    ----------
    name : {"auto", "simulator", "cuda"}
        Which device.
    allocator : str, MemoryResource or callable, optional
        The memory resource: a registered name (``allocator_names()``; None: ``"default"``, the
        device's choice), a factory called with the new device, or a resource made on that device.
    array_type : {"cupy", "numba"}, optional
        The arrays handed out for device-side kinds (None: ``"cupy"``).
    device : int
        Which device: a GPU id among those the process sees, or a simulated device's id.
    devices : int, optional
        The simulator only: how many devices the simulated host has (None: ``device + 1``).
        A GPU's count is the driver's.

    Raises
    ------
    ConfigurationError
        For an unknown backend name or array type, ``"cuda"`` without a usable GPU, a device
        that does not exist (the message says how many there are), or an array type whose
        library is missing (the message names the extra to install).
    UnknownAllocatorError
        For an unknown allocator name (the message lists the registered ones), or one this
        device cannot make here.
    """
    _check_name(name)
    array_type = parse_array_type(array_type)
    device = parse_device(device)
    if allocator is not None:
        allocator = allocator_or_resource(allocator)
    if name == "auto":
        usable, why = gpu_status()
        name = "cuda" if usable else "simulator"
        log.info("aiocubie backend: %s (%s)", name, why)
        if not usable:
            _warn_simulator_fallback(why)
    if name == "simulator":
        return SimulatorBackend(allocator=allocator, array_type=array_type, device=device, devices=devices)
    usable, why = gpu_status()
    if not usable:
        raise ConfigurationError(f"backend 'cuda' is not usable here: {why}; use 'simulator'")
    count = _driver_devices()[0]
    if device >= count:
        raise ConfigurationError(
            f"no CUDA device {device}: this process sees {count} (ids 0 to {count - 1}; "
            "CUDA_VISIBLE_DEVICES limits them); pass one of those"
        )
    from ._cuda import create_cuda_backend

    return create_cuda_backend(device=device, allocator=allocator or "default", array_type=array_type)


_fallback_warned = False


def _warn_simulator_fallback(why: str) -> None:
    """Say once per process that "auto" found no GPU and fell back to the simulator."""
    global _fallback_warned
    if not _fallback_warned:
        _fallback_warned = True
        warn(
            f"no usable GPU ({why}): backend 'auto' uses the simulator, a CPU model of an "
            f"{DEFAULT_TOTAL >> 30} GiB device. To choose it without this warning, pass backend='simulator' "
            "(MemoryManager('simulator')) or set AIOCUBIE_BACKEND=simulator (default_manager() and the command "
            "line read it); backend='cuda' or AIOCUBIE_BACKEND=cuda requires a GPU"
        )


def select_backend(name: str = "auto") -> tuple[str, str]:
    """Choose ``"cuda"`` or ``"simulator"`` before numba.cuda is imported, and say why.

    For the simulator it sets ``NUMBA_ENABLE_CUDASIM=1``, so numba kernels written for the
    GPU run on the CPU (slowly) on the simulator's arrays. Call it before the first
    ``from numba import cuda`` of the program.

    Parameters
    ----------
    name : {"auto", "simulator", "cuda"}
        ``"auto"``: the GPU when there is a usable one, else the simulator.

    Returns
    -------
    tuple of (str, str)
        The backend name and the reason it was chosen.

    Raises
    ------
    ConfigurationError
        For an unknown name, for ``"cuda"`` without a GPU, or when numba.cuda was already
        imported in the other mode than the one chosen.
    """
    _check_name(name)
    found, why = gpu_status()
    if name == "cuda" and not found:
        raise ConfigurationError(f"backend 'cuda' is not usable here: {why}; use 'simulator'")
    chosen = "cuda" if found and name != "simulator" else "simulator"
    if name == "simulator":
        why = "asked for"
    simulated = chosen == "simulator"
    if "numba.cuda" in sys.modules:  # read numba's choice without importing numba here
        config = sys.modules["numba"].config
        if bool(config.ENABLE_CUDASIM) != simulated:
            raise ConfigurationError(
                f"backend {chosen!r} needs numba.cuda {'with' if simulated else 'without'} its simulator, "
                "but numba.cuda was already imported the other way: choose the backend before importing it"
            )
    elif simulated:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return chosen, why
