"""The CUDA backend's one error map, without a GPU: foreign errors become aiocubie's, others pass.

Needs cuda-bindings and cuda-core 1.2+ importable (they come with the GPU extras and with numba-cuda);
skipped otherwise.
"""

from __future__ import annotations

import pytest

from aiocubie._errors import AllocationError, BackendError, OutOfMemoryError

pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
pytest.importorskip("cuda.core", minversion="1.2", reason="cuda-core 1.2 or newer is not installed")

from aiocubie._backends._cuda._errors import check, is_oom, map_exceptions, translate


def foreign(module: str, name: str = "CUDAError", base: type[Exception] = RuntimeError) -> type[Exception]:
    """An exception class that says it comes from ``module`` (as cuda.core's, CuPy's, numba's do)."""
    return type(name, (base,), {"__module__": module})


@pytest.mark.parametrize(
    ("error", "oom"),
    [
        (foreign("cuda.core._utils.cuda_utils")("CUDA_ERROR_OUT_OF_MEMORY: out of memory"), True),
        (foreign("cuda.core._utils.cuda_utils")("CUDA_ERROR_INVALID_VALUE: bad"), False),
        (foreign("cupy.cuda.memory", "OutOfMemoryError", MemoryError)("Out of memory allocating 1 bytes"), True),
        (foreign("cupy_backends.cuda.api.runtime", "CUDARuntimeError")("cudaErrorInvalidValue"), False),
        (foreign("numba.cuda.cudadrv.driver", "CudaAPIError")("[2] Call to cuMemAlloc results in UNKNOWN"), False),
    ],
)
def test_foreign_errors_become_aiocubies(error: Exception, oom: bool) -> None:
    assert is_oom(error) == oom
    with pytest.raises(OutOfMemoryError if oom else BackendError, match="allocating 64 bytes") as info:
        with map_exceptions("allocating 64 bytes", lambda: "10 of 20 bytes free"):
            raise error
    assert info.value.__cause__ is error
    assert "10 of 20 bytes free" in str(info.value)
    if oom:
        assert isinstance(info.value, AllocationError)


def test_numbas_out_of_memory_code_is_recognised() -> None:
    from cuda.bindings import driver as binding

    error = foreign("numba.cuda.cudadrv.driver", "CudaAPIError")("out of memory")
    error.code = binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY  # type: ignore[attr-defined]
    assert is_oom(error)


def test_other_errors_pass_unchanged() -> None:
    with pytest.raises(TypeError):
        with map_exceptions("copying"):
            raise TypeError("a bad argument is the caller's bug, not the device's")
    assert translate(ValueError("x"), "anything") is None
    assert translate(BackendError("already ours"), "anything") is None


def test_a_detail_that_fails_never_hides_the_error() -> None:
    def broken() -> str:
        raise RuntimeError("cannot read free memory")

    mapped = translate(foreign("cupy.cuda.memory", "OutOfMemoryError", MemoryError)("oom"), "allocating", broken)
    assert isinstance(mapped, OutOfMemoryError) and "cannot read" not in str(mapped)


def test_check_maps_driver_results() -> None:
    from cuda.bindings import driver as binding

    check((binding.CUresult.CUDA_SUCCESS,), "nothing")
    with pytest.raises(OutOfMemoryError, match="pinning"):
        check((binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY,), "pinning 1 byte")
    with pytest.raises(BackendError, match="CUDA_ERROR_INVALID_VALUE"):
        check((binding.CUresult.CUDA_ERROR_INVALID_VALUE,), lambda: "copying")
