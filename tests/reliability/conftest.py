"""Fixtures of the reliability suite (helpers live in ``_reliability``).

Set ``AIOCUBIE_SOAK=1`` to run the load and storm tests at full size (minutes, not for CI).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import _reliability
import pytest
from _reliability import assert_empty, settle

from aiocubie import MemoryManager
from aiocubie.simulator import SimulatorBackend

Drained = Callable[..., Awaitable[None]]


#: Advice that randomized load gives by chance, not what these suites check (budgets, leaks, order):
#: a request waiting (policy "wait") on memory its own member holds in another task, a batch over
#: 20x the free memory, manual proportions that leave the auto pool under its minimum. AiocubieWarnings
#: are errors elsewhere; tests/test_scheduler.py, test_wait_batches.py, test_planner.py and
#: test_budget.py check these warnings themselves (pytest.warns).
_ADVICE = (
    "ignore:.*waits for memory its own requester:aiocubie.errors.AiocubieWarning",
    "ignore:.*more than 20x the .* free:aiocubie.errors.AiocubieWarning",
    "ignore:manual proportions would sum to:aiocubie.errors.AiocubieWarning",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = str(Path(__file__).parent)
    for item in items:
        if str(item.path).startswith(here):
            for advice in _ADVICE:
                item.add_marker(pytest.mark.filterwarnings(advice))


def pytest_configure(config: pytest.Config) -> None:
    # _reliability was imported (with this conftest) before --soak was read: tell it now,
    # before the test modules import SOAK and SEEDS from it
    if config.getoption("--soak", default=False):
        _reliability.enable_soak()


@pytest.fixture
def drained() -> Drained:
    """An async check: wait for the schedulers to settle, then assert accounting is zero."""

    async def check(mgr: MemoryManager, sim: SimulatorBackend | None = None) -> None:
        await settle(mgr)
        assert_empty(mgr, sim)

    return check
