"""One node broker for a ``pytest -n N`` session: ``--aiocubie-broker=cuda|simulator``.

The controller (the process that runs no tests) starts ``python -m aiocubie broker`` before its
workers start, hands the socket to each worker (``workerinput``), and stops it when the session
ends, whatever happened to the workers (a crashed worker's leases return when its connection
closes). Each worker sets ``AIOCUBIE_BROKER``, so every manager made in it, the plugin's fixtures
and the tests' own, leases from the broker: the workers split the device's budget.

Nothing happens without the option, without xdist (no ``-n``), or where ``AIOCUBIE_BROKER`` is
already set (that broker wins). Like the plugin, this module imports neither aiocubie nor numpy.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

__all__ = ["SessionBroker", "add_options", "configure"]

#: The ``workerinput`` key that hands the socket to the workers.
WORKER_KEY = "aiocubie_broker"
_BACKENDS = ("cuda", "simulator")


def add_options(parser: pytest.Parser) -> None:
    """Add ``--aiocubie-broker`` and ``--aiocubie-broker-budget`` (and their ini options)."""
    group = parser.getgroup("aiocubie")
    group.addoption(
        "--aiocubie-broker",
        choices=_BACKENDS,
        default=None,
        help="under pytest-xdist: start one node broker on this backend's device for the session; every "
        "worker's managers lease from it (ini: aiocubie_broker)",
    )
    group.addoption(
        "--aiocubie-broker-budget",
        default=None,
        metavar="BYTES",
        help="the session broker's budget: 8GiB, 60e9, ... (default: the device's free memory less a tenth of its total; ini: aiocubie_broker_budget)",
    )
    parser.addini("aiocubie_broker", "under pytest-xdist: start a node broker on this backend (cuda or simulator)")
    parser.addini(
        "aiocubie_broker_budget",
        "the session broker's budget in bytes (default: the device's free memory less a tenth of its total)",
    )


class SessionBroker:
    """A broker process serving a socket in a fresh owner-only directory, until :meth:`stop`.

    Parameters
    ----------
    backend : {"cuda", "simulator"}
        The device whose budget the broker holds.
    budget : str, optional
        The node budget (``8GiB``); None: the device's free memory less a tenth of its total.
    timeout : float
        Seconds to wait for the broker to answer.

    Raises
    ------
    pytest.UsageError
        If the broker exits before it answers, or does not answer in time (with its output).
    """

    def __init__(self, backend: str, budget: str | None, timeout: float = 60.0) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="aiocubie-broker-"))  # mode 0700
        self.path = self.directory / "broker.sock"
        command = [sys.executable, "-m", "aiocubie", "broker", "--socket", str(self.path), "--backend", backend]
        command += [] if budget is None else ["--budget", budget]
        self.log = (self.directory / "broker.log").open("w+")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not _answers(self.path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                what = f"exited ({self.process.returncode})" if self.process.poll() is not None else "did not answer"
                raise pytest.UsageError(
                    f"--aiocubie-broker: the session's broker {what} at {self.path}: {self.log.read().strip()}"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM, wait (SIGKILL after 10 s), and remove the socket's directory."""
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


def configure(config: pytest.Config) -> None:
    """On a worker, join the controller's broker; on an xdist controller asked to, start one."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        if workerinput.get(WORKER_KEY):
            os.environ["AIOCUBIE_BROKER"] = workerinput[WORKER_KEY]
        return
    backend = config.getoption("aiocubie_broker") or config.getini("aiocubie_broker") or None
    if backend is None or os.environ.get("AIOCUBIE_BROKER", "").strip():
        return
    if backend not in _BACKENDS:
        raise pytest.UsageError(f"aiocubie_broker = {backend!r}: give one of {', '.join(_BACKENDS)}")
    if config.getoption("dist", "no") == "no":
        return  # no workers: one process, nothing to share
    budget = config.getoption("aiocubie_broker_budget") or config.getini("aiocubie_broker_budget") or None
    broker = SessionBroker(backend, budget)
    config.add_cleanup(broker.stop)
    config.pluginmanager.register(_Controller(broker), "aiocubie-session-broker")


class _Controller:
    """The controller's hooks: hand the socket to each worker, say which broker serves."""

    def __init__(self, broker: SessionBroker) -> None:
        self.broker = broker

    def pytest_configure_node(self, node: object) -> None:
        node.workerinput[WORKER_KEY] = str(self.broker.path)  # type: ignore[attr-defined]

    def pytest_report_header(self) -> str:
        return f"aiocubie broker: pid {self.broker.process.pid} at {self.broker.path}"
