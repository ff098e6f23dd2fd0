"""A lock-mode handler's deliveries, one at a time or side by side, on DynamoDB Local: for the core's guard tests
(tests/core/integration/test_guards.py); a handler's own tests use the kit (tests/kit.py).

The processor runs as the function runs it (the real store with group commit, conflict retries,
dead letters), with a clock the test moves (so leases run out when the test says) and a
dead-letter queue that keeps what it is sent. A worker's death is the kit's ``Crash``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders

from consumer.config import Settings
from consumer.conflicts import ConflictRetry
from consumer.dead_letter import DeadLetterQueue
from consumer.handler import MessageHandler
from consumer.idempotency import IdempotencyStore
from consumer.outcome import MessageResult
from consumer.prepared import Prepared
from consumer.processor import MessageProcessor
from testkit.dynamodb_local import DynamoDBLocal
from testkit.lambda_sqs import sqs_record
from tests.kit import Crash

if TYPE_CHECKING:
    from types_boto3_sqs import SQSClient

# The invocation's time left at each delivery: the lease is this less the margin.
REMAINING_MS = 60_000
PAST_THE_LEASE_S = REMAINING_MS / 1000 + 1
RECORD_TTL_S = 3600
# How long a shared transaction waits for the transitions of the threads taking part: far longer than they take to
# arrive, so the claims of deliveries made together are shared by construction, not by the scheduler's grace.
GROUP_COMMIT_WAIT_MS = 2_000


# Which of the store's transactions a request is, by its first item (the record's).
Transition = Callable[[dict[str, Any]], bool]


def release(first: dict[str, Any]) -> bool:
    return "Delete" in first


def claim(first: dict[str, Any]) -> bool:
    return "Update" in first and first["Update"]["ConditionExpression"].startswith("attribute_not_exists")


def commit(first: dict[str, Any]) -> bool:
    return "Update" in first and first["Update"]["ConditionExpression"].startswith("#owner")


class Refusals:
    """Answers the next ``count`` transactions of one kind (``release``, ``claim``) as DynamoDB refuses them,
    without sending them: ``reasons`` gives each item's cancellation code by position (the record first),
    or ``error`` a whole request's error code (throttled). A fault put where the test says, never by chance."""

    def __init__(
        self,
        rig: LockRig,
        transition: Transition,
        count: int,
        *,
        reasons: tuple[str, ...] = (),
        error: str = "TransactionCanceledException",
    ) -> None:
        self.left = count
        self._transition = transition
        self._reasons = reasons
        self._error = error
        rig.dynamodb.meta.events.register("before-call.dynamodb.TransactWriteItems", self._answer)

    def _answer(self, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        items = json.loads(params["body"])["TransactItems"]
        if self.left <= 0 or not self._transition(items[0]):
            return None
        self.left -= 1
        answer: dict[str, Any] = {
            "ResponseMetadata": {"HTTPStatusCode": 400},
            "Error": {"Code": self._error, "Message": f"{self._error} (planted)"},
        }
        if self._error == "TransactionCanceledException":
            codes = [*self._reasons, *["None"] * len(items)][: len(items)]
            answer["CancellationReasons"] = [{"Code": code} for code in codes]
        return AWSResponse("", 400, HTTPHeaders(), None), answer


class DeadLetters:
    """Stands in for the SQS client: keeps each dead letter's attributes."""

    def __init__(self) -> None:
        self.sent: list[dict[str, str]] = []

    def send_message(self, **request: Any) -> dict[str, str]:
        self.sent.append({name: value["StringValue"] for name, value in request["MessageAttributes"].items()})
        return {"MessageId": str(uuid.uuid4())}


class LockRig:
    def __init__(
        self, dynamodb_local: DynamoDBLocal, idempotency_table: str, handler: MessageHandler[Any], settings: Settings
    ) -> None:
        self.now = time.time()
        self.dynamodb = dynamodb_local.client()
        conflicts = ConflictRetry(base_ms=5, max_ms=50, margin_ms=1_000)
        self.store = IdempotencyStore(
            self.dynamodb,
            idempotency_table,
            ttl_seconds=RECORD_TTL_S,
            clock=self.clock,
            conflicts=conflicts,
            group_commit_wait_ms=GROUP_COMMIT_WAIT_MS,
        )
        self.dead_letters = DeadLetters()
        self.handler = handler
        self.processor = MessageProcessor(
            self.store,
            {handler.event_type: handler},
            DeadLetterQueue(lambda: cast("SQSClient", self.dead_letters), "https://sqs.local/dlq"),
            settings,
            logging.getLogger("lock-rig"),
            clock=self.clock,
        )

    def clock(self) -> float:
        return self.now

    def advance_past_the_lease(self) -> None:
        self.now += PAST_THE_LEASE_S

    def advance_past_the_record(self) -> None:
        """Past the record's expiry: its key counts as never seen."""
        self.now += PAST_THE_LEASE_S + RECORD_TTL_S

    def deliver(
        self, key: str, payload: dict[str, Any], receive_count: int = 1, remaining_ms: int = REMAINING_MS
    ) -> MessageResult:
        """One delivery, with ``remaining_ms`` of the invocation left throughout (conflicts are retried while
        more than the rig's margin, 1 s, is left)."""
        return self.processor.execute(self._prepared(key, payload, receive_count), lambda: remaining_ms)

    def deliver_together(self, *deliveries: tuple[str, dict[str, Any], int]) -> list[MessageResult]:
        """Deliveries (key, payload, receive count) in one batch, as the lanes' first messages: each on a thread of
        its own, all joined to the store's group commit before any starts, so their claims share a transaction
        (their commits share one only where their handlers end together). Results in the given order; a ``Crash``
        (or anything else a delivery raised) is raised here once every thread has ended, the first one's."""
        items = [self._prepared(*delivery) for delivery in deliveries]
        results: list[MessageResult | None] = [None] * len(items)
        raised: list[BaseException | None] = [None] * len(items)

        def run(index: int) -> None:
            try:
                results[index] = self.processor.execute(items[index], lambda: REMAINING_MS)
            except BaseException as error:  # a worker's death (Crash) is the test's to see, not the thread's
                raised[index] = error
            finally:
                self.store.leave()

        self.store.join(len(items))
        threads = [threading.Thread(target=run, args=(index,)) for index in range(len(items))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for error in raised:
            if error is not None:
                raise error
        return [result for result in results if result is not None]

    def _prepared(self, key: str, payload: dict[str, Any], receive_count: int) -> Prepared:
        body = {"eventType": self.handler.event_type, "metadata": {"idempotencyKey": key}, "payload": payload}
        record = sqs_record(f"m-{uuid.uuid4().hex[:8]}", json.dumps(body), receive_count=receive_count)
        return self.processor.prepare(record)

    def crash(self, key: str, payload: dict[str, Any]) -> None:
        """Deliver, expecting the handler to raise ``Crash`` (the worker dies mid-record)."""
        try:
            self.deliver(key, payload)
        except Crash:
            return
        raise AssertionError("the delivery did not crash")

    def item(self, table: str, key: dict[str, Any]) -> dict[str, Any] | None:
        found = self.dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
        return dict(found) if found else None
