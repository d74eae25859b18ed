"""aiocubie's pytest plugin: the fixtures of :mod:`aiocubie.testing`, loaded lazily.

Installed with aiocubie, it loads in every pytest session (a ``pytest11`` entry point named
``aiocubie.testing``, so an explicit ``pytest_plugins = ["aiocubie.testing"]`` is a no-op). It
lives outside the ``aiocubie`` package so that loading it imports neither aiocubie nor numpy:
a session that uses no aiocubie fixture pays nothing (it cost about 0.2 s a session). The
fixtures import aiocubie when they are set up. It never imports numba.cuda.
See :mod:`aiocubie.testing` for the fixtures and how to use them, and :mod:`.session_broker`
for ``--aiocubie-broker`` (one node broker shared by the workers of ``pytest -n N``).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from . import session_broker

if TYPE_CHECKING:
    from aiocubie import MemoryManager
    from aiocubie.simulator import Faults, SimulatorBackend

__all__ = [
    "DEFAULTS",
    "aiocubie_config",
    "aiocubie_faults",
    "aiocubie_manager",
    "aiocubie_manager_factory",
    "aiocubie_simulator",
]

#: Settings of the fixtures' simulator and manager; ``@pytest.mark.aiocubie(...)`` overrides
#: them, and the factory takes the same names (plus any other MemoryManager option).
DEFAULTS: dict[str, Any] = {
    "total": 64 << 20,  # small, so that tests chunk without huge arrays
    "latency": 0.0,
    "granule": 0,
    "reserved": 0,
    "mode": "passive",
    "policy": "chunk",
    "headroom": 0.05,
    "batch_window": 0.002,
}
_SIMULATOR_OPTIONS = ("total", "latency", "granule", "reserved", "array_type")


def pytest_addoption(parser: pytest.Parser) -> None:
    session_broker.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "aiocubie(**settings): simulator and manager settings for aiocubie's fixtures "
        "(total, latency, granule, reserved, array_type, mode, policy, headroom, batch_window, ...)",
    )
    session_broker.configure(config)


def _split(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    simulator = {k: v for k, v in settings.items() if k in _SIMULATOR_OPTIONS}
    manager = {k: v for k, v in settings.items() if k not in _SIMULATOR_OPTIONS}
    return simulator, manager


def _simulator(options: dict[str, Any]) -> SimulatorBackend:
    from aiocubie.simulator import SimulatorBackend  # here, not at import: see the module's docstring

    return SimulatorBackend(**options)


@contextlib.asynccontextmanager
async def _running(simulator: SimulatorBackend, options: dict[str, Any]) -> AsyncIterator[MemoryManager]:
    from aiocubie import MemoryManager

    async with MemoryManager(simulator, **options) as mgr:
        yield mgr


@pytest.fixture
def aiocubie_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The settings for this test: :data:`DEFAULTS` updated by ``@pytest.mark.aiocubie``."""
    settings = dict(DEFAULTS)
    # The closest marker wins: a test's own over its class's over its module's.
    for marker in reversed(list(request.node.iter_markers("aiocubie"))):
        if marker.args:
            raise pytest.UsageError(f"@pytest.mark.aiocubie takes keyword settings only, got {marker.args!r}")
        settings.update(marker.kwargs)
    _check_names(settings, "@pytest.mark.aiocubie")
    return settings


def _check_names(settings: dict[str, Any], where: str) -> None:
    """Refuse a setting that neither the simulator nor the manager takes, naming the close ones."""
    from aiocubie import MemoryManager

    known = set(_SIMULATOR_OPTIONS) | set(inspect.signature(MemoryManager).parameters) - {"backend"}
    unknown = sorted(set(settings) - known)
    if unknown:
        close = {name: difflib.get_close_matches(name, sorted(known), n=1) for name in unknown}
        hints = "; ".join(
            f"{name!r}" + (f" (did you mean {match[0]!r}?)" if match else "") for name, match in close.items()
        )
        raise pytest.UsageError(f"{where} got unknown settings: {hints}. Known: {', '.join(sorted(known))}")


