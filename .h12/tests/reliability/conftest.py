"""Fixtures of the reliability suite (helpers live in ``_reliability``).

Set ``AIOCUBIE_SOAK=1`` to run the load and storm tests at full size (minutes, not for CI).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from _reliability import assert_empty, settle

from aiocubie import MemoryManager, SimulatorBackend

Drained = Callable[..., Awaitable[None]]


@pytest.fixture
def drained() -> Drained:
    """An async check: wait for the schedulers to settle, then assert accounting is zero."""

    async def check(mgr: MemoryManager, sim: SimulatorBackend | None = None) -> None:
        await settle(mgr)
        assert_empty(mgr, sim)

    return check
