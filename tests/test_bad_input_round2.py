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
        with pytest.raises(ConfigurationError, match="device must be a device number"):
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


@pytest.mark.anyio
@pytest.mark.parametrize("value", [None, 5, "solver", b"x", (1, 2), 1.5, True])
async def test_register_refuses_values_that_are_not_components(value: object) -> None:
    async with ac.MemoryManager("simulator") as mgr:
        with pytest.raises(RegistrationError, match="register the component object itself"):
            mgr.register(value)
        assert not mgr.statistics().members


@pytest.mark.anyio
async def test_an_auto_pool_left_short_with_no_member_says_what_it_means() -> None:
    async with ac.MemoryManager("simulator") as mgr:
        first, second = _Component(), _Component()  # held: a collected component leaves its share
        mgr.register(first, proportion=0.5)
        with pytest.warns(ac.AiocubieWarning, match="allowed while no member is in the auto pool"):
            mgr.register(second, proportion=0.5)


def test_a_warning_from_a_batch_the_group_task_closed_points_at_the_programs_line(tmp_path: Path) -> None:
    # the batch is planned in the group's task (two requesters, a batch window): no user frame is on the
    # stack, so the warning points past the event loop's frames, at the line that started it
    script = tmp_path / "program.py"
    script.write_text(
        "import warnings\n"
        "import anyio, numpy as np\n"
        "import aiocubie as ac\n"
        "async def main():\n"
        "    async with ac.MemoryManager(ac.SimulatorBackend(1 << 20), batch_window=0.01, policy='wait') as mgr:\n"
        "        a, b = type('A', (), {})(), type('B', (), {})()\n"
        "        mgr.register(a); mgr.register(b)\n"
        "        held = await mgr.request(a, {'x': ac.ArrayRequest((700_000,), np.uint8, unchunkable=True)})\n"
        "        async def ask(x):  # a batch of both waits on what a holds: the self-wait warning\n"
        "            with anyio.move_on_after(0.1):\n"
        "                await mgr.request(x, {'x': ac.ArrayRequest((200_000,), np.uint8, unchunkable=True)})\n"
        "        async with anyio.create_task_group() as tg:\n"
        "            tg.start_soon(ask, a)\n"
        "            tg.start_soon(ask, b)\n"
        "        mgr.release(held)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    anyio.run(main)  # line 18\n"
        "print(*{(w.filename, w.lineno) for w in caught if issubclass(w.category, ac.AiocubieWarning)})\n"
    )
    import subprocess
    import sys

    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str((str(script), 18)), result.stdout
