"""Look at the dead-letter queue, and move its messages back to the queue (redrive)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from testkit.messages import fifo_fields, is_fifo

# Attributes the consumer adds when it dead-letters a message; a redriven message starts clean.
_REASON_ATTRIBUTES = frozenset({"ErrorType", "ErrorMessage", "OriginalMessageId"})
# ReceiveMessage returns list fields SendMessage refuses when empty.
_SENDABLE_FIELDS = ("DataType", "StringValue", "BinaryValue")
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


def receive(sqs: Any, queue_url: str, **options: Any) -> list[DeadLetter]:
    answer = sqs.receive_message(
        QueueUrl=queue_url,
        MaxNumberOfMessages=_RECEIVE_MAX,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["MessageGroupId"],
        **options,
    )
    return [_dead_letter(message) for message in answer.get("Messages") or []]


def _take_all(sqs: Any, queue_url: str) -> list[DeadLetter]:
    """Every message in the queue, each once, left hidden for 30 s (so each receive brings new ones)."""
    taken: dict[str, DeadLetter] = {}
    while True:
        received = receive(sqs, queue_url, VisibilityTimeout=30, WaitTimeSeconds=0)
        if not (fresh := {letter.message_id: letter for letter in received if letter.message_id not in taken}):
            return list(taken.values())
        taken.update(fresh)


def peek(sqs: Any, queue_url: str) -> list[DeadLetter]:
    """Every message in the queue, each once, left in the queue and visible again afterwards."""
    letters = _take_all(sqs, queue_url)
    _show_again(sqs, queue_url, letters)
    return letters


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
    """Send the dead letters there are now back to the queue (idempotency key kept), deleting them here. All are
    received (and hidden) before the first is sent back: one dead-lettered again meanwhile stays here."""
    letters = _take_all(sqs, dead_letter_url)
    for letter in letters:
        _send_back(sqs, queue_url, letter)
        sqs.delete_message(QueueUrl=dead_letter_url, ReceiptHandle=letter.receipt_handle)
    return len(letters)


def _send_back(sqs: Any, queue_url: str, letter: DeadLetter) -> None:
    request: dict[str, Any] = {"QueueUrl": queue_url, "MessageBody": letter.body}
    kept = {
        name: {key: value for key, value in attribute.items() if key in _SENDABLE_FIELDS}
        for name, attribute in letter.attributes.items()
        if name not in _REASON_ATTRIBUTES
    }
    if kept:
        request["MessageAttributes"] = kept
    if is_fifo(queue_url):
        request.update(fifo_fields(letter.group_id or "redriven"))  # back into its own group
    sqs.send_message(**request)
