"""Message bodies in the project's envelope: payments, receipt requests, producer resends and poison.

A resend is what a producer does after a lost acknowledgement: the same body (same idempotency
key, same payload) sent again, so SQS gives it a new ``messageId``.
"""

from __future__ import annotations

import itertools
import json
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from consumer.errors import ErrorType
from consumer.handlers import MessageHandler

CURRENCY = "EUR"
_SEND_BATCH = 10
# The FIFO group of a message whose body names no account (poison that is not an envelope).
NO_ACCOUNT_GROUP = "no-account"


def envelope(event_type: str, key: str | None, payload: dict[str, Any]) -> str:
    body: dict[str, Any] = {"eventType": event_type, "payload": payload}
    if key is not None:
        body["metadata"] = {"idempotencyKey": key}
    return json.dumps(body)


def payment_payload(payment_id: str, account_id: str = "acc-1", amount_cents: int = 1250) -> dict[str, Any]:
    return {"paymentId": payment_id, "accountId": account_id, "amountCents": amount_cents, "currency": CURRENCY}


def receipt_payload(
    receipt_id: str, account_id: str = "acc-1", payment_id: str | None = None, amount_cents: int = 1250
) -> dict[str, Any]:
    return {
        "receiptId": receipt_id,
        "paymentId": payment_id or f"p-{receipt_id}",
        "accountId": account_id,
        "amountCents": amount_cents,
        "currency": CURRENCY,
        "email": f"{account_id}@example.com",
    }


def payment_body(payment_id: str, account_id: str = "acc-1", amount: int = 1250, key: str | None = None) -> str:
    return envelope("PaymentReceived", key or f"pay-{payment_id}", payment_payload(payment_id, account_id, amount))


def receipt_body(receipt_id: str, key: str | None = None, account_id: str = "acc-1") -> str:
    return envelope("ReceiptRequested", key or f"receipt-{receipt_id}", receipt_payload(receipt_id, account_id))


@dataclass(frozen=True)
class Outgoing:
    """One message to send, and what it should come to."""

    body: str
    kind: str  # "drawn" (testkit.payloads), "payment", "receipt", "poison", "custom" (--payload), "from-file"
    key: str | None = None
    # What the consumer should dead-letter it for, for poison.
    expected_error: ErrorType | None = None
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The MessageGroupId: on a FIFO queue by default the payload's account (see ``group_id``); on a
    # standard queue a fair-queue tenant, sent only when set.
    group: str | None = None

    @cached_property
    def _envelope(self) -> dict[str, Any]:
        try:
            document = json.loads(self.body)
        except json.JSONDecodeError:
            return {}
        return document if isinstance(document, dict) else {}

    @property
    def event_type(self) -> str | None:
        return self._envelope.get("eventType")

    @property
    def payload(self) -> dict[str, Any] | None:
        """The payload of a well-formed body; ``None`` for a body that is not an envelope."""
        payload = self._envelope.get("payload")
        return payload if isinstance(payload, dict) else None

    @property
    def group_id(self) -> str:
        """The message group on a FIFO queue: the account, so one account's messages apply in order."""
        if self.group is not None:
            return self.group
        account = (self.payload or {}).get("accountId")
        return account if isinstance(account, str) and account else NO_ACCOUNT_GROUP


def drawn(handler: type[MessageHandler[Any]], key: str, payload: dict[str, Any]) -> Outgoing:
    """A message of any handler (its payload from ``testkit.payloads``); its FIFO group is its key."""
    return Outgoing(envelope(handler.event_type, key, payload), "drawn", key, group=key)


def payment(key: str, payment_id: str, account_id: str, amount_cents: int) -> Outgoing:
    return Outgoing(payment_body(payment_id, account_id, amount_cents, key), "payment", key)


def receipt(key: str, receipt_id: str, account_id: str, payment_id: str, amount_cents: int) -> Outgoing:
    payload = receipt_payload(receipt_id, account_id, payment_id, amount_cents)
    return Outgoing(envelope("ReceiptRequested", key, payload), "receipt", key)


