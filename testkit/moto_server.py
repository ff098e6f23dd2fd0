"""SQS from moto's server, in a child process on 127.0.0.1 rather than a thread: moto answers in pure Python, and in our
process it would hold the GIL against the handler's worker threads, skewing every timing the tests care about (leases,
deadlines, throughput). A child also keeps moto's state apart from the unit tests' ``mock_aws`` and puts a network
boundary between the consumer and its queue."""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from typing import Any

from testkit.processes import LOOPBACK, LoopbackServer, wait_for_parent


class MotoServer(LoopbackServer):
    name = "moto-server"

    def _command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "testkit.moto_server", str(port)]


def lock_queue_writes() -> None:
    """Make moto's SQS (5.2.5) keep two promises SQS keeps under concurrent requests.

    A delete writes back a copy of the message list taken without the lock sends hold, undoing writes made meanwhile
    (measured in process, 4 threads deleting: 1,835 of 10,000 deleted messages back), as does a receive's move to the
    dead-letter queue: both now hold that lock, which a long poll releases. A receive takes a snapshot of the held FIFO
    groups as it starts, so two at once split a group (measured: 4 groups of 6 out of order with 3 receivers): a FIFO
    queue's receives run one at a time.
    """
    from moto.sqs.models import Queue, SQSBackend  # noqa: PLC0415 (only the child needs moto's server)

    delete, receive = Queue.delete_message, SQSBackend.receive_message
    fifo_receives: dict[str, threading.Lock] = {}

    def locked_delete(queue: Queue, receipt_handle: str) -> None:
        with queue._messages_lock:
            delete(queue, receipt_handle)

    def locked_receive(backend: SQSBackend, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        queue = backend.get_queue(queue_name)
        fifo = fifo_receives.setdefault(queue_name, threading.Lock()) if queue.fifo_queue else contextlib.nullcontext()
        with fifo, queue._messages_lock:
            return receive(backend, queue_name, *args, **kwargs)

    Queue.delete_message, SQSBackend.receive_message = locked_delete, locked_receive  # type: ignore[method-assign,assignment]


def main(port: int) -> None:
    from moto.server import ThreadedMotoServer  # noqa: PLC0415 (only the child needs moto's server)

    lock_queue_writes()
    # One line per request would fill the log file during load runs.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address=LOOPBACK, port=port, verbose=False)
    server.start()
    wait_for_parent()
    server.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]))