@pytest.fixture
def aiocubie_simulator(aiocubie_config: dict[str, Any]) -> Iterator[SimulatorBackend]:
    """A :class:`SimulatorBackend` with the test's ``total``, ``latency``, ``granule`` and ``reserved``."""
    simulator = _simulator(_split(aiocubie_config)[0])
    yield simulator
    simulator.close()


@pytest.fixture
def aiocubie_faults(aiocubie_simulator: SimulatorBackend) -> Faults:
    """Fault injection into ``aiocubie_simulator`` (and so into ``aiocubie_manager``)."""
    return aiocubie_simulator.faults


@pytest.fixture
def aiocubie_manager(request: pytest.FixtureRequest) -> MemoryManager:
    """A running MemoryManager on ``aiocubie_simulator`` (for tests run by anyio's plugin).

    A plain fixture that checks first: under pytest-asyncio (strict mode or auto) an async
    fixture would fail with pytest's generic "no plugin" error instead of this one.
    """
    if "anyio_backend" not in request.fixturenames:  # before anything is entered: nothing to unwind
        raise pytest.UsageError(
            "aiocubie_manager runs under anyio's pytest plugin (@pytest.mark.anyio); under pytest-asyncio "
            "use aiocubie_asyncio_manager, or aiocubie_manager_factory inside the test"
        )
    manager: MemoryManager = request.getfixturevalue("_aiocubie_anyio_manager")
    return manager


@pytest.fixture
async def _aiocubie_anyio_manager(
    aiocubie_simulator: SimulatorBackend, aiocubie_config: dict[str, Any]
) -> AsyncIterator[MemoryManager]:
    async with _running(aiocubie_simulator, _split(aiocubie_config)[1]) as mgr:
        yield mgr


@pytest.fixture
def aiocubie_manager_factory(
    aiocubie_config: dict[str, Any],
) -> Iterator[Callable[..., contextlib.AbstractAsyncContextManager[MemoryManager]]]:
    """Make running managers on fresh simulators: ``async with factory(total=1 << 20) as mgr``.

    Takes the names of :data:`DEFAULTS` and any other :class:`MemoryManager` option, over the
    test's ``@pytest.mark.aiocubie`` settings; works in any async test (anyio, pytest-asyncio,
    trio). The manager's backend is its simulator, so ``mgr.backend.faults`` injects faults.
    """
    simulators: list[SimulatorBackend] = []

    @contextlib.asynccontextmanager
    async def factory(**settings: Any) -> AsyncIterator[MemoryManager]:
        _check_names(settings, "aiocubie_manager_factory(...)")
        simulator_options, manager_options = _split({**aiocubie_config, **settings})
        simulator = _simulator(simulator_options)
        simulators.append(simulator)
        async with _running(simulator, manager_options) as mgr:
            yield mgr

    yield factory
    for simulator in simulators:
        simulator.close()


try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - the fixture is for pytest-asyncio users only
    pass
else:

    @pytest_asyncio.fixture
    async def aiocubie_asyncio_manager(
        aiocubie_simulator: SimulatorBackend, aiocubie_config: dict[str, Any]
    ) -> AsyncIterator[MemoryManager]:
        """A running MemoryManager on ``aiocubie_simulator``, for pytest-asyncio tests.

        pytest-asyncio runs a fixture's setup and teardown in different tasks, and a running
        manager must be entered and left in one task: this fixture runs it in a task of its own.
        """
        started: asyncio.Future[MemoryManager] = asyncio.get_running_loop().create_future()
        stop = asyncio.Event()

        async def own() -> None:
            try:
                async with _running(aiocubie_simulator, _split(aiocubie_config)[1]) as mgr:
                    started.set_result(mgr)
                    await stop.wait()
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc)
                raise

        owner = asyncio.get_running_loop().create_task(own(), name="aiocubie_asyncio_manager")
        try:
            yield await started
        finally:
            stop.set()
            await owner

    __all__ += ["aiocubie_asyncio_manager"]
