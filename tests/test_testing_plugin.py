"""aiocubie.testing, enabled as users enable it, in pytest sessions run by pytester.

Each inner session has its own conftest with ``pytest_plugins = ["aiocubie.testing"]``; its
tests run on the simulator under anyio (asyncio and trio) and pytest-asyncio.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy  # noqa: F401  (imported here: pytester's inline runs drop modules they first import,
import pytest  # and numpy cannot be imported twice in one process)

import aiocubie.testing  # noqa: F401

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest

pytest_plugins = ["aiocubie.testing"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param
"""


def _run(pytester: pytest.Pytester, tests: str) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(tests)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def test_anyio_manager_fixture_on_asyncio_and_trio(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
import numpy as np
import pytest
from aiocubie import ArrayRequest, MemoryManager
from aiocubie.simulator import SimulatorBackend


@pytest.mark.anyio
async def test_defaults(aiocubie_manager, aiocubie_simulator):
    assert isinstance(aiocubie_manager, MemoryManager) and aiocubie_manager.running
    assert aiocubie_manager.backend is aiocubie_simulator
    assert aiocubie_simulator.total == 64 << 20
    owner = object()
    aiocubie_manager.register(owner)
    async with aiocubie_manager.request(owner, {"a": ArrayRequest((1024,), np.float32)}) as response:
        assert aiocubie_simulator.used == 4096
        assert response.chunks == 1
    assert aiocubie_simulator.used == 0


@pytest.mark.anyio
@pytest.mark.aiocubie(total=1 << 16, headroom=0.0, mode="active")
async def test_marker_sets_total_and_options(aiocubie_manager, aiocubie_config):
    assert aiocubie_manager.backend.total == 1 << 16
    assert aiocubie_manager.options.headroom == 0.0
    assert aiocubie_manager.options.active
    assert aiocubie_config["total"] == 1 << 16
    owner = object()
    aiocubie_manager.register(owner)
    response = await aiocubie_manager.request(owner, {"a": ArrayRequest((4, 10_000), np.float32, chunk_axis=1)})
    assert response.chunks > 1  # 160 kB does not fit 64 KiB
""",
    )
    result.assert_outcomes(passed=4)


def test_faults_fixture_reaches_the_manager(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
import numpy as np
import pytest
from aiocubie import ArrayRequest
from aiocubie.errors import AllocationError


@pytest.mark.anyio
async def test_injected_allocation_failure(aiocubie_manager, aiocubie_faults):
    aiocubie_faults.inject("allocate", after=1)
    owner = object()
    aiocubie_manager.register(owner)
    request = {"a": ArrayRequest(8, np.float64), "b": ArrayRequest(8, np.float64)}
    with pytest.raises(AllocationError, match="injected fault"):
        await aiocubie_manager.request(owner, request)
    assert aiocubie_faults.fired["allocate"] == 1
    assert aiocubie_manager.backend.used == 0  # all or nothing: the first array was freed
    async with aiocubie_manager.request(owner, request) as response:  # the rule fired once
        assert set(response.arrays) == {"a", "b"}
""",
    )
    result.assert_outcomes(passed=2)


