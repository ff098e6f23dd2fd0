"""SQS from moto's server, in a child process on 127.0.0.1 (``python -m testkit.moto_server PORT``).

A child rather than a thread: moto answers in pure Python, and in our process it would hold
the GIL against the handler's worker threads, skewing every timing the tests care about
(leases, deadlines, throughput). A child also keeps moto's global state apart from the unit
tests' ``mock_aws``, and puts a real network boundary between the consumer and its queue.
"""

from __future__ import annotations

import logging
import sys

from testkit.processes import LOOPBACK, LoopbackServer, wait_for_parent


class MotoServer(LoopbackServer):
    name = "moto-server"

    def _command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "testkit.moto_server", str(port)]


def main(port: int) -> None:
    from moto.server import ThreadedMotoServer  # noqa: PLC0415 (only the child needs moto's server)

    # One line per request would fill the log file during load runs.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=LOOPBACK, port=port, verbose=False)
    server.start()
    wait_for_parent()
    server.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]))
