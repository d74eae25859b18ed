"""After a manager's ``async with`` ends: what is used after says that the manager exited, and what to do."""

from __future__ import annotations

import numpy as np
import pytest
from simkit import Part

from aiocubie import ArrayRequest, BackendError, ManagerStateError, MemoryManager, ReleasedError


@pytest.mark.anyio
async def test_use_after_the_exit_says_the_manager_exited(anyio_backend: str) -> None:
    async with MemoryManager("simulator") as mgr:
        part = Part()
        mgr.register(part)
        response = await mgr.request(part, {"x": ArrayRequest((4,), np.float32)})
        stream = mgr.get_stream(part)
    assert mgr.backend.device.resets == 0  # type: ignore[attr-defined]
    for use in (lambda: mgr.backend.launch(stream), lambda: mgr.allocate(part, ArrayRequest((4,), "f4"))):  # type: ignore[attr-defined]
        with pytest.raises(BackendError, match="the MemoryManager that made it exited") as caught:
            use()
        assert "context reset" not in str(caught.value) and "inside its `async with`" in str(caught.value)
    with pytest.raises(BackendError, match="the MemoryManager that made it exited"):
        await mgr.sync_stream(part)
    with pytest.raises(ManagerStateError, match=r"not running: it exited \(the end of its `async with`"):
        await mgr.request(part, {"y": ArrayRequest((4,), np.float32)})
    with pytest.raises(ReleasedError, match="its manager's exit"):
        response.arrays["x"].get()
