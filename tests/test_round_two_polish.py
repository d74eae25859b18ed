"""Issue 22's polish items that are not about a loop: messages that say what to do, types, docs.

Each test keeps the shape of what the new user tried.
"""

from __future__ import annotations

import inspect
import re
import typing

import numpy as np
import pytest

from aiocubie import ArrayRequest, InvalidRequestError, walk_requests
from aiocubie._backends._sim import SimCupyArray


def test_walk_requests_refuses_a_tuple_for_a_request() -> None:
    with pytest.raises(InvalidRequestError, match=r"request 'x' is \(3, 'f4'\), not an ArrayRequest"):
        walk_requests({"x": (3, "f4")})  # type: ignore[dict-item]


def test_a_swapped_shape_and_dtype_says_so() -> None:
    with pytest.raises(InvalidRequestError, match=r"shape 'f4' is a dtype.*ArrayRequest\(shape, dtype\) \(swapped\?\)"):
        ArrayRequest("f4", (3, 4))  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="holds 'a', which is not an integer"):
        ArrayRequest("ab", "f4")  # type: ignore[arg-type]  # not a dtype: the usual message


def test_array_request_parameters_are_typed() -> None:
    hints = typing.get_type_hints(ArrayRequest.__init__)
    assert hints["shape"] != typing.Any and hints["unchunkable"] is bool and hints["zero"] is bool
    assert "Sequence" in str(inspect.signature(ArrayRequest).parameters["shape"].annotation)


@pytest.mark.parametrize(
    "mix",
    [
        lambda a, h: a.__setitem__(slice(None), h),
        lambda a, h: a + h,
        lambda a, h: np.asarray(a),
    ],
    ids=["assign", "add", "asarray"],
)
def test_numpy_into_a_simulated_cupy_array_says_what_to_do(mix: typing.Any) -> None:
    device = SimCupyArray(np.zeros(3))
    with pytest.raises((TypeError, ValueError), match=r"\.set\(|\.get\(\)") as info:
        mix(device, np.ones(3))
    assert "mgr.to_device" in str(info.value) or "mgr.from_device" in str(info.value)


def test_info_says_the_simulator_models_cupy_arrays() -> None:
    # issue 22: `info` printed "arrays cupy" beside "cupy not installed"
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "aiocubie", "info"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "AIOCUBIE_BACKEND": "simulator"},
    ).stdout
    assert "backend" in out and "simulator" in out
    assert re.search(r"arrays\s+cupy \(the simulator's model; CuPy itself is not needed\)", out)


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
