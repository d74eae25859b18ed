"""Shared fixtures: async tests run on asyncio and trio through anyio's pytest plugin."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Run each ``@pytest.mark.anyio`` test on both asyncio and trio."""
    return str(request.param)
