"""Shared fixtures: async tests run on asyncio and trio through anyio's pytest plugin.

``--soak`` runs the reliability load and storm tests at full size (same as AIOCUBIE_SOAK=1).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from simkit import TOTAL

from aiocubie.simulator import SimulatorBackend


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="run load and storm tests at full size (minutes)")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--soak"):
        os.environ["AIOCUBIE_SOAK"] = "1"  # read by tests/reliability when they are imported


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each ``@pytest.mark.anyio`` test on both asyncio and trio."""
    return str(request.param)


@pytest.fixture
def sim() -> Iterator[SimulatorBackend]:
    """A simulated device of ``simkit.TOTAL`` bytes, closed after the test."""
    backend = SimulatorBackend(total=TOTAL)
    yield backend
    backend.close()
