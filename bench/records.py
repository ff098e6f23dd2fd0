"""SQS records in the shape Lambda's event source mapping delivers them.

Every message gets its own idempotency key, payment and account, so no two records of
a run contend for an item unless the benchmark means them to (a redelivery reuses the
body under a new ``messageId``, as a producer's resend does).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
import uuid
from typing import Any

REGION = "us-east-1"
QUEUE_ARN = f"arn:aws:sqs:{REGION}:000000000000:ConsumerQueue"


class MessageFactory:
    def __init__(self, run_id: str | None = None) -> None:
        # Keys unique across runs too: DynamoDB Local's tables outlive one system's turn.
        self._run_id = run_id or uuid.uuid4().hex[:8]
        self._sequence = itertools.count(1)

    def payment(self) -> str:
        n = self._next()
        return _body(
            "PaymentReceived",
            f"pay-{n}",
            {"paymentId": f"p-{n}", "accountId": f"acc-{n}", "amountCents": 1250, "currency": "EUR"},
        )

    def receipt(self) -> str:
        n = self._next()
        payload = {
            "receiptId": f"r-{n}",
            "paymentId": f"p-{n}",
            "accountId": f"acc-{n}",
            "amountCents": 1250,
            "currency": "EUR",
            "email": "payer@example.com",
        }
        return _body("ReceiptRequested", f"receipt-{n}", payload)

    def payments(self, count: int) -> list[str]:
        return [self.payment() for _ in range(count)]

    def receipts(self, count: int) -> list[str]:
        return [self.receipt() for _ in range(count)]

    def _next(self) -> str:
        return f"{self._run_id}-{next(self._sequence)}"


def _body(event_type: str, key: str, payload: dict[str, Any]) -> str:
    return json.dumps({"eventType": event_type, "metadata": {"idempotencyKey": key}, "payload": payload})


def sqs_record(body: str) -> dict[str, Any]:
    """One delivery of ``body``: a new ``messageId`` each time, as for a resend."""
    now_ms = str(int(time.time() * 1000))
    message_id = str(uuid.uuid4())
    return {
        "messageId": message_id,
        "receiptHandle": f"handle-{message_id}",
        "body": body,
        "attributes": {
            "ApproximateReceiveCount": "1",
            "SentTimestamp": now_ms,
            "SenderId": "AIDAEXAMPLE",
            "ApproximateFirstReceiveTimestamp": now_ms,
        },
        "messageAttributes": {},
        "md5OfBody": hashlib.md5(body.encode("utf-8")).hexdigest(),  # SQS's own checksum, not a security hash
        "eventSource": "aws:sqs",
        "eventSourceARN": QUEUE_ARN,
        "awsRegion": REGION,
    }


def sqs_event(bodies: list[str]) -> dict[str, Any]:
    return {"Records": [sqs_record(body) for body in bodies]}
