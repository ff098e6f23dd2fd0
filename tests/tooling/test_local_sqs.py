"""The local SQS server (moto's) never undoes a write, and hands a FIFO group to one receiver at a time, as SQS."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.sqs.models import Message, Queue, SQSBackend, sqs_backends

from testkit.aws import REGION
from testkit.moto_server import lock_queue_writes

_BLOCKED_S = 0.3


@pytest.fixture
def backend(aws: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[SQSBackend]:
    # Restored after the test: the patch is for the server's process, not the unit tests' moto.
    monkeypatch.setattr(Queue, "delete_message", Queue.delete_message)
    monkeypatch.setattr(SQSBackend, "receive_message", SQSBackend.receive_message)
    lock_queue_writes()
    sqs = sqs_backends[DEFAULT_ACCOUNT_ID][REGION]
    sqs.create_queue("q")
    sqs.create_queue("q.fifo", FifoQueue="true", ContentBasedDeduplication="true")
    yield sqs


def _started(target: Callable[..., object], *args: object) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _long_polling(queue: Queue) -> None:
    """Once a receive waits on the queue's condition: moto's long poll, the queue's lock released."""
    deadline = time.monotonic() + 10
    while not queue._messages_lock._waiters:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "no receive started to long-poll"
        time.sleep(0.01)


def test_a_delete_waits_for_the_queues_lock_so_a_concurrent_write_is_never_undone(backend: SQSBackend) -> None:
    backend.send_message("q", "body")
    (message,) = backend.receive_message("q", 1, 0, 30)
    queue = backend.get_queue("q")

    with queue._messages_lock:
        delete = _started(queue.delete_message, message.receipt_handle)
        delete.join(_BLOCKED_S)
        assert delete.is_alive(), "the delete ran while another write held the queue's lock"
    delete.join()

    assert queue._messages == []


def test_a_receive_waits_for_the_queues_lock_and_releases_it_while_it_long_polls(backend: SQSBackend) -> None:
    backend.send_message("q", "first")
    received: list[Message] = []
    with backend.get_queue("q")._messages_lock:
        receive = _started(lambda: received.extend(backend.receive_message("q", 1, 0, 30)))
        receive.join(_BLOCKED_S)
        assert receive.is_alive(), "the receive ran while another write held the queue's lock"
    receive.join()

    polling = _started(lambda: received.extend(backend.receive_message("q", 1, 5, 30)))
    _long_polling(backend.get_queue("q"))
    backend.send_message("q", "second")  # gets the lock and wakes the receive
    polling.join()
    assert [message.body for message in received] == ["first", "second"]


def test_a_fifo_queues_receives_run_one_at_a_time_even_while_one_long_polls(backend: SQSBackend) -> None:
    polling: list[Message] = []
    first = _started(lambda: polling.extend(backend.receive_message("q.fifo", 1, 5, 30)))
    _long_polling(backend.get_queue("q.fifo"))
    second = _started(backend.receive_message, "q.fifo", 1, 0, 30)
    second.join(_BLOCKED_S)
    assert second.is_alive(), "a second receive ran while the first long-polled"

    backend.send_message("q.fifo", "body", group_id="g")
    first.join()
    second.join()
    assert [message.body for message in polling] == ["body"]
