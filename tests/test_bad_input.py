"""Bad input into the edges (pictures, histories, walks, device sets, requests, frees) gets the library's
error, naming what was given, what there is and what to do: never a raw AttributeError or TypeError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from simkit import Part

import aiocubie as ac
from aiocubie import ArrayRequest, MemoryManager, walk_requests
from aiocubie.errors import ConfigurationError, InvalidRequestError

REQUEST = {"x": ArrayRequest((4, 3), np.float32)}


def test_render_history_refuses_what_is_not_a_history(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"render_history draws a History, got 5: pass mgr.history\(\)"):
        ac.stats.render_history(5, tmp_path / "h.html")  # type: ignore[arg-type]
    assert not (tmp_path / "h.html").exists()


def test_history_load_names_the_file_the_event_and_the_value(tmp_path: Path) -> None:
    good = {"kind": "plan", "time": 1.0, "group": "g", "nbytes": 8}
    data = {"format": 1, "wall_base": 0.0, "max_entries": 10, "dropped": 0, "events": [good, {**good, "time": "soon"}]}
    path = tmp_path / "history.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError) as caught:
        ac.stats.History.load(path)
    message = str(caught.value)
    assert repr(str(path)) in message and "event 1 ('plan')" in message and "time='soon'" in message


def test_history_load_refuses_non_paths_and_ill_typed_events(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="pass its path"):
        ac.stats.History.load(5)  # type: ignore[arg-type]
    good = {"kind": "plan", "time": 1.0, "group": "g", "nbytes": 8}
    data = {"format": 1, "wall_base": 0.0, "max_entries": 10, "dropped": 0, "events": [good]}
    path = tmp_path / "h.json"
    path.write_text(json.dumps(data))
    assert ac.stats.History.load(path).events[0].time == 1.0
    for field, value in (("time", "soon"), ("time", float("nan")), ("nbytes", "8"), ("group", 3), ("chunks", 1.5)):
        path.write_text(json.dumps({**data, "events": [{**good, field: value}]}))
        with pytest.raises(ConfigurationError, match=field):
            ac.stats.History.load(path)


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


def test_walk_requests_refuses_a_tuple_for_a_request() -> None:
    with pytest.raises(InvalidRequestError, match=r"request 'x' is \(3, 'f4'\), not an ArrayRequest"):
        walk_requests({"x": (3, "f4")})  # type: ignore[dict-item]


@pytest.mark.parametrize("labels", [[["x"]], [1], ["x", None]])
def test_walk_requests_refuses_labels_that_are_not_labels(labels: Any) -> None:
    with pytest.raises(InvalidRequestError, match="which is not a label: labels is a flat list") as caught:
        ac.walk_requests({"x": ArrayRequest((4, 2), "f4")}, labels=labels)
    assert "labels=['x']" in str(caught.value)


@pytest.mark.parametrize("device", [1.0, True, "1"])
def test_device_set_manager_takes_device_numbers_only(device: Any) -> None:
    devices = ac.DeviceSet([0, 1], backend=lambda d: ac.simulator.SimulatorBackend(device=d, devices=2))
    try:
        with pytest.raises(ConfigurationError, match=f"device must be a device number .*got {device!r}"):
            devices.manager(device)
        assert devices.manager(np.int64(1)) is devices.manager(1)  # type: ignore[arg-type]
    finally:
        devices.close()


@pytest.mark.anyio
@pytest.mark.parametrize("given", [[1.0, 2.0, 3.0, 4.0], (1, 2, 3)])
async def test_a_list_as_a_walk_input_is_called_a_list(anyio_backend: str, given: Any) -> None:
    async with MemoryManager("simulator") as mgr:
        part = Part()
        mgr.register(part)
        response = await mgr.request(part, {"x": ArrayRequest((4,), np.float32)})
        with pytest.raises(InvalidRequestError) as caught:
            async for _ in ac.walk_chunks(response, inputs={"x": given}):
                pass
        message = str(caught.value)
        assert f"inputs['x'] is a {type(given).__name__}, read as" in message
        assert "as a numpy array (np.asarray(x, dtype=np.float32))" in message


@pytest.mark.anyio
async def test_a_request_for_no_arrays_is_refused_at_the_call(anyio_backend: str) -> None:
    async with MemoryManager("simulator") as mgr:
        part = Part()
        mgr.register(part)
        with pytest.raises(InvalidRequestError, match="hold no array") as caught:
            mgr.request(part, {})
        assert "ready_hook" in str(caught.value)
        with pytest.raises(InvalidRequestError, match="hold no array"):
            mgr.allocate(part, {})