def test_factory_under_pytest_asyncio_and_anyio(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_asyncio")
    result = _run(
        pytester,
        """
import numpy as np
import pytest
from aiocubie import ArrayRequest
from aiocubie.errors import InsufficientMemoryError


@pytest.mark.asyncio
async def test_factory_under_pytest_asyncio(aiocubie_manager_factory):
    async with aiocubie_manager_factory(total=1 << 12, policy="fail", mode="active") as mgr:
        assert mgr.backend.total == 1 << 12
        owner = object()
        mgr.register(owner)
        with pytest.raises(InsufficientMemoryError):
            await mgr.request(owner, {"a": ArrayRequest(4096, np.float32)})
    assert not mgr.running


@pytest.mark.anyio
async def test_factory_under_anyio(aiocubie_manager_factory):
    async with aiocubie_manager_factory(total=1 << 20, latency=0.001) as one, aiocubie_manager_factory() as two:
        assert one.backend is not two.backend
        assert (one.backend.total, one.backend.device.latency) == (1 << 20, 0.001)
        one.backend.faults.inject("copy")
        two.backend.faults.inject("copy")
""",
    )
    result.assert_outcomes(passed=3)


def test_marker_takes_keywords_only(pytester: pytest.Pytester) -> None:
    result = _run(
        pytester,
        """
import pytest

@pytest.mark.aiocubie(1024)
def test_positional(aiocubie_simulator):
    pass
""",
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*keyword settings only*"])


def test_the_plugin_loads_from_its_entry_point_without_pytest_plugins(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "import pytest\n\n@pytest.fixture\ndef anyio_backend():\n    return 'asyncio'\n"
    )  # no pytest_plugins line: the pytest11 entry point loads aiocubie.testing
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(
        """
import pytest


@pytest.mark.anyio
@pytest.mark.aiocubie(total=1 << 16)
async def test_fixture_present(aiocubie_manager):
    assert aiocubie_manager.backend.total == 1 << 16
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
    result.assert_outcomes(passed=1)


def test_pytest_asyncio_users_get_a_manager_fixture_the_marker_and_a_clear_misuse_error(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("pytest_asyncio")
    result = _run(
        pytester,
        """
import numpy as np
import pytest
from aiocubie import ArrayRequest


@pytest.mark.asyncio
@pytest.mark.aiocubie(total=1 << 16, mode="active")
async def test_asyncio_manager(aiocubie_asyncio_manager, aiocubie_simulator):
    assert aiocubie_asyncio_manager.running and aiocubie_asyncio_manager.backend is aiocubie_simulator
    assert aiocubie_simulator.total == 1 << 16 and aiocubie_asyncio_manager.options.active
    owner = object()
    aiocubie_asyncio_manager.register(owner)
    async with aiocubie_asyncio_manager.request(owner, {"a": ArrayRequest((256,), np.float32)}) as response:
        assert response.chunks == 1 and aiocubie_simulator.used == 1024


@pytest.mark.asyncio
@pytest.mark.aiocubie(total=1 << 14)
async def test_marker_sets_the_factory(aiocubie_manager_factory):
    async with aiocubie_manager_factory() as mgr, aiocubie_manager_factory(total=1 << 15) as other:
        assert mgr.backend.total == 1 << 14 and other.backend.total == 1 << 15


@pytest.mark.asyncio
async def test_misused_anyio_fixture(aiocubie_manager):
    pass


@pytest.mark.asyncio
async def test_after_the_misuse(aiocubie_asyncio_manager):
    assert aiocubie_asyncio_manager.running
""",
    )
    # the misuse is at most an error of its own test (pytest 8.4+ refuses an async fixture no plugin
    # runs; older pytest hands the test the unstarted generator), and the tests around it pass
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes["passed"] >= 3, outcomes
    assert outcomes["passed"] + outcomes.get("errors", 0) == 4, outcomes


def test_the_anyio_fixture_under_pytest_asyncio_auto_mode_says_what_to_use(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_asyncio")
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(
        """
async def test_misused(aiocubie_manager):
    pass


async def test_after(aiocubie_asyncio_manager):
    assert aiocubie_asyncio_manager.running
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*aiocubie_manager runs under anyio's pytest plugin*aiocubie_asyncio_manager*"])


def test_the_anyio_fixture_under_pytest_asyncio_strict_mode_says_what_to_use(pytester: pytest.Pytester) -> None:
    # issue 22: pytest's generic "async def functions are not natively supported" / "no plugin"
    # error came instead of aiocubie's own
    result = _run(
        pytester,
        """
import pytest


@pytest.mark.asyncio
async def test_under_pytest_asyncio(aiocubie_manager):
    pass
""",
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*aiocubie_manager runs under anyio's pytest plugin*aiocubie_asyncio_manager*"])


def test_a_typo_in_the_marker_names_the_setting(pytester: pytest.Pytester) -> None:
    # issue 22: @pytest.mark.aiocubie(totl=...) gave a bare TypeError from the simulator
    result = _run(
        pytester,
        """
import pytest


@pytest.mark.anyio
@pytest.mark.aiocubie(totl=1 << 16)
async def test_typo(aiocubie_manager):
    pass


@pytest.mark.anyio
async def test_factory_typo(aiocubie_manager_factory):
    async with aiocubie_manager_factory(polcy="wait"):
        pass
""",
    )
    result.assert_outcomes(errors=2, failed=2)
    result.stdout.fnmatch_lines(["*@pytest.mark.aiocubie got unknown settings: 'totl' (did you mean 'total'?)*"])
    result.stdout.fnmatch_lines(
        ["*aiocubie_manager_factory(...) got unknown settings: 'polcy' (did you mean 'policy'?)*"]
    )


def test_a_hand_written_pytest_asyncio_fixture_works_as_the_docstring_says(pytester: pytest.Pytester) -> None:
    # issue 22: the docstring said it did not work; it does (teardown from another task releases
    # everything without exiting the task group): the docstring now says so, and this keeps it so
    result = _run(
        pytester,
        """
import numpy as np
import pytest
import pytest_asyncio
from aiocubie import ArrayRequest, MemoryManager
from aiocubie.simulator import SimulatorBackend

SIM = SimulatorBackend(1 << 20)


@pytest_asyncio.fixture
async def mgr():
    async with MemoryManager(SIM) as manager:
        yield manager


@pytest.mark.asyncio
async def test_uses_it(mgr):
    owner = object()
    mgr.register(owner)
    response = await mgr.request(owner, {"a": ArrayRequest((256,), np.float32)})
    assert SIM.used == 1024 and response.chunks == 1


def test_after_teardown():
    assert SIM.used == 0  # released by the teardown in another task
""",
    )
    result.assert_outcomes(passed=2)


def test_a_session_that_uses_no_aiocubie_fixture_does_not_import_aiocubie(pytester: pytest.Pytester) -> None:
    # issue 22: the plugin added about 0.2 s to every pytest session where aiocubie is installed
    pytester.makepyfile(
        """
import sys


def test_nothing_imported():
    assert "aiocubie_pytest" in sys.modules  # the entry point loaded the plugin
    assert "aiocubie" not in sys.modules and "numpy" not in sys.modules
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:asyncio", "-p", "no:hypothesispytest")
    result.assert_outcomes(passed=1)


BROKER_TESTS = """
import os

import pytest
from aiocubie import ArrayRequest


@pytest.mark.anyio
@pytest.mark.parametrize("index", range(3))
async def test_leases_from_the_session_broker(aiocubie_manager, index):
    assert os.environ["AIOCUBIE_BROKER"].endswith("broker.sock")
    owner = object()
    aiocubie_manager.register(owner)
    async with aiocubie_manager.request(owner, {"a": ArrayRequest((1024,), "float32")}):
        lease = aiocubie_manager.statistics().lease
        assert lease is not None and lease.connected and lease.granted >= 4096


def test_a_crashing_worker():
    os._exit(3)
"""


def _session_broker(result: pytest.RunResult) -> tuple[int, Path]:
    """The pid and socket that the session's header names."""
    (line,) = [line for line in result.outlines if line.startswith("aiocubie broker: pid ")]
    _, pid, _, path = line.removeprefix("aiocubie broker: ").split()
    return int(pid), Path(path)


def test_xdist_workers_lease_from_one_session_broker_that_is_stopped_at_the_end(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIOCUBIE_BROKER", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(BROKER_TESTS)
    args = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning", "--aiocubie-broker=simulator")
    result = pytester.runpytest_subprocess("-n", "2", *args)
    pid, path = _session_broker(result)
    outcomes = result.parseoutcomes()
    assert outcomes == {"passed": 6, "failed": 1}, result.stdout.str()  # the crash
    # the summary: each worker's peak against its share (the budget in two)
    (budget, share) = re.search(
        r"aiocubie broker: budget ([\d.]+) GiB, a worker's share ([\d.]+) GiB", result.stdout.str()
    ).groups()
    assert abs(float(budget) / 2 - float(share)) < 0.001
    peaks = re.findall(
        r"pid \d+ \((gw\d|a crashed worker, or a test's own process)\): peak ([\d.]+) GiB, (\w+ its share)",
        result.stdout.str(),
    )
    whom = {who for who, _, _ in peaks}
    assert "a crashed worker, or a test's own process" in whom and whom & {"gw0", "gw1", "gw2"}, peaks
    assert all(0 < float(peak) <= float(share) and under == "under its share" for _, peak, under in peaks), peaks
    result.stdout.fnmatch_lines(["*worker 'gw*' crashed while running*test_a_crashing_worker*"])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped and reaped
    assert not path.exists() and not path.parent.exists()

    without_xdist = pytester.runpytest_subprocess(*args, "-k", "not crashing")
    assert not [line for line in without_xdist.outlines if line.startswith("aiocubie broker")]
    without_xdist.assert_outcomes(failed=6)  # no broker, no AIOCUBIE_BROKER
    assert "KeyError: 'AIOCUBIE_BROKER'" in without_xdist.stdout.str()


def test_a_session_broker_that_cannot_start_stops_the_session_saying_why(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("def test_never_run():\n    pass\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-n", "2", "--aiocubie-broker=simulator", "--aiocubie-broker-budget=1000GiB"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--aiocubie-broker: the session's broker exited (*)*--budget * is over device 0's*"])
    assert "test_never_run" not in result.stdout.str()
    (line,) = [line for line in result.errlines if "the session's broker exited" in line]
    assert not Path(line.split(" at ")[1].split(":")[0]).parent.exists()  # its directory removed


def test_a_session_broker_budget_that_is_no_number_says_which_option(pytester: pytest.Pytester) -> None:
    # the ini budget went to the broker's command line: the error was its usage text, naming only --budget
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\naiocubie_broker = simulator\naiocubie_broker_budget = lots\n")
    pytester.makepyfile("def test_never_run():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = result.stderr.str()
    assert "'lots' is not a whole number of bytes" in errors and "aiocubie_broker_budget" in errors
    assert "usage:" not in errors
