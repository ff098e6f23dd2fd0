"""What Lambda hands an SQS-triggered function: the records in Lambda's shape (``sam local generate-event sqs
receive-message``), from real ``ReceiveMessage`` answers (the local poller) or a body; the event and the context."""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

REGION = "us-east-1"
QUEUE_ARN = f"arn:aws:sqs:{REGION}:123456789012:consumer-queue"
FIFO_QUEUE_ARN = f"{QUEUE_ARN}.fifo"


def _message_attribute(value: dict[str, Any]) -> dict[str, Any]:
    binary = value.get("BinaryValue")
    return {
        "stringValue": value.get("StringValue"),
        "binaryValue": base64.b64encode(binary).decode("ascii") if binary is not None else None,
        "stringListValues": list(value.get("StringListValues") or []),
        "binaryListValues": [base64.b64encode(item).decode("ascii") for item in value.get("BinaryListValues") or []],
        "dataType": value["DataType"],
    }


def record_from_message(message: dict[str, Any], *, queue_arn: str) -> dict[str, Any]:
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
        "awsRegion": REGION,
    }
    if message.get("MD5OfMessageAttributes"):
        record["md5OfMessageAttributes"] = message["MD5OfMessageAttributes"]
    return record


def sqs_record(
    message_id: str,
    body: str,
    *,
    group_id: str | None = None,
    receive_count: int = 1,
    message_attributes: dict[str, Any] | None = None,
    queue_arn: str = QUEUE_ARN,
) -> dict[str, Any]:
    """A record as Lambda delivers it, sent now; ``group_id`` with ``FIFO_QUEUE_ARN`` makes it a FIFO queue's,
    with the standard ``QUEUE_ARN`` a fair queue's tenant. ``message_attributes`` are in the record's shape."""
    sent_ms = str(int(time.time() * 1000))
    attributes = {
        "ApproximateReceiveCount": str(receive_count),
        "SentTimestamp": sent_ms,
        "SenderId": "AIDAEXAMPLE",
        "ApproximateFirstReceiveTimestamp": sent_ms,
    }
    if group_id is not None:
        attributes["MessageGroupId"] = group_id
        attributes["MessageDeduplicationId"] = message_id
    message = {
        "MessageId": message_id,
        "ReceiptHandle": f"handle-{message_id}",
        "Body": body,
        "Attributes": attributes,
        # surrogatepass: tests hand over bodies SQS would refuse (lone surrogates) to see the consumer refuse them.
        "MD5OfBody": hashlib.md5(body.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest(),
    }
    record = record_from_message(message, queue_arn=queue_arn)
    record["messageAttributes"] = message_attributes or {}
    return record


def sqs_event(bodies: Sequence[str]) -> dict[str, Any]:
    """One delivery of each body, each under a new ``messageId`` as a producer's resend gets."""
    return {"Records": [sqs_record(str(uuid.uuid4()), body) for body in bodies]}


@dataclass
class LambdaContext:
    """The context object of the Python runtime; the remaining time runs down from ``timeout_s``."""

    timeout_s: float = 30.0
    function_name: str = "ConsumerFunction"
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:123456789012:function:ConsumerFunction"
    memory_limit_in_mb: int = 512
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
