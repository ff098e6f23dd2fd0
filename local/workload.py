"""Messages to push: payments, producer resends, receipt requests and poison of every kind.

A resend is what a producer does after a lost acknowledgement: the same body (same
idempotency key, same payload) sent again, so SQS gives it a new ``messageId``.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

_SEND_BATCH = 10
CURRENCY = "EUR"


@dataclass(frozen=True)
class Outgoing:
    """One message to send, and what it should come to."""

    body: str
    kind: str  # "payment", "receipt", or "poison"
    key: str | None = None
    # What the consumer should dead-letter it for, for poison.
    expected_error: str | None = None
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    payment: dict[str, Any] | None = None


def envelope(event_type: str, key: str | None, payload: dict[str, Any]) -> str:
    body: dict[str, Any] = {"eventType": event_type, "payload": payload}
    if key is not None:
        body["metadata"] = {"idempotencyKey": key}
    return json.dumps(body)


def payment(key: str, payment_id: str, account_id: str, amount_cents: int) -> Outgoing:
    payload = {"paymentId": payment_id, "accountId": account_id, "amountCents": amount_cents, "currency": CURRENCY}
    return Outgoing(envelope("PaymentReceived", key, payload), "payment", key, payment=payload)


def receipt(key: str, receipt_id: str, account_id: str, payment_id: str, amount_cents: int) -> Outgoing:
    payload = {
        "receiptId": receipt_id,
        "paymentId": payment_id,
        "accountId": account_id,
        "amountCents": amount_cents,
        "currency": CURRENCY,
        "email": f"{account_id}@example.com",
    }
    return Outgoing(envelope("ReceiptRequested", key, payload), "receipt", key)


def payments(count: int, accounts: int, rng: random.Random, prefix: str = "pay") -> list[Outgoing]:
    return [
        payment(
            key=f"{prefix}-{index:06d}",
            payment_id=f"{prefix}-p{index:06d}",
            account_id=f"acc-{rng.randrange(accounts):03d}",
            amount_cents=rng.randrange(100, 100_000),
        )
        for index in range(count)
    ]


def receipts(count: int, accounts: int, rng: random.Random, prefix: str = "rcpt") -> list[Outgoing]:
    return [
        receipt(
            key=f"{prefix}-{index:06d}",
            receipt_id=f"{prefix}-r{index:06d}",
            account_id=f"acc-{rng.randrange(accounts):03d}",
            payment_id=f"{prefix}-p{index:06d}",
            amount_cents=rng.randrange(100, 100_000),
        )
        for index in range(count)
    ]


def with_resends(messages: Sequence[Outgoing], fraction: float, rng: random.Random) -> list[Outgoing]:
    """The messages plus resends of about ``fraction`` of them, shuffled in among the originals."""
    resends = [message for message in messages if rng.random() < fraction]
    mixed = [*messages, *resends]
    rng.shuffle(mixed)
    return mixed


def poison(per_kind: int, reused: Outgoing | None = None) -> list[Outgoing]:
    """Messages that can never succeed, ``per_kind`` of each; key reuse needs an applied payment."""
    made: list[Outgoing] = []
    for index in range(per_kind):
        made.append(Outgoing('{"eventType": "PaymentReceived", "payload": ', "poison", None, "InvalidJson"))
        made.append(
            Outgoing(
                envelope("PaymentReceived", f"bad-{index}", {"paymentId": f"bad-{index}", "accountId": "acc-000"}),
                "poison",
                f"bad-{index}",
                "SchemaViolation",
            )
        )
        made.append(
            Outgoing(
                envelope("LoyaltyPointsAwarded", f"points-{index}", {"awardId": f"pts-{index}", "points": 50}),
                "poison",
                f"points-{index}",
                "UnknownEventType",
            )
        )
        if reused is not None and reused.payment is not None:
            changed = {**reused.payment, "amountCents": reused.payment["amountCents"] + 1 + index}
            made.append(
                Outgoing(envelope("PaymentReceived", reused.key, changed), "poison", reused.key, "IdempotencyKeyReused")
            )
    return made


def expected_balances(messages: Iterable[Outgoing]) -> dict[str, int]:
    """Balance per account = the sum of its distinct payments, however often each was sent."""
    distinct = {m.payment["paymentId"]: m.payment for m in messages if m.kind == "payment" and m.payment}
    balances: Counter[str] = Counter()
    for paid in distinct.values():
        balances[paid["accountId"]] += paid["amountCents"]
    return dict(balances)


def _entry(index: int, message: Outgoing) -> dict[str, Any]:
    entry: dict[str, Any] = {"Id": str(index), "MessageBody": message.body}
    if message.attributes:
        entry["MessageAttributes"] = message.attributes
    return entry


def send_all(sqs: Any, queue_url: str, messages: Sequence[Outgoing]) -> list[str]:
    """Send in batches of 10; returns the message ids SQS assigned."""
    ids: list[str] = []
    for start in range(0, len(messages), _SEND_BATCH):
        chunk = messages[start : start + _SEND_BATCH]
        entries = [_entry(index, message) for index, message in enumerate(chunk)]
        answer = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        if answer.get("Failed"):
            raise RuntimeError(f"SQS refused messages: {answer['Failed']}")
        ids.extend(entry["MessageId"] for entry in answer["Successful"])
    return ids
