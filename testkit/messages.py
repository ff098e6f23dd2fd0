"""Message bodies in the project's envelope, producer resends and poison, and sending them. A resend is what a producer
does after a lost acknowledgement: the same body (key and payload) sent again, so SQS gives it a new ``messageId``."""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from consumer.errors import ErrorType
from consumer.handler import MessageHandler

_SEND_BATCH = 10
# The FIFO group of a message with neither a group nor a key (poison that is not an envelope).
NO_KEY_GROUP = "no-key"
EMITTED = "emitted"  # the kind of a message the outbox emitted: its key is its item's id


def envelope(event_type: str, key: str | None, payload: Mapping[str, Any]) -> str:
    body: dict[str, Any] = {"eventType": event_type, "payload": dict(payload)}
    if key is not None:
        body["metadata"] = {"idempotencyKey": key}
    return json.dumps(body)


@dataclass(frozen=True)
class Outgoing:
    """One message to send, and what it should come to."""

    body: str
    kind: str  # "drawn" (testkit.payloads), "reused", "poison", "custom" (--payload), "from-file", an example's own
    key: str | None = None
    # What the consumer should dead-letter it for, for poison.
    expected_error: ErrorType | None = None
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The MessageGroupId: on a FIFO queue by default the key (see ``group_id``); on a standard queue a
    # fair-queue tenant, sent only when set.
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
    def record_id(self) -> str | None:
        """The idempotency record a well-formed message claims (its event type and key); ``None`` for poison that
        never reaches one. A message the outbox emitted is ``Outgoing(body, EMITTED, item id)``."""
        if self.payload is None or self.event_type is None or self.key is None:
            return None
        return f"{self.event_type}#{self.key}"

    @property
    def group_id(self) -> str:
        """The message group on a FIFO queue: the one given, else the key (one message group per key)."""
        return self.group or self.key or NO_KEY_GROUP


def drawn(handler: type[MessageHandler[Any]], key: str, payload: dict[str, Any]) -> Outgoing:
    """A message of any handler (its payload from ``testkit.payloads``); its FIFO group is its key."""
    return Outgoing(envelope(handler.event_type, key, payload), "drawn", key, group=key)


def with_resends(messages: Sequence[Outgoing], fraction: float, rng: random.Random) -> list[Outgoing]:
    """The messages plus resends of about ``fraction`` of them, shuffled in among the originals."""
    resends = [message for message in messages if rng.random() < fraction]
    mixed = [*messages, *resends]
    rng.shuffle(mixed)
    return mixed


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


def fifo_fields(group: str) -> dict[str, str]:
    """The group, and a deduplication id per send (not per body): content-based deduplication is off, and a
    producer's resend must reach the consumer, whose idempotency record suppresses it, not SQS's 5-minute window."""
    return {"MessageGroupId": group, "MessageDeduplicationId": uuid.uuid4().hex}


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
                **(fifo_fields(message.group_id) if fifo else tenant_field(message)),
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
