"""Choosing a backend: "auto" says, once, when it falls back to the simulator; a missing library (numba for
numba arrays, cuda-core for a GPU) is named with the extra that brings it."""

from __future__ import annotations

import warnings

import pytest

from aiocubie import create_backend
from aiocubie._backends import _select
from aiocubie.errors import AiocubieWarning
from aiocubie.simulator import SimulatorBackend


def test_auto_without_a_gpu_warns_once_and_explicit_simulator_never(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_select, "gpu_status", lambda: (False, "no GPU in this test"))
    # private, on purpose: the fallback warns once per process; an earlier test may have used it up
    monkeypatch.setattr(_select, "_fallback_warned", False)
    with pytest.warns(
        AiocubieWarning, match=r"no usable GPU \(no GPU in this test\).*8 GiB.*backend='simulator'"
    ) as record:
        first = create_backend("auto")
    assert isinstance(first, SimulatorBackend)
    assert record[0].filename == __file__  # points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        create_backend("auto").close()  # once per process
        create_backend("simulator").close()
    first.close()


def test_numba_arrays_without_numba_say_which_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from aiocubie.errors import ConfigurationError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba" else real(name, *a))
    with pytest.raises(ConfigurationError, match=r"aiocubie\[numba\]"):
        SimulatorBackend(1 << 20, array_type="numba")
    SimulatorBackend(1 << 20, array_type="cupy").close()  # the CuPy model needs neither numba nor CuPy


def test_the_gpu_skip_reason_names_the_missing_library(monkeypatch: pytest.MonkeyPatch) -> None:
    # issue 22: GPU tests' skip reasons showed an internal import error
    import sys

    import aiocubie._backends._select as select

    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)  # numba's simulator, chosen by earlier tests
    # private, on purpose: the driver probe is faked to play a machine with a GPU (none is public)
    monkeypatch.setattr(select, "_driver_devices", lambda: (1, "1 CUDA device(s)"))
    for name in [name for name in sys.modules if name.startswith(("aiocubie._backends._cuda", "cuda.core"))]:
        monkeypatch.delitem(sys.modules, name)  # imported fresh below (restored after the test)
    monkeypatch.setitem(sys.modules, "cuda.core", None)  # as if cuda-core were not installed
    usable, why = select.gpu_status()
    assert not usable
    assert "'cuda.core' is not installed" in why and "pip install 'aiocubie[cuda12]'" in why
    assert "aiocubie._backends" not in why