def with_resends(messages: Sequence[Outgoing], fraction: float, rng: random.Random) -> list[Outgoing]:
    """The messages plus resends of about ``fraction`` of them, shuffled in among the originals."""
    resends = [message for message in messages if rng.random() < fraction]
    mixed = [*messages, *resends]
    rng.shuffle(mixed)
    return mixed


def ledger_balance(dynamodb: Any, table: str, account: str) -> int:
    """An account's balance in the example ledger (0 before its first payment), read consistently."""
    key = {"accountId": {"S": account}, "entryId": {"S": "BALANCE"}}
    item = dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
    return int(item["balanceCents"]["N"]) if item else 0


def queue_counts(sqs: Any, queue_url: str) -> tuple[int, int]:
    """Messages waiting (visible or delayed), and in flight (received, or backing off)."""
    attributes = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    waiting = int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesDelayed"])
    return waiting, int(attributes["ApproximateNumberOfMessagesNotVisible"])


def is_fifo(queue_url: str) -> bool:
    return queue_url.endswith(".fifo")


def fifo_fields(message: Outgoing) -> dict[str, str]:
    """What a FIFO queue requires of each send: the group, and a deduplication id of this send's own.

    A new id per send, not one per body: the template turns content-based deduplication off,
    and a producer's resend must reach the consumer (whose idempotency record suppresses it)
    rather than depend on SQS's five-minute deduplication window.
    """
    return {"MessageGroupId": message.group_id, "MessageDeduplicationId": uuid.uuid4().hex}


def send_all(
    sqs: Any, queue_url: str, messages: Sequence[Outgoing], max_depth: int | None = None
) -> dict[str, Outgoing]:
    """Send in batches of 10, each once fewer than ``max_depth`` wait (moto's send cost grows with
    depth); returns each message by the ``messageId`` SQS gave it. On a FIFO queue each message
    goes to its ``group_id``, in the order given."""
    fifo = is_fifo(queue_url)
    sent: dict[str, Outgoing] = {}
    for start in range(0, len(messages), _SEND_BATCH):
        while max_depth is not None and queue_counts(sqs, queue_url)[0] >= max_depth:
            time.sleep(0.05)
        chunk = messages[start : start + _SEND_BATCH]
        entries = [
            {
                "Id": str(index),
                "MessageBody": message.body,
                **({"MessageAttributes": message.attributes} if message.attributes else {}),
                **(fifo_fields(message) if fifo else tenant_field(message)),
            }
            for index, message in enumerate(chunk)
        ]
        answer = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
        if answer.get("Failed"):
            raise RuntimeError(f"SQS refused messages: {answer['Failed']}")
        sent.update({entry["MessageId"]: chunk[int(entry["Id"])] for entry in answer["Successful"]})
    return sent


def tenant_field(message: Outgoing) -> dict[str, str]:
    """On a standard queue a message group is a fair-queue tenant, sent only when the producer names one."""
    return {"MessageGroupId": message.group} if message.group is not None else {}


class MessageFactory:
    """Bodies that never contend (each message has its own key, payment and account) unless asked to."""

    def __init__(self, run_id: str | None = None) -> None:
        # Keys unique across runs too: DynamoDB Local's tables outlive one system's turn.
        self._run_id = run_id or uuid.uuid4().hex[:8]
        self._sequence = itertools.count(1)

    def payment(self) -> str:
        n = self._next()
        return payment_body(f"p-{n}", f"acc-{n}", key=f"pay-{n}")

    def receipt(self) -> str:
        n = self._next()
        return envelope("ReceiptRequested", f"receipt-{n}", receipt_payload(f"r-{n}", f"acc-{n}", f"p-{n}"))

    def payments(self, count: int) -> list[str]:
        return [self.payment() for _ in range(count)]

    def payments_on_one_account(self, count: int) -> list[str]:
        """A hot account: ``count`` distinct payments that all credit one new account."""
        account = f"acc-hot-{self._next()}"
        return [payment_body(f"p-{n}", account, key=f"pay-{n}") for n in (self._next() for _ in range(count))]

    def receipts(self, count: int) -> list[str]:
        return [self.receipt() for _ in range(count)]

    def _next(self) -> str:
        return f"{self._run_id}-{next(self._sequence)}"
