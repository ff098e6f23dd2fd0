"""A lock-mode handler's deliveries, one at a time, on DynamoDB Local: for the guard's tests.

The processor runs as the function runs it (the real store, conflict retries, dead letters),
with a clock the test moves (so leases run out when the test says) and a dead-letter queue
that keeps what it is sent. A worker's death is ``Crash``: nothing in the consumer catches it,
so, as when a process dies, nothing is released.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, cast

from consumer.config import Settings
from consumer.conflicts import ConflictRetry
from consumer.dead_letter import DeadLetterQueue
from consumer.handler import MessageHandler
from consumer.idempotency.store import IdempotencyStore
from consumer.outcome import MessageResult
from consumer.processor import MessageProcessor
from testkit.dynamodb_local import DynamoDBLocal
from testkit.lambda_sqs import sqs_record

if TYPE_CHECKING:
    from types_boto3_sqs import SQSClient

# The invocation's time left at each delivery: the lease is this less the margin.
REMAINING_MS = 60_000
PAST_THE_LEASE_S = REMAINING_MS / 1000 + 1


class Crash(BaseException):
    """The worker dies here: no ``except Exception`` stops it, so nothing is released."""


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
        conflicts = ConflictRetry(base_ms=5, max_ms=50, attempts=10, margin_ms=1_000)
        self.store = IdempotencyStore(
            self.dynamodb, idempotency_table, ttl_seconds=3600, clock=self.clock, conflicts=conflicts
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

    def deliver(self, key: str, payload: dict[str, Any], receive_count: int = 1) -> MessageResult:
        body = {"eventType": self.handler.event_type, "metadata": {"idempotencyKey": key}, "payload": payload}
        record = sqs_record(f"m-{uuid.uuid4().hex[:8]}", json.dumps(body), receive_count=receive_count)
        return self.processor.execute(self.processor.prepare(record), lambda: REMAINING_MS)

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
