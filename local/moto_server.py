"""SQS from moto's server, in a child process on 127.0.0.1.

A child process rather than a thread: moto answers in pure Python, and in our process
it would hold the GIL against the handler's worker threads, skewing every timing the
tests care about (leases, deadlines, throughput). A child also keeps moto's global
state apart from any in-process ``mock_aws`` of the unit tests, and puts a real
network boundary between the consumer and its queue, as in AWS.

Run as ``python -m local.moto_server --port P``: the child serves until its stdin
closes (the parent is gone) or it receives SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from local.aws import client
from local.processes import LOOPBACK, LoopbackServer

REPO_ROOT = Path(__file__).resolve().parent.parent


class MotoServer(LoopbackServer):
    """moto's server on 127.0.0.1 in a child process; ``.endpoint_url``, ``.client(service)``."""

    name = "moto-server"

    def client(self, service: str = "sqs", **options: Any) -> Any:
        return client(service, self.endpoint_url, **options)

    def _command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "local.moto_server", "--port", str(port)]

    def _answers(self) -> bool:
        return self.client(timeout_s=2.0).list_queues() is not None

    def _working_directory(self) -> Path:
        return REPO_ROOT


def _serve(port: int) -> None:
    from moto.server import ThreadedMotoServer  # noqa: PLC0415 (only the child needs moto's server)

    # One line per request would fill the log file during load runs.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=LOOPBACK, port=port, verbose=False)
    server.start()
    stopped = threading.Event()

    def watch_parent() -> None:
        # End of input means the parent closed our lifeline, or died.
        while sys.stdin.buffer.read(4096):
            pass
        stopped.set()

    threading.Thread(target=watch_parent, name="parent-watcher", daemon=True).start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    print(f"moto server listening on {LOOPBACK}:{port}", flush=True)
    while not stopped.wait(0.5):
        pass
    server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    _serve(parser.parse_args(argv).port)


if __name__ == "__main__":
    main()
