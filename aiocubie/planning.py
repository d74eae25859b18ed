"""The pure planner: how a batch is split into chunks along the run axis to fit its budget.

:func:`plan_batch` makes a :class:`ChunkPlan` from requests and the bytes offered;
:func:`offered_bytes` says what a group is offered; :data:`MIN_AUTO_POOL` is the least share the
auto pool keeps. Nothing here touches a device: use it to see what a batch would do.
"""

from ._budget import MIN_AUTO_POOL
from ._planner import ChunkPlan, offered_bytes, plan_batch

__all__ = ["MIN_AUTO_POOL", "ChunkPlan", "offered_bytes", "plan_batch"]
