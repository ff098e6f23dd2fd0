"""Send poison messages to the dead-letter queue with the reason attached."""

from __future__ import annotations

import base64
from typing import Any

from consumer.envelope import message_group_id

# SQS allows 10 message attributes; ours take 4, the original ones fill the rest.
_MAX_ATTRIBUTES = 10
_MAX_REASON_CHARS = 1_000


class DeadLetterQueue:
    def __init__(self, client: Any, queue_url: str) -> None:
        self._client = client
        self._url = queue_url
        self._fifo = queue_url.endswith(".fifo")

    def send(self, record: dict[str, Any], error_type: str, error_message: str, idempotency_key: str = "") -> None:
        """Send the original body with ``ErrorType`` and ``ErrorMessage``; raises on failure."""
        ours: dict[str, dict[str, str]] = {
            "ErrorType": {"DataType": "String", "StringValue": error_type},
            "ErrorMessage": {"DataType": "String", "StringValue": error_message[:_MAX_REASON_CHARS] or error_type},
            "OriginalMessageId": {"DataType": "String", "StringValue": record["messageId"]},
        }
        if idempotency_key:
            ours["IdempotencyKey"] = {"DataType": "String", "StringValue": idempotency_key}
        attributes = {**self._original_attributes(record, _MAX_ATTRIBUTES - len(ours)), **ours}
        request: dict[str, Any] = {
            "QueueUrl": self._url,
            # SQS refuses an empty body; an empty original is still worth keeping.
            "MessageBody": record.get("body") or "(empty body)",
            "MessageAttributes": attributes,
        }
        if self._fifo:
            request["MessageGroupId"] = message_group_id(record) or "dead-letter"
            request["MessageDeduplicationId"] = record["messageId"]
        self._client.send_message(**request)

    @staticmethod
    def _original_attributes(record: dict[str, Any], room: int) -> dict[str, dict[str, str]]:
        kept: dict[str, dict[str, str]] = {}
        for name, value in (record.get("messageAttributes") or {}).items():
            if len(kept) >= room or name in {"ErrorType", "ErrorMessage", "OriginalMessageId", "IdempotencyKey"}:
                continue
            data_type = value.get("dataType", "String")
            if data_type.startswith("Binary"):
                if value.get("binaryValue") is not None:
                    # Lambda hands binary attributes over base64-encoded; boto3 wants bytes.
                    kept[name] = {"DataType": data_type, "BinaryValue": base64.b64decode(value["binaryValue"])}
            elif value.get("stringValue") is not None:
                kept[name] = {"DataType": data_type, "StringValue": value["stringValue"]}
        return kept
