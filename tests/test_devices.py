"""Several devices on the simulator: a backend and a manager per device, and the DeviceSet: its placement,
its statistics, closing it, and the arguments it refuses (to build it and to register)."""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
from simkit import ByHand, ignore_waits_on_itself

import aiocubie as ac
from aiocubie import ArrayRequest, DeviceSet, MemoryKind, MemoryManager, create_backend, device_count
from aiocubie.errors import (
    BackendError,
    ConfigurationError,
    InvalidRequestError,
    ManagerStateError,
    RegistrationError,
)
from aiocubie.simulator import SimulatorBackend

MiB = 1 << 20


class Component:
    """A registrable stand-in for a solver."""


def test_each_simulated_device_has_its_own_memory() -> None:
    devices = [SimulatorBackend(total=(k + 1) * 64 * MiB, device=k, devices=2) for k in range(2)]
    stream = devices[0].device.create_stream()
    mem = ByHand(devices[0])
    array = mem.allocate((MiB,), np.dtype(np.float32), MemoryKind.DEVICE, stream)
    assert (devices[0].used, devices[1].used) == (4 * MiB, 0)
    assert [d.device.memory_info().total for d in devices] == [64 * MiB, 128 * MiB]
    assert [d.device.device_id for d in devices] == [0, 1] and "device 1 of 2" in devices[1].device.device_name
    mem.free(array)
    for device in devices:
        device.close()


def test_managed_prefetch_to_another_device_and_unknown_ids() -> None:
    sim = SimulatorBackend(total=64 * MiB, device=0, devices=2)
    stream = sim.device.create_stream()
    array = ByHand(sim).allocate((1024,), np.dtype(np.float32), MemoryKind.MANAGED, stream)
    sim.device.prefetch(array, 1, stream)
    sim.device.advise(array, "preferred_location", 1)
    sim.device.prefetch(array, None, stream)
    with pytest.raises(BackendError, match=r"no device 2 on this simulated host: it has 2 \(ids 0 to 1\)"):
        sim.device.prefetch(array, 2, stream)
    with pytest.raises(BackendError, match="no device 5"):
        sim.device.advise(array, "accessed_by", 5)
    sim.device.record_event(stream).synchronize()
    sim.close()


@pytest.mark.parametrize(
    ("device", "devices", "match"),
    [(2, 2, "an int > device"), (-1, None, "device must be a device number"), (0, 0, "devices must be")],
)
def test_simulator_refuses_a_device_it_does_not_have(device: int, devices: int | None, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        SimulatorBackend(device=device, devices=devices)


def test_create_backend_and_manager_on_a_device() -> None:
    backend = create_backend("simulator", device=3, devices=4)
    assert (backend.device.device_id, backend.device.devices) == (3, 4)  # type: ignore[attr-defined]
    mgr = MemoryManager("simulator", device=1)
    assert mgr.device == 1 and mgr.backend.device.device_id == 1
    with pytest.raises(ConfigurationError, match="device=0 but the backend given drives device 3"):
        MemoryManager(backend, device=0)
    with pytest.raises(ConfigurationError, match="device must be a device number"):
        create_backend("simulator", device=-1)
    assert MemoryManager(backend).device == 3
    assert device_count("simulator") == 1
    mgr.close()
    backend.close()


@pytest.mark.anyio
async def test_a_managers_prefetch_goes_to_its_own_device_by_default() -> None:
    sim = SimulatorBackend(total=64 * MiB, device=1, devices=2)
    async with MemoryManager(sim) as mgr:
        c = Component()
        mgr.register(c)
        response = await mgr.request(c, {"m": ArrayRequest((256,), np.float32, kind="managed")})
        await mgr.host.prefetch(c, response.arrays["m"])  # to device 1, its own
        await mgr.host.prefetch(c, response.arrays["m"], 0)
        mgr.host.advise(response.arrays["m"], "preferred_location")
        with mgr.on_device():
            pass  # the simulator has nothing to switch
        with pytest.raises(BackendError, match="no device 2"):
            await mgr.host.prefetch(c, response.arrays["m"], 2)
        mgr.release(response)
    sim.close()


def _set(totals: list[int], **options: object) -> DeviceSet:
    return DeviceSet(
        range(len(totals)),
        backend=lambda d: SimulatorBackend(total=totals[d], device=d, devices=len(totals)),
        **options,
    )


@pytest.mark.anyio
async def test_placement_explicit_then_fewest_members_then_most_free_then_lowest_id() -> None:
    async with _set([64 * MiB, 64 * MiB, 64 * MiB]) as devices:
        assert devices.devices == (0, 1, 2)
        # equal members and free memory: the lowest id
        a = Component()
        assert devices.register(a) == 0
        # explicit device, whatever the counts
        b = Component()
        assert devices.register(b, device=0, stream_group="b") == 0
        # fewest members: 1 and 2 have none; equal free: the lower id
        c, d = Component(), Component()
        assert devices.register(c) == 1 and devices.register(d) == 2
        assert devices.members() == {0: 2, 1: 1, 2: 1}
        # 1 and 2 tie on members: the one with more free memory wins
        held = await devices.request(c, {"x": ArrayRequest((4 * MiB,), np.float32)})
        e = Component()
        assert devices.register(e) == 2
        assert devices.device_of(e) == 2 and devices.manager_of(c) is devices.manager(1)
        devices.manager(1).release(held)
        with pytest.raises(RegistrationError, match="registered on device 2 already"):
            devices.register(e)
        devices.unregister(e)
        with pytest.raises(RegistrationError, match="not registered with this device set"):
            devices.manager_of(e)
        with pytest.raises(ConfigurationError, match=r"device 7 is not in this set: it holds \[0, 1, 2\]"):
            devices.register(Component(), device=7)


@pytest.mark.anyio
async def test_a_device_set_request_takes_the_managers_keywords() -> None:
    async with _set([MiB, MiB]) as devices:
        c = Component()
        devices.register(c, device=1, priority=1)
        async with devices.request(c, {"x": ArrayRequest((16,), np.float32)}, priority=7) as response:
            assert response.lease.priority == 7
        await (await devices.request(c, {"x": ArrayRequest((16,), np.float32)})).aclose()
        assert sorted(devices.manager(1).stats().waits_by_priority) == [1, 7]
        with pytest.raises(InvalidRequestError, match="priority"):
            devices.request(c, {"x": ArrayRequest((16,), np.float32)}, priority=1.5)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_free_memory_breaks_a_tie_when_another_process_holds_memory() -> None:
    backends = [SimulatorBackend(total=64 * MiB, device=d, devices=2) for d in range(2)]
    backends[0].occupy(8 * MiB)  # "another process" on device 0
    async with DeviceSet([0, 1], backend=lambda d: backends[d]) as devices:
        a, b = Component(), Component()  # held: a collected component leaves its device
        assert devices.place() == 1 and devices.register(a) == 1
        assert devices.register(b) == 0  # now device 0 has fewer members
    for backend in backends:
        backend.close()


def test_device_set_refuses_bad_device_lists() -> None:
    for bad, match in [([], "at least one"), ([0, 0], "each device once"), ([0, -1], "an int >= 0"), ("some", "'all'")]:
        with pytest.raises(ConfigurationError, match=match):
            DeviceSet(bad, backend="simulator")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="needs a backend name"):
        DeviceSet("all", backend=lambda d: SimulatorBackend(device=d))
    assert DeviceSet("all", backend="simulator").devices == (0,)  # the simulator: one device


