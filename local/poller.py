"""A poller that behaves as Lambda's SQS event source mapping: receive a batch, invoke the function with the event
Lambda would build, delete every record but the reported failures (after an error, a timeout or an invalid response,
nothing). Receive counts and the move to the dead-letter queue are the queue's own redrive policy."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from typing import Any, Protocol, Self

from testkit.invocation import Invocation, Invoker
from testkit.lambda_sqs import record_from_message
from testkit.processes import Lifecycle
from testkit.resources import QueueResource, SqsTrigger

_SQS_MAX = 10  # messages per ReceiveMessage, entries per DeleteMessageBatch
# Short long-polls keep a stop request prompt; Lambda's own pollers wait 20 s.
_WAIT_TIME_S = 1
logger = logging.getLogger(__name__)


class BatchVerdict(StrEnum):
    PARTIAL = "partial"  # the response was valid: all but the reported failures deleted
    RAISED = "raised"
    TIMED_OUT = "timed_out"
    INVALID_RESPONSE = "invalid_response"

    @property
    def deletes_nothing(self) -> bool:
        return self is not BatchVerdict.PARTIAL


@dataclass(frozen=True)
class BatchReport:
    verdict: BatchVerdict
    received: int
    deleted: int
    failed_ids: tuple[str, ...]
    invocation: Invocation
    detail: str = ""
    # The batch's messageIds in the order SQS returned them (a FIFO group's order).
    message_ids: tuple[str, ...] = ()

    @property
    def completed_ids(self) -> tuple[str, ...]:
        """The records this invocation ended (deleted from the queue), in the batch's order."""
        if self.verdict.deletes_nothing:
            return ()
        failed = set(self.failed_ids)
        return tuple(message_id for message_id in self.message_ids if message_id not in failed)


def reported_failures(response: Any, batch_ids: set[str]) -> tuple[set[str] | None, str]:
    """The ids to keep from a partial batch response, or ``None`` when it fails the whole batch. As in Lambda, a null
    or empty response or list is full success; anything malformed, or an id not of the batch, fails it all."""
    if not isinstance(response, dict | None):
        return None, f"response is a {type(response).__name__}, not an object"
    failures = (response or {}).get("batchItemFailures")
    if failures is None:
        return set(), ""
    if not isinstance(failures, list):
        return None, "batchItemFailures is not a list"
    kept: set[str] = set()
    for failure in failures:
        identifier = failure.get("itemIdentifier") if isinstance(failure, dict) else None
        if not isinstance(identifier, str) or identifier not in batch_ids:
            return None, f"itemIdentifier {identifier!r} is not a messageId of this batch"
        kept.add(identifier)
    return kept, ""


@dataclass
class PollerStats:
    """Counts over every invocation of a group of pollers; thread-safe."""

    invocations: int = 0
    received: int = 0
    deleted: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, report: BatchReport) -> None:
        with self._lock:
            self.invocations += 1
            self.received += report.received
            self.deleted += report.deleted
            self.verdicts[report.verdict.value] += 1


@dataclass(eq=False)
class Poller:
    sqs: Any
    queue: QueueResource
    trigger: SqsTrigger
    runtime: Invoker
    _: KW_ONLY
    on_batch: Callable[[BatchReport], None] | None = None

    def receive(self) -> list[dict[str, Any]]:
        """Up to BatchSize messages: one long poll, topped up within the batching window."""
        messages: list[dict[str, Any]] = []
        window_ends = time.monotonic() + self.trigger.batching_window_s
        while len(messages) < self.trigger.batch_size:
            wait_s = _WAIT_TIME_S if not messages else max(0, round(window_ends - time.monotonic()))
            answer = self.sqs.receive_message(
                QueueUrl=self.queue.url,
                MaxNumberOfMessages=min(_SQS_MAX, self.trigger.batch_size - len(messages)),
                WaitTimeSeconds=wait_s,
                MessageSystemAttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            received = answer.get("Messages") or []
            messages.extend(received)
            if not received or time.monotonic() >= window_ends:
                break
        return messages

    def poll_once(self) -> BatchReport | None:
        """Receive one batch and invoke the function with it; ``None`` when the queue had nothing."""
        if not (messages := self.receive()):
            return None
        event = {"Records": [record_from_message(message, queue_arn=self.queue.arn) for message in messages]}
        report = self._settle(messages, self.runtime.invoke(event))
        if self.on_batch is not None:
            self.on_batch(report)
        return report

    def _verdict(self, invocation: Invocation, batch_ids: set[str]) -> tuple[BatchVerdict, set[str] | None, str]:
        """The verdict, the ids to keep (``None``: the whole batch) and why."""
        if invocation.error is not None:
            return BatchVerdict.RAISED, None, f"{invocation.error_type}: {invocation.error}"
        if invocation.timed_out:
            timeout_s = self.runtime.function.timeout_s
            return BatchVerdict.TIMED_OUT, None, f"ran {invocation.duration_s:.1f}s, Timeout is {timeout_s}s"
        if not self.trigger.report_batch_item_failures:
            return BatchVerdict.PARTIAL, set(), ""
        failures, problem = reported_failures(invocation.response, batch_ids)
        return (BatchVerdict.PARTIAL if failures is not None else BatchVerdict.INVALID_RESPONSE), failures, problem

    def _settle(self, messages: list[dict[str, Any]], invocation: Invocation) -> BatchReport:
        ordered = tuple(message["MessageId"] for message in messages)
        verdict, failures, detail = self._verdict(invocation, set(ordered))
        kept = set(ordered) if failures is None else failures  # None: the whole batch comes back
        deleted = self._delete([message for message in messages if message["MessageId"] not in kept])
        return BatchReport(verdict, len(messages), deleted, tuple(sorted(kept)), invocation, detail, ordered)

    def _delete(self, messages: list[dict[str, Any]]) -> int:
        deleted = 0
        for start in range(0, len(messages), _SQS_MAX):
            chunk = messages[start : start + _SQS_MAX]
            answer = self.sqs.delete_message_batch(
                QueueUrl=self.queue.url,
                Entries=[{"Id": str(index), "ReceiptHandle": m["ReceiptHandle"]} for index, m in enumerate(chunk)],
            )
            deleted += len(answer.get("Successful") or [])
            for failure in answer.get("Failed") or []:
                # As in Lambda: an undeleted message simply comes back; it is not lost.
                logger.warning("delete failed: %s", failure)
        return deleted


class Polls(Protocol):
    """What a group runs: a queue's poller, or a stream's (``local.stream_poller``)."""

    def poll_once(self) -> object: ...


class PollerGroup(Lifecycle):
    """Pollers in daemon threads until ``stop``; a crash in one batch never stops a poller."""

    def __init__(self, pollers: Sequence[Polls]) -> None:
        self._pollers = pollers
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Self:
        # Once only: ``with stack.pollers(n):`` enters a group that is already running.
        for index, poller in enumerate(self._pollers[len(self._threads) :]):
            thread = threading.Thread(target=self._loop, args=(poller,), name=f"poller-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _loop(self, poller: Polls) -> None:
        while not self._stopping.is_set():
            try:
                poller.poll_once()
            except Exception as error:  # e.g. the queue server went away: note it and poll again
                logger.warning("poll failed: %s: %s", type(error).__name__, error)
                self._stopping.wait(1.0)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop polling; an invocation under way finishes (and settles its batch) first."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        self._threads.clear()
