"""The workload: payments over accounts, receipts, producer resends and poison, fed at a bounded depth.

Built from the local stack's message builders (``local.workload``), seeded, so a failing
run can be replayed with the same messages. The feeder keeps the queue shallow (moto's
send cost grows with depth) and remembers which SQS ``messageId`` each message got:
the invariants are checked per message.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from local.workload import Outgoing, payments, poison, receipts, with_resends

_SEND_BATCH = 10
KEY_REUSED = "IdempotencyKeyReused"


@dataclass(frozen=True)
class WorkloadShape:
    messages: int  # distinct business messages (payments and receipts)
    accounts: int
    receipt_ratio: float
    duplicate_ratio: float  # resends: the same key and body again, with a new messageId
    poison_ratio: float  # of ``messages``; one in four of them reuses a payment's key with another amount


@dataclass(frozen=True)
class Workload:
    messages: list[Outgoing]  # in send order
    distinct_payments: int
    distinct_receipts: int
    resends: int
    poison: int


def build_workload(shape: WorkloadShape, rng: random.Random, run_id: str) -> Workload:
    receipt_count = round(shape.messages * shape.receipt_ratio)
    paid = payments(shape.messages - receipt_count, shape.accounts, rng, prefix=f"pay-{run_id}")
    receipted = receipts(receipt_count, shape.accounts, rng, prefix=f"rcpt-{run_id}")
    originals = [*paid, *receipted]
    mixed = with_resends(originals, shape.duplicate_ratio, rng)
    bad: list[Outgoing] = []
    for _ in range(math.ceil(shape.messages * shape.poison_ratio / 4)):
        bad.extend(poison(1, reused=rng.choice(paid) if paid else None))
    for message in bad:
        mixed.insert(rng.randrange(len(mixed) + 1), message)
    return Workload(mixed, len(paid), len(receipted), len(mixed) - len(originals) - len(bad), len(bad))


def payload_of(message: Outgoing) -> dict[str, Any] | None:
    """The payload of a well-formed message; ``None`` for a body that is not an envelope."""
    try:
        body = json.loads(message.body)
    except json.JSONDecodeError:
        return None
    payload = body.get("payload") if isinstance(body, dict) else None
    return payload if isinstance(payload, dict) else None


def event_type_of(message: Outgoing) -> str | None:
    try:
        body = json.loads(message.body)
    except json.JSONDecodeError:
        return None
    return body.get("eventType") if isinstance(body, dict) else None


@dataclass
class Feeder:
    """Sends the workload, at most ``max_depth`` messages waiting in the queue at a time."""

    sqs: Any
    queue_url: str
    max_depth: int
    sent: dict[str, Outgoing] = field(default_factory=dict)  # messageId -> message

    def depth(self) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"])

    def feed(self, messages: list[Outgoing]) -> None:
        for start in range(0, len(messages), _SEND_BATCH):
            while self.depth() >= self.max_depth:
                time.sleep(0.05)
            chunk = messages[start : start + _SEND_BATCH]
            entries = [{"Id": str(index), "MessageBody": message.body} for index, message in enumerate(chunk)]
            answer = self.sqs.send_message_batch(QueueUrl=self.queue_url, Entries=entries)
            if answer.get("Failed"):
                raise RuntimeError(f"SQS refused messages: {answer['Failed']}")
            for entry in answer["Successful"]:
                self.sent[entry["MessageId"]] = chunk[int(entry["Id"])]