@pytest.mark.anyio
@pytest.mark.parametrize("count", [2, 4, 8])
@ignore_waits_on_itself  # three tasks a component: one waits on what another of them holds
async def test_per_device_stats_and_budgets_held_under_load(count: int) -> None:
    """Many tasks on 2, 4 and 8 devices in active mode: placement spreads them evenly and no group ever
    holds more than its caps, on any device (issue 24: a whole node, on the simulator)."""
    total = 64 * MiB
    async with _set([total] * count, mode="active", policy="wait", batch_window=0) as devices:
        components = [Component() for _ in range(4 * count)]
        for i, c in enumerate(components):
            devices.register(c, stream_group=f"g{i % 2}", proportion=0.1)
        assert devices.members() == dict.fromkeys(range(count), 4)

        async def work(c: Component, rounds: int) -> None:
            for _ in range(rounds):
                request = {"x": ArrayRequest((1024, 1024), np.float32, chunk_axis=0)}  # 4 MiB, cap 6.4 MiB
                async with devices.request(c, request) as response:
                    assert response.arrays["x"].nbytes <= 0.1 * total
                    await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            for c in components:
                for _ in range(3):
                    tg.start_soon(work, c, 5)
        stats = devices.stats()
        assert set(stats) == set(range(count))
        for snapshot in stats.values():
            assert snapshot.live_bytes == 0 and snapshot.peak_bytes > 0
            for group in snapshot.groups.values():
                assert group.cap_bytes is not None and group.peak_bytes <= group.cap_bytes
        assert sum(g.requests for s in stats.values() for g in s.groups.values()) == 4 * count * 3 * 5


def test_device_set_refuses_a_backend_of_another_device_and_a_bool_device() -> None:
    # every manager would drive device 0 while the set named them 0 and 1
    with pytest.raises(ConfigurationError, match=r"backend\(1\) drives device 0"):
        DeviceSet([0, 1], backend=lambda d: SimulatorBackend(total=MiB))
    devices = DeviceSet([0, 1], backend=lambda d: SimulatorBackend(total=MiB, device=d, devices=2))
    try:
        with pytest.raises(
            ConfigurationError, match=r"device must be a device number \(an int >= 0, e\.g\. 0\), got True"
        ):
            devices.register(Component(), device=True)  # True == 1 as a key: refused like DeviceSet([True])
        with pytest.raises(ConfigurationError, match="device must be a device number"):
            devices.manager(True)
        assert devices.members() == {0: 0, 1: 0}
    finally:
        devices.close()


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
    async with ac.DeviceSet([0, 1], backend=lambda d: ac.simulator.SimulatorBackend(device=d, devices=2)) as devices:
        with pytest.raises(ConfigurationError, match="unknown option"):
            devices.register(Component(), colour="red")
        with pytest.raises(ConfigurationError, match="device must be a device number"):
            devices.register(Component(), device=1.0)  # type: ignore[arg-type]
        assert devices.register(Component(), device=1) == 1


def test_closing_a_device_set_closes_every_manager_even_when_one_fails() -> None:
    devices = DeviceSet([0, 1], backend=lambda d: SimulatorBackend(total=MiB, device=d, devices=2))
    first = devices.manager(0)

    def broken() -> None:
        raise RuntimeError("device 0 would not close")

    first.close = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="would not close"):
        devices.close()
    with pytest.raises(ManagerStateError, match="closed with close"):
        anyio.run(devices.manager(1).__aenter__)
