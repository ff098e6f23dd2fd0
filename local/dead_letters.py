"""Look at the dead-letter queue, and move its messages back to the queue (redrive)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from testkit.messages import is_fifo

# Attributes the consumer adds when it dead-letters a message; a redriven message starts clean.
_REASON_ATTRIBUTES = frozenset({"ErrorType", "ErrorMessage", "OriginalMessageId"})
_RECEIVE_MAX = 10


@dataclass(frozen=True)
class DeadLetter:
    # The id of the message the consumer dead-lettered (a letter is a copy with an id of its own),
    # or, for one the redrive policy moved, its own id.
    original_message_id: str
    error_type: str | None  # None: moved by the redrive policy, not by the consumer
    error_message: str | None = None
    body: str = ""
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    message_id: str = ""
    receipt_handle: str = ""
    group_id: str | None = None  # its MessageGroupId, on a FIFO dead-letter queue

    @property
    def reason(self) -> str:
        if self.error_type is None:
            return "moved by the queue's redrive policy (maxReceiveCount deliveries without success)"
        return f"{self.error_type}: {self.error_message}"


def _dead_letter(message: dict[str, Any]) -> DeadLetter:
    attributes = message.get("MessageAttributes") or {}
    return DeadLetter(
        original_message_id=(attributes.get("OriginalMessageId") or {}).get("StringValue") or message["MessageId"],
        error_type=(attributes.get("ErrorType") or {}).get("StringValue"),
        error_message=(attributes.get("ErrorMessage") or {}).get("StringValue"),
        body=message.get("Body", ""),
        attributes=attributes,
        message_id=message["MessageId"],
        receipt_handle=message["ReceiptHandle"],
        group_id=(message.get("Attributes") or {}).get("MessageGroupId"),
    )


def peek(sqs: Any, queue_url: str) -> list[DeadLetter]:
    """Every message in the queue, each once, left in the queue and visible again afterwards."""
    seen: dict[str, DeadLetter] = {}
    try:
        while True:
            answer = sqs.receive_message(
                QueueUrl=queue_url,
                MaxNumberOfMessages=_RECEIVE_MAX,
                # Hidden while we page through, so each receive brings new ones.
                VisibilityTimeout=30,
                MessageAttributeNames=["All"],
                WaitTimeSeconds=0,
            )
            fresh = [m for m in answer.get("Messages") or [] if m["MessageId"] not in seen]
            if not fresh:
                return list(seen.values())
            seen.update((m["MessageId"], _dead_letter(m)) for m in fresh)
    finally:
        _show_again(sqs, queue_url, list(seen.values()))


def drain(sqs: Any, queue_url: str) -> list[DeadLetter]:
    """Every message in the queue, taken out of it (for tests that read each letter once)."""
    taken: list[DeadLetter] = []
    while True:
        answer = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=_RECEIVE_MAX, MessageAttributeNames=["All"], WaitTimeSeconds=0
        )
        letters = [_dead_letter(message) for message in answer.get("Messages") or []]
        if not letters:
            return taken
        taken += letters
        for letter in letters:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=letter.receipt_handle)


def reasons(letters: list[DeadLetter]) -> dict[str, str | None]:
    """The ``ErrorType`` of each dead-lettered message, by the id of the message it copies."""
    return {letter.original_message_id: letter.error_type for letter in letters}


def _show_again(sqs: Any, queue_url: str, letters: list[DeadLetter]) -> None:
    for start in range(0, len(letters), _RECEIVE_MAX):
        chunk = letters[start : start + _RECEIVE_MAX]
        entries = [
            {"Id": str(index), "ReceiptHandle": letter.receipt_handle, "VisibilityTimeout": 0}
            for index, letter in enumerate(chunk)
        ]
        sqs.change_message_visibility_batch(QueueUrl=queue_url, Entries=entries)


def redrive(sqs: Any, dead_letter_url: str, queue_url: str) -> int:
    """Send the dead letters there are now back to the queue (idempotency key kept), deleting them here.

    Only those present when it starts: a redriven poison message that is dead-lettered
    again while this runs stays in the dead-letter queue.
    """
    targets = {letter.message_id for letter in peek(sqs, dead_letter_url)}
    moved: set[str] = set()
    skipped: dict[str, DeadLetter] = {}
    try:
        while targets - moved:
            answer = sqs.receive_message(
                QueueUrl=dead_letter_url,
                MaxNumberOfMessages=_RECEIVE_MAX,
                VisibilityTimeout=30,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["MessageGroupId"],
                WaitTimeSeconds=1,
            )
            fresh = [
                _dead_letter(m) for m in answer.get("Messages") or [] if m["MessageId"] not in moved | set(skipped)
            ]
            if not fresh:
                break
            for letter in fresh:
                if letter.message_id not in targets:
                    skipped[letter.message_id] = letter
                    continue
                _send_back(sqs, queue_url, letter)
                sqs.delete_message(QueueUrl=dead_letter_url, ReceiptHandle=letter.receipt_handle)
                moved.add(letter.message_id)
    finally:
        _show_again(sqs, dead_letter_url, list(skipped.values()))
    return len(moved)


def _send_back(sqs: Any, queue_url: str, letter: DeadLetter) -> None:
    kept = {name: value for name, value in letter.attributes.items() if name not in _REASON_ATTRIBUTES}
    request: dict[str, Any] = {"QueueUrl": queue_url, "MessageBody": letter.body}
    if kept:
        request["MessageAttributes"] = _sendable(kept)
    if is_fifo(queue_url):
        # Back into its own group; a new deduplication id, or SQS would drop a redrive within 5 minutes of the send.
        request.update(MessageGroupId=letter.group_id or "redriven", MessageDeduplicationId=uuid.uuid4().hex)
    sqs.send_message(**request)


def _sendable(attributes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    # ReceiveMessage returns list fields SendMessage refuses when empty.
    return {
        name: {key: value for key, value in attribute.items() if key in ("DataType", "StringValue", "BinaryValue")}
        for name, attribute in attributes.items()
    }
