"""Look at the dead-letter queue, and move its messages back to the queue (redrive)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Attributes the consumer adds when it dead-letters a message; a redriven message starts clean.
_REASON_ATTRIBUTES = frozenset({"ErrorType", "ErrorMessage", "OriginalMessageId"})
_RECEIVE_MAX = 10


@dataclass(frozen=True)
class DeadLetter:
    message_id: str
    body: str
    error_type: str | None
    error_message: str | None
    attributes: dict[str, dict[str, Any]]
    receipt_handle: str

    @property
    def reason(self) -> str:
        if self.error_type is None:
            return "moved by the queue's redrive policy (maxReceiveCount deliveries without success)"
        return f"{self.error_type}: {self.error_message}"


def _dead_letter(message: dict[str, Any]) -> DeadLetter:
    attributes = message.get("MessageAttributes") or {}
    return DeadLetter(
        message_id=message["MessageId"],
        body=message.get("Body", ""),
        error_type=(attributes.get("ErrorType") or {}).get("StringValue"),
        error_message=(attributes.get("ErrorMessage") or {}).get("StringValue"),
        attributes=attributes,
        receipt_handle=message["ReceiptHandle"],
    )


def peek(sqs: Any, queue_url: str, *, hide_s: int = 2) -> list[DeadLetter]:
    """Every message in the queue, each once; they are hidden ``hide_s`` seconds, not deleted."""
    seen: dict[str, DeadLetter] = {}
    while True:
        answer = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=_RECEIVE_MAX,
            VisibilityTimeout=hide_s,
            MessageAttributeNames=["All"],
            WaitTimeSeconds=0,
        )
        fresh = [m for m in answer.get("Messages") or [] if m["MessageId"] not in seen]
        if not fresh:
            return list(seen.values())
        seen.update((m["MessageId"], _dead_letter(m)) for m in fresh)


def redrive(sqs: Any, dead_letter_url: str, queue_url: str) -> int:
    """Send every dead letter back to the queue (its idempotency key kept), then delete it here."""
    moved = 0
    while True:
        answer = sqs.receive_message(
            QueueUrl=dead_letter_url,
            MaxNumberOfMessages=_RECEIVE_MAX,
            VisibilityTimeout=30,
            MessageAttributeNames=["All"],
            WaitTimeSeconds=1,
        )
        messages = answer.get("Messages") or []
        if not messages:
            return moved
        for message in map(_dead_letter, messages):
            kept = {k: v for k, v in message.attributes.items() if k not in _REASON_ATTRIBUTES}
            request: dict[str, Any] = {"QueueUrl": queue_url, "MessageBody": message.body}
            if kept:
                request["MessageAttributes"] = _sendable(kept)
            sqs.send_message(**request)
            sqs.delete_message(QueueUrl=dead_letter_url, ReceiptHandle=message.receipt_handle)
            moved += 1


def _sendable(attributes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    # ReceiveMessage returns list fields SendMessage refuses when empty.
    return {
        name: {key: value for key, value in attribute.items() if key in ("DataType", "StringValue", "BinaryValue")}
        for name, attribute in attributes.items()
    }
