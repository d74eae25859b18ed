"""The node broker: one process holding a device's node-wide budget, and the client a manager leases from.

``protocol`` frames and checks the messages, ``server`` is the broker, ``client`` the lease a
:class:`~aiocubie.MemoryManager` is handed (``broker=PATH``). The server never imports the manager.
"""
