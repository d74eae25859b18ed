"""The simulator: a real backend without a GPU, strict wherever a GPU would corrupt memory.

:class:`SimulatorBackend` models a device (memory, pools, streams, events, copy engines) and its
:class:`Faults` inject failures; :class:`Engines` and :class:`TimelineEntry` describe the
simulated copy engines and what ran on them.
"""

from ._backends import Engines, Faults, SimulatorBackend, TimelineEntry

__all__ = ["Engines", "Faults", "SimulatorBackend", "TimelineEntry"]
