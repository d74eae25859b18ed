"""dtypes no GPU array has are refused when the request is made (numpy has them, so the simulator would
compute them correctly and the code would corrupt on a GPU); the message names the dtype and what to use."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from aiocubie import ArrayRequest, MemoryManager
from aiocubie.errors import InvalidRequestError


@pytest.mark.parametrize(
    ("dtype", "words"),
    [
        (">f4", "'>f4' is big-endian: GPU arrays are little-endian; use '<f4' (np.float32)"),
        (">i8", "'>i8' is big-endian: GPU arrays are little-endian; use '<i8' (np.int64)"),
        (np.dtype(">c16"), "big-endian: GPU arrays are little-endian; use '<c16' (np.complex128)"),
        (np.longdouble, "is numpy's long double, not supported on the GPU: use np.float64"),
        (np.clongdouble, "is numpy's long double, not supported on the GPU: use np.complex128"),
        (object, "not supported on the GPU"),
        ([("a", "<f4"), ("b", ">f8")], "structured or sub-array dtype"),
        (("f4", (2,)), "structured or sub-array dtype"),
        ("M8[s]", "not supported on the GPU"),
    ],
)
def test_a_dtype_no_gpu_array_has_is_refused_by_the_request(dtype: Any, words: str) -> None:
    with pytest.raises(InvalidRequestError, match="dtype") as caught:
        ArrayRequest((4,), dtype)
    assert words in str(caught.value)


@pytest.mark.parametrize("dtype", ["float128", "complex256"])
def test_long_double_by_name(dtype: str) -> None:
    if not hasattr(np, dtype):
        pytest.skip(f"numpy has no {dtype} here")
    with pytest.raises(InvalidRequestError, match=f"dtype '{dtype}' is numpy's long double"):
        ArrayRequest((4,), dtype)


@pytest.mark.parametrize("dtype", ["<f4", "=f8", np.float16, "c8", bool, "u8"])
def test_little_endian_gpu_dtypes_are_taken(dtype: Any) -> None:
    assert ArrayRequest((4,), dtype).dtype == np.dtype(dtype)


def test_host_arrays_and_like_refuse_them_too() -> None:
    mgr = MemoryManager("simulator")
    try:
        with pytest.raises(InvalidRequestError, match="big-endian"):
            mgr.host.array((4,), ">f4")
        with pytest.raises(InvalidRequestError, match="big-endian"):
            ArrayRequest.like(np.zeros(4, ">f8"))
    finally:
        mgr.close()
