"""Options: every manager option is parsed once, in one place, with one error type."""

from __future__ import annotations

import math

import pytest
from simkit import needs_numba

from aiocubie import LimitMode, MemoryManager, Options, Policy
from aiocubie.errors import ConfigurationError
from aiocubie.simulator import SimulatorBackend


def test_defaults() -> None:
    options = Options()
    assert (options.mode, options.policy) == (LimitMode.PASSIVE, Policy.CHUNK)
    assert (options.headroom, options.batch_window, options.max_batch, options.free_cache_seconds) == (
        0.05,
        0.002,
        None,
        0.05,
    )
    assert not options.active and not options.waits


def test_names_become_enums() -> None:
    options = Options(mode="active", policy="wait")
    assert options.mode is LimitMode.ACTIVE and options.policy is Policy.WAIT
    assert options.active and options.waits


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mode", "lazy"),
        ("mode", "Active"),
        ("policy", "retry"),
        ("policy", None),
        ("headroom", 1.0),
        ("headroom", -0.1),
        ("headroom", True),
        ("headroom", "0.1"),
        ("batch_window", -1),
        ("batch_window", math.inf),
        ("batch_window", math.nan),
        ("free_cache_seconds", -0.5),
        ("max_batch", 0),
        ("max_batch", 2.5),
        ("max_batch", True),
    ],
)
def test_bad_values_raise_configuration_error_naming_them(field: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=field.split("_")[0] if field != "mode" else "limit mode") as info:
        Options(**{field: value})
    assert repr(value) in str(info.value)


def test_replace_validates_again_and_leaves_the_original() -> None:
    options = Options()
    assert options.replace(policy="fail").policy is Policy.FAIL
    with pytest.raises(ConfigurationError, match="'nope'"):
        options.replace(mode="nope")
    assert options.policy is Policy.CHUNK


def test_options_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Options().policy = Policy.FAIL  # type: ignore[misc]


def test_manager_settings_have_one_way_in() -> None:
    mgr = MemoryManager(SimulatorBackend(1 << 20), mode="active")
    mgr.budget.set_policy("fail")
    assert mgr.budget.policy is Policy.FAIL and mgr.options.policy is Policy.FAIL
    with pytest.raises(AttributeError):
        mgr.budget.policy = "wait"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        mgr.budget.mode = "passive"  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match="'sometimes'"):
        mgr.budget.set_policy("sometimes")
    with pytest.raises(ConfigurationError, match="'lazy'"):
        mgr.budget.set_mode("lazy")
    assert mgr.budget.policy is Policy.FAIL and mgr.budget.mode is LimitMode.ACTIVE
    mgr.close()


@needs_numba
def test_array_type_is_chosen_per_manager() -> None:
    for array_type in ("cupy", "numba"):
        mgr = MemoryManager("simulator", array_type=array_type)
        assert mgr.backend.array_type == array_type
        mgr.close()
    with pytest.raises(ConfigurationError, match="'tensor'"):
        MemoryManager("simulator", array_type="tensor")
    sim = SimulatorBackend(1 << 20, array_type="numba")
    with pytest.raises(ConfigurationError, match="hands out 'numba' arrays"):
        MemoryManager(sim, array_type="cupy")
    assert MemoryManager(sim, array_type="numba").backend is sim
    sim.close()


# issue 11 item 14: numbers no float holds are ConfigurationErrors naming them, not OverflowError
@pytest.mark.parametrize("name", ["batch_window", "free_cache_seconds", "headroom"])
@pytest.mark.parametrize("value", [10**400, -(10**400), 10**309])
def test_numbers_no_float_holds_are_configuration_errors(name: str, value: int) -> None:
    with pytest.raises(ConfigurationError, match=f"{name} must be") as info:
        Options(**{name: value})
    assert "digits" in str(info.value) and len(str(info.value)) < 200
    sim = SimulatorBackend(1 << 20)
    try:
        with pytest.raises(ConfigurationError, match=f"{name} must be"):
            MemoryManager(sim, **{name: value})
    finally:
        sim.close()


def test_exact_numbers_that_fit_are_accepted() -> None:
    from fractions import Fraction

    import numpy as np

    options = Options(batch_window=Fraction(1, 500), free_cache_seconds=np.float32(0.25), headroom=np.int64(0))
    assert (options.batch_window, options.free_cache_seconds, options.headroom) == (0.002, 0.25, 0.0)
    assert type(options.batch_window) is float and type(options.headroom) is float


def test_each_name_is_parsed_in_one_place() -> None:
    from aiocubie import _backends, _names, _options
    from aiocubie._options import Setup

    # the names the options accept are those the backends know: one list each, on the ground floor
    # (allocators: the backends' registry)
    assert (_backends.BACKENDS, _backends.ARRAY_TYPES) == (_names.BACKENDS, _names.ARRAY_TYPES)
    assert _options.parse_allocator is _backends.parse_allocator
    setup = Setup.read(
        None,
        given_backend=None,
        device=None,
        mode=None,
        allocator=None,
        array_type="numba",
        environ={"AIOCUBIE_BACKEND": "simulator", "AIOCUBIE_MODE": "active", "AIOCUBIE_HISTORY": "run.json"},
    )
    assert (setup.backend, setup.device, setup.allocator, setup.array_type) == ("simulator", None, None, "numba")
    assert setup.options.mode is LimitMode.ACTIVE and setup.history == "run.json"
    assert "simulator" in _names.BACKENDS
    for name, value, match in [
        ("backend", "gpu", "unknown backend 'gpu'"),
        ("backend", 3, "unknown backend 3"),
        ("device", -1, "device must be a device number"),
        ("device", True, "device must be a device number"),
        ("allocator", "tcmalloc", "unknown allocator 'tcmalloc'"),
        ("array_type", "torch", "unknown array type 'torch'"),
    ]:
        arguments = {"backend": "auto", "device": None, "mode": None, "allocator": None, "array_type": None}
        with pytest.raises(ConfigurationError, match=match):
            Setup.read(**{**arguments, name: value}, given_backend=None, environ={})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="AIOCUBIE_ALLOCATOR='slab'"):
        Setup.read(None, given_backend=None, device=None, mode=None, allocator=None, array_type=None,
                   environ={"AIOCUBIE_ALLOCATOR": "slab"})  # fmt: skip
    # a backend object keeps its own allocator: the variable is not read for it
    given = Setup.read(
        None, given_backend=(0, "cupy"), device=None, mode=None, allocator=None, array_type=None,
        environ={"AIOCUBIE_ALLOCATOR": "slab"},
    )  # fmt: skip
    assert given.backend is None and given.allocator is None
