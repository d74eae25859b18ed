"""One node broker for a ``pytest -n N`` session: ``--aiocubie-broker=cuda|simulator``.

The controller (the process that runs no tests) starts ``python -m aiocubie broker --split N``
(N workers) before its workers start, hands the socket to each worker (``workerinput``), and stops
it when the session ends, whatever happened to the workers (a crashed worker's leases return when
its connection closes). Each worker sets ``AIOCUBIE_BROKER``, so every manager made in it, the
plugin's fixtures and the tests' own, leases from the broker: each worker leases at most its share
of the device's budget. The session's summary shows each worker's peak against its share.

Nothing happens without the option, without xdist (no ``-n``), or where ``AIOCUBIE_BROKER`` is
already set (that broker wins). Like the plugin, this module imports neither aiocubie nor numpy.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

__all__ = ["SessionBroker", "add_options", "configure"]

#: The ``workerinput`` key that hands the socket to the workers.
WORKER_KEY = "aiocubie_broker"
#: The ``workeroutput`` key by which a worker tells the controller its pid (the broker's record is by pid).
PID_KEY = "aiocubie_pid"
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
    split : int
        The shares the budget is split into: one a worker.
    timeout : float
        Seconds to wait for the broker to answer.

    Raises
    ------
    pytest.UsageError
        If the broker exits before it answers, or does not answer in time (with its output).
    """

    def __init__(self, backend: str, budget: str | None, split: int = 1, timeout: float = 60.0) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="aiocubie-broker-"))  # mode 0700
        self.path = self.directory / "broker.sock"
        command = [sys.executable, "-m", "aiocubie", "broker", "--socket", str(self.path), "--backend", backend]
        command += ["--split", str(split)] + ([] if budget is None else ["--budget", budget])
        self.budget = budget
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
                # its error, without the command's usage text (the user wrote no command line)
                said = [
                    line
                    for line in self.log.read().splitlines()
                    if not line.startswith(("usage: ", "      ", "(run with --debug"))
                ]
                given = (
                    "" if self.budget is None else " (its --budget: --aiocubie-broker-budget or aiocubie_broker_budget)"
                )
                raise pytest.UsageError(
                    f"--aiocubie-broker: the session's broker {what} at {self.path}: {' '.join(said).strip()}{given}"
                )
            time.sleep(0.02)

    def status(self) -> dict[str, Any]:
        """The broker's record (``python -m aiocubie broker status --json``; see docs/broker-protocol.md).

        Raises
        ------
        subprocess.SubprocessError
            If the broker does not answer (in a minute).
        """
        command = [sys.executable, "-m", "aiocubie", "broker", "status", "--socket", str(self.path), "--json"]
        answer = subprocess.run(command, capture_output=True, check=True, text=True, timeout=60)
        record: dict[str, Any] = json.loads(answer.stdout)
        return record

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
            config.workeroutput[PID_KEY] = os.getpid()  # type: ignore[attr-defined]
        return
    backend = config.getoption("aiocubie_broker") or config.getini("aiocubie_broker") or None
    if backend is None or os.environ.get("AIOCUBIE_BROKER", "").strip():
        return
    if backend not in _BACKENDS:
        raise pytest.UsageError(f"aiocubie_broker = {backend!r}: give one of {', '.join(_BACKENDS)}")
    if config.getoption("dist", "no") == "no":
        return  # no workers: one process, nothing to share
    budget = config.getoption("aiocubie_broker_budget") or config.getini("aiocubie_broker_budget") or None
    numprocesses = config.getoption("numprocesses", None)  # an int by now: xdist resolved "auto"
    workers = numprocesses if isinstance(numprocesses, int) and numprocesses > 0 else len(config.getoption("tx", []))
    broker = SessionBroker(backend, budget, split=max(1, workers))
    config.add_cleanup(broker.stop)
    config.pluginmanager.register(_Controller(broker), "aiocubie-session-broker")


class _Controller:
    """The controller's hooks: hand the socket to each worker, say which broker serves and what each leased."""

    def __init__(self, broker: SessionBroker) -> None:
        self.broker = broker
        self.workers: dict[int, str] = {}  # pid: worker id, as each worker ends

    def pytest_configure_node(self, node: object) -> None:
        node.workerinput[WORKER_KEY] = str(self.broker.path)  # type: ignore[attr-defined]

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        pid = getattr(node, "workeroutput", {}).get(PID_KEY)  # none from a worker that crashed
        if pid is not None:
            self.workers[pid] = node.gateway.id

    def pytest_report_header(self) -> str:
        return f"aiocubie broker: pid {self.broker.process.pid} at {self.broker.path}"

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        try:
            record = self.broker.status()
        except (subprocess.SubprocessError, ValueError) as exc:
            terminalreporter.write_line(f"aiocubie broker: no record at the end ({exc})")
            return
        share = record["share"]
        terminalreporter.write_line(
            f"aiocubie broker: budget {_gib(record['budget'])}, a worker's share {_gib(share)}; peak {_gib(record['peak'])} "
            "leased at once"
        )
        for process in record["processes"]:
            who = self.workers.get(process["pid"], "a crashed worker, or a test's own process")
            over = "OVER its share" if process["peak"] > share else "under its share"
            terminalreporter.write_line(f"  pid {process['pid']} ({who}): peak {_gib(process['peak'])}, {over}")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3f} GiB"
