"""What Lambda hands an SQS-triggered function: the event built from received messages, and the context.

The record shape is Lambda's (``sam local generate-event sqs receive-message``):
camelCase keys, system attributes as strings, message attributes in the lowercase
shape with binary values base64-encoded, ``eventSource`` ``aws:sqs``.
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any


def _message_attribute(value: dict[str, Any]) -> dict[str, Any]:
    binary = value.get("BinaryValue")
    return {
        "stringValue": value.get("StringValue"),
        "binaryValue": base64.b64encode(binary).decode("ascii") if binary is not None else None,
        "stringListValues": list(value.get("StringListValues") or []),
        "binaryListValues": [base64.b64encode(item).decode("ascii") for item in value.get("BinaryListValues") or []],
        "dataType": value["DataType"],
    }


def sqs_record(message: dict[str, Any], *, queue_arn: str, region: str) -> dict[str, Any]:
    """One ``Records[]`` entry from one message of a ``ReceiveMessage`` answer."""
    record: dict[str, Any] = {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message.get("Body", ""),
        # Lambda passes the system attributes SQS returned, all as strings.
        "attributes": {name: str(value) for name, value in (message.get("Attributes") or {}).items()},
        "messageAttributes": {
            name: _message_attribute(value) for name, value in (message.get("MessageAttributes") or {}).items()
        },
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": region,
    }
    if message.get("MD5OfMessageAttributes"):
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    return record


def sqs_event(messages: list[dict[str, Any]], *, queue_arn: str, region: str) -> dict[str, Any]:
    return {"Records": [sqs_record(message, queue_arn=queue_arn, region=region) for message in messages]}


@dataclass
class LambdaContext:
    """The context object of the Python runtime; the remaining time follows the function's Timeout."""

    function_name: str
    invoked_function_arn: str
    memory_limit_in_mb: int
    timeout_s: float
    function_version: str = "$LATEST"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    identity: Any = None
    client_context: Any = None
    _deadline: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._deadline = time.monotonic() + self.timeout_s
        self.log_group_name = f"/aws/lambda/{self.function_name}"
        self.log_stream_name = f"local/{self.aws_request_id}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))

    def timed_out(self) -> bool:
        return time.monotonic() >= self._deadline
