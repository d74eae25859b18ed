"""Issue 22, items 8-10: bad input into the newer entry points gets an AiocubieError naming the value, and
the history follows a member into its new stream group. Each case keeps the red team's reproduction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

import aiocubie as ac
from aiocubie import ArrayRequest, ConfigurationError, InvalidRequestError, RegistrationError

REQUEST = {"x": ArrayRequest((4, 3), np.float32)}


class _Component:
    pass


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: ac.DeviceSet(5, backend="simulator"), "list of device ids"),  # type: ignore[arg-type]
        (lambda: ac.DeviceSet([0], backend=5), "backend must be"),  # type: ignore[arg-type]
        (lambda: ac.DeviceSet([0], backend="simulator", bogus=1), "unknown option(s) 'bogus'"),
        (lambda: ac.DeviceSet([0], backend="simulator", device=1), "unknown option(s) 'device'"),
    ],
)
def test_device_set_refuses_bad_arguments(call: Any, words: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        call()
    assert words in str(caught.value)


@pytest.mark.anyio
async def test_device_set_register_refuses_unknown_options_and_float_devices() -> None:
    async with ac.DeviceSet([0, 1], backend=lambda d: ac.SimulatorBackend(device=d, devices=2)) as devices:
        with pytest.raises(ConfigurationError, match="unknown option"):
            devices.register(_Component(), colour="red")
        with pytest.raises(ConfigurationError, match="device must be a device id"):
            devices.register(_Component(), device=1.0)  # type: ignore[arg-type]
        assert devices.register(_Component(), device=1) == 1


@pytest.mark.parametrize(
    ("requests", "options", "words"),
    [
        (5, {}, "mapping of label -> ArrayRequest"),
        ({"x": 5}, {}, "not an ArrayRequest"),
        ({"x": (3, "f4")}, {}, "not an ArrayRequest"),
        ({1: ArrayRequest((4,), np.float32)}, {}, "labels are strings"),
        (REQUEST, {"labels": 5}, "list of labels"),
        (REQUEST, {"labels": "xy"}, "labels=['xy'] for one"),
    ],
)
def test_walk_requests_refuses_what_is_not_requests(requests: Any, options: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        ac.walk_requests(requests, **options)
    assert words in str(caught.value)


def test_history_load_refuses_non_paths_and_ill_typed_events(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="pass its path"):
        ac.History.load(5)  # type: ignore[arg-type]
    good = {"kind": "plan", "time": 1.0, "group": "g", "nbytes": 8}
    data = {"format": 1, "wall_base": 0.0, "max_entries": 10, "dropped": 0, "events": [good]}
    path = tmp_path / "h.json"
    path.write_text(json.dumps(data))
    assert ac.History.load(path).events[0].time == 1.0
    for field, value in (("time", "soon"), ("time", float("nan")), ("nbytes", "8"), ("group", 3), ("chunks", 1.5)):
        path.write_text(json.dumps({**data, "events": [{**good, field: value}]}))
        with pytest.raises(ConfigurationError, match=field):
            ac.History.load(path)


@pytest.mark.anyio
async def test_record_history_refuses_a_ring_it_cannot_allocate() -> None:
    async with ac.MemoryManager("simulator") as mgr:
        for size in (2**62, 10_000_001, 0):
            with pytest.raises(ConfigurationError, match="from 1 to 10,000,000"):
                mgr.record_history(max_entries=size)


@pytest.mark.anyio
async def test_names_that_utf8_cannot_write_are_refused() -> None:
    async with ac.MemoryManager("simulator") as mgr:
        with pytest.raises(RegistrationError, match="cannot be written as UTF-8"):
            mgr.register(_Component(), name="a\udcff")
        with pytest.raises(RegistrationError, match="cannot be written as UTF-8"):
            mgr.register(_Component(), stream_group="g\ud800")


@pytest.mark.anyio
async def test_history_series_follow_a_member_into_its_new_group() -> None:
    async with ac.MemoryManager("simulator") as mgr:
        mgr.record_history()
        component = _Component()
        mgr.register(component, stream_group="a", name="c")
        response = await mgr.request(component, {"x": ArrayRequest((1000,), np.float32)})
        mgr.change_stream_group(component, "b")
        await anyio.sleep(0)
        mgr.release(response)
        series = {group: values for group, (_times, values) in mgr.history().series().items()}
    assert series == {"a": [4000, 0], "b": [4000, 0]}  # a gives the bytes up at the move, b holds them until release
