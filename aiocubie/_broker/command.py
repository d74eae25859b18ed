"""``python -m aiocubie broker``: run the node broker in the foreground, or show a broker's record.

The command line's ``broker`` verb (``__main__`` only adds it): it parses, checks the budget against
the device where a backend is named, and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any

import anyio

from .._errors import ConfigurationError
from .._stats import format_bytes
from .client import broker_status
from .server import Broker

__all__ = ["add_parser", "run"]


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    parent: argparse.ArgumentParser,
    nbytes: Callable[[str], int],
) -> None:
    """Add the ``broker`` verb; ``nbytes`` parses a byte count (``8GiB``)."""
    broker = commands.add_parser(
        "broker",
        parents=[parent],
        help="serve a node-wide device budget that managers in other processes lease from (broker=PATH)",
    )
    broker.add_argument("action", nargs="?", choices=["status"], help="status: show a running broker's record")
    broker.add_argument("--socket", required=True, metavar="PATH", help="the Unix socket (its directory: mode 0700)")
    broker.add_argument(
        "--budget",
        type=nbytes,
        metavar="BYTES",
        help="the node budget: 8GiB, 60e9, ... (default: --backend's device's free memory less a tenth of its total)",
    )
    broker.add_argument("--slab", type=nbytes, metavar="BYTES", help="bytes leased at a time (default: budget/32)")
    broker.add_argument(
        "--split",
        type=int,
        default=1,
        metavar="N",
        help="split the budget into N equal shares: one process leases at most one (default 1: the whole budget)",
    )
    broker.add_argument(
        "--backend",
        dest="device_backend",
        choices=["cuda", "simulator"],
        default=None,
        help="check the budget against this backend's device (default: no check)",
    )
    broker.add_argument("--device", type=int, default=0, metavar="N", help="the device the budget is of (default 0)")
    broker.add_argument("--json", action="store_true", help="status: print the record as JSON")


def run(args: argparse.Namespace) -> int:
    """Serve (until SIGTERM or SIGINT), or print a broker's status; the exit status."""
    if args.action == "status":
        return _status(args)
    if args.budget is None and args.device_backend is None:
        raise ConfigurationError(
            "broker needs --budget BYTES (the node budget), e.g. --budget 60GiB, or --backend cuda|simulator "
            "(then the budget is the device's free memory less a tenth of its total)"
        )
    if args.device_backend is not None:
        args.budget = _check_device(args.device_backend, args.device, args.budget)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s aiocubie broker: %(message)s", stream=sys.stderr)
    broker = Broker(args.socket, args.budget, slab=args.slab, device=args.device, split=args.split)
    anyio.run(_serve, broker)
    return 0


def _check_device(name: str, device: int, budget: int | None) -> int:
    """The budget, checked against the device (where not given: its free memory less a tenth of its total)."""
    from .._backends import create_backend

    backend = create_backend(name, device=device)
    try:
        info = backend.device.memory_info()
    finally:
        backend.close()
    total = info.total
    if budget is None:  # what is free now, less a tenth of the device: the clients' contexts, memory outside leases
        return max(0, int(info.free) - int(total) // 10)
    if budget > total:
        raise ConfigurationError(
            f"--budget {budget} is over device {device}'s {total} bytes ({format_bytes(total)}): give at most that"
        )
    return budget


async def _serve(broker: Broker) -> None:
    async with anyio.create_task_group() as tasks:
        await tasks.start(broker.serve)
        leases = broker.leases
        share = "" if leases.share == leases.budget else f", a process's share {format_bytes(leases.share)}"
        print(
            f"aiocubie broker: serving {broker.path} (budget {format_bytes(leases.budget)}{share}, slab "
            f"{format_bytes(broker.slab)}, device {broker.device}); SIGTERM or SIGINT stops it",
            flush=True,
        )
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                tasks.cancel_scope.cancel()
                return


def _status(args: argparse.Namespace) -> int:
    status: dict[str, Any] = anyio.run(broker_status, args.socket)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print(
        f"broker {status['socket']} (device {status['device']}): {format_bytes(status['leased'])} of "
        f"{format_bytes(status['budget'])} leased (peak {format_bytes(status['peak'])}), slab {format_bytes(status['slab'])}, "
        f"a process's share {format_bytes(status['share'])}"
    )
    print(f"clients ({len(status['clients'])}):")
    for client in status["clients"]:
        print(f"  pid {client['pid']:<8} {format_bytes(client['lease']):>12}  {client['name']}")
    print(f"processes ({len(status['processes'])}, the latest gone ones kept):")
    for process in status["processes"]:
        gone = "" if process["clients"] else "  (gone)"
        print(
            f"  pid {process['pid']:<8} {format_bytes(process['lease']):>12}  peak {format_bytes(process['peak'])}{gone}"
        )
    print(f"waiters ({len(status['waiters'])}):")
    for waiter in status["waiters"]:
        print(
            f"  pid {waiter['pid']:<8} {format_bytes(waiter['least']):>12}  priority {waiter['priority']}, "
            f"waiting {waiter['waited']:.3f} s"
        )
    return 0
