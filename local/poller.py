"""A poller that behaves as Lambda's SQS event source mapping.

Receive up to the batch size (long polling, and within the batching window when the
template sets one), build the event Lambda would, invoke the handler, then:

- the handler raised, timed out, answered something the runtime could not serialise
  (``Runtime.MarshalError``), or (with ``ReportBatchItemFailures``) answered with a
  malformed response or an ``itemIdentifier`` that is not in the batch: delete nothing,
  the whole batch comes back after its visibility timeout;
- otherwise delete every record but the reported failures.

The function runs in Lambda's own runtime (``local.lambda_runtime``), one execution
environment per poller, as Lambda runs one per concurrent invocation.

Nothing else touches the messages: receive counts and the move to the dead-letter
queue are the queue's own redrive policy. Several pollers may run at once, each
invocation independent, as concurrent Lambda invocations are.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from local.aws import REGION
from local.invocation import Invocation, Invoker
from local.resources import QueueResource, SqsTrigger
from testkit.lambda_sqs import event_from_messages

_SQS_MAX_RECEIVE = 10
_DELETE_CHUNK = 10
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
    """What one invocation did to the queue."""

    verdict: BatchVerdict
    received: int
    deleted: int
    failed_ids: tuple[str, ...]
    invocation: Invocation
    detail: str = ""


def reported_failures(response: Any, batch_ids: set[str]) -> tuple[set[str] | None, str]:
    """The ids to keep from a partial batch response, or ``None`` when it fails the whole batch.

    Lambda's rules: a null or empty response, or an empty list, is full success; anything
    malformed, or an id that is not one of the batch's, fails the whole batch.
    """
    if response is None or response == {}:
        return set(), ""
    if not isinstance(response, dict):
        return None, f"response is a {type(response).__name__}, not an object"
    failures = response.get("batchItemFailures")
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
    reported_failures: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, report: BatchReport) -> None:
        with self._lock:
            self.invocations += 1
            self.received += report.received
            self.deleted += report.deleted
            self.reported_failures += len(report.failed_ids)
            self.verdicts[report.verdict.value] += 1


class Poller:
    """One event source mapping poller for one queue and one function."""

    def __init__(
        self,
        sqs: Any,
        queue: QueueResource,
        trigger: SqsTrigger,
        runtime: Invoker,
        *,
        wait_time_s: int = 1,
        on_batch: Callable[[BatchReport], None] | None = None,
    ) -> None:
        self._sqs = sqs
        self._queue = queue
        self._trigger = trigger
        self._runtime = runtime
        # Short long-polls keep a stop request prompt; Lambda's own pollers wait 20 s.
        self._wait_time_s = wait_time_s
        self._on_batch = on_batch

    def receive(self) -> list[dict[str, Any]]:
        """Up to BatchSize messages: one long poll, topped up within the batching window."""
        messages: list[dict[str, Any]] = []
        window_ends = time.monotonic() + self._trigger.batching_window_s
        while len(messages) < self._trigger.batch_size:
            wait_s = self._wait_time_s if not messages else max(0, round(window_ends - time.monotonic()))
            answer = self._sqs.receive_message(
                QueueUrl=self._queue.url,
                MaxNumberOfMessages=min(_SQS_MAX_RECEIVE, self._trigger.batch_size - len(messages)),
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
        messages = self.receive()
        if not messages:
            return None
        event = event_from_messages(messages, queue_arn=self._queue.arn, region=REGION)
        invocation = self._runtime.invoke(event)
        report = self._settle(messages, invocation)
        if self._on_batch is not None:
            self._on_batch(report)
        return report

    def _settle(self, messages: list[dict[str, Any]], invocation: Invocation) -> BatchReport:
        ids = {message["MessageId"] for message in messages}
        if invocation.error is not None:
            error = f"{invocation.error_type}: {invocation.error}"
            return BatchReport(BatchVerdict.RAISED, len(messages), 0, tuple(sorted(ids)), invocation, error)
        if invocation.timed_out:
            detail = f"ran {invocation.duration_s:.1f}s, Timeout is {self._runtime.function.timeout_s}s"
            return BatchReport(BatchVerdict.TIMED_OUT, len(messages), 0, tuple(sorted(ids)), invocation, detail)
        if self._trigger.report_batch_item_failures:
            failures, problem = reported_failures(invocation.response, ids)
        else:
            failures, problem = set(), ""
        if failures is None:
            return BatchReport(BatchVerdict.INVALID_RESPONSE, len(messages), 0, tuple(sorted(ids)), invocation, problem)
        done = [message for message in messages if message["MessageId"] not in failures]
        deleted = self._delete(done)
        return BatchReport(BatchVerdict.PARTIAL, len(messages), deleted, tuple(sorted(failures)), invocation)

    def _delete(self, messages: list[dict[str, Any]]) -> int:
        deleted = 0
        for start in range(0, len(messages), _DELETE_CHUNK):
            chunk = messages[start : start + _DELETE_CHUNK]
            answer = self._sqs.delete_message_batch(
                QueueUrl=self._queue.url,
                Entries=[{"Id": str(index), "ReceiptHandle": m["ReceiptHandle"]} for index, m in enumerate(chunk)],
            )
            deleted += len(answer.get("Successful") or [])
            for failure in answer.get("Failed") or []:
                # As in Lambda: an undeleted message simply comes back; it is not lost.
                logger.warning("delete failed: %s", failure)
        return deleted


class PollerGroup:
    """``count`` pollers in daemon threads until ``stop``; a crash in one batch never stops a poller."""

    def __init__(self, pollers: list[Poller]) -> None:
        self._pollers = pollers
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self) -> PollerGroup:
        for index, poller in enumerate(self._pollers):
            thread = threading.Thread(target=self._loop, args=(poller,), name=f"poller-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _loop(self, poller: Poller) -> None:
        while not self._stopping.is_set():
            try:
                poller.poll_once()
            except Exception as error:  # e.g. the queue server went away: note it and poll again
                self.errors.append(error)
                logger.warning("poll failed: %s: %s", type(error).__name__, error)
                self._stopping.wait(1.0)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop polling; an invocation under way finishes (and settles its batch) first."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=timeout_s)
        self._threads.clear()

    def __enter__(self) -> PollerGroup:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
