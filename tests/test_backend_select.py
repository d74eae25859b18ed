"""Choosing a backend: "auto" says, once, when it falls back to the simulator."""

from __future__ import annotations

import warnings

import pytest

from aiocubie import AiocubieWarning, SimulatorBackend, _backends, create_backend


def test_auto_without_a_gpu_warns_once_and_explicit_simulator_never(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_backends, "gpu_status", lambda: (False, "no GPU in this test"))
    monkeypatch.setattr(_backends, "_fallback_warned", False)
    with pytest.warns(AiocubieWarning, match=r"no usable GPU \(no GPU in this test\).*8 GiB.*backend='simulator'") as record:
        first = create_backend("auto")
    assert isinstance(first, SimulatorBackend)
    assert record[0].filename == __file__  # points at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        create_backend("auto").close()  # once per process
        create_backend("simulator").close()
    first.close()
