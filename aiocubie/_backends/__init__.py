"""Backends: the only layer that imports numba.cuda or cupy (see ``_base`` for the protocol)."""

from __future__ import annotations

from ._base import ALLOCATORS, Advice, Backend, Event, MemoryInfo

__all__ = ["ALLOCATORS", "Advice", "Backend", "Event", "MemoryInfo"]
