"""The negative control: a consumer that does idempotency the common, wrong way.

Read the record; if absent, apply the effect, then write the record. No condition,
no fencing, no transaction: two deliveries of one key that overlap both read
"absent", a write retried after a lost answer is applied again, a crash between the
effect and the record leaves the effect without its record. The fault-injection
harness, pointed at it, must report violations, or it proves nothing.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config
from pydantic import BaseModel, ValidationError

from consumer.batch import BatchResult
from consumer.config import Settings
from consumer.dead_letter import DeadLetterQueue
from consumer.envelope import Message, parse_message
from consumer.errors import ErrorType, PoisonMessage
from consumer.handlers.payment_received import PaymentReceived
from consumer.handlers.receipt_requested import ReceiptRequested, ReceiptSettings
from consumer.outcome import Outcome, RecordResult

_MODELS: dict[str, type[BaseModel]] = {"PaymentReceived": PaymentReceived, "ReceiptRequested": ReceiptRequested}


class NaiveConsumer:
    def __init__(self, settings: Settings, session: boto3.session.Session, *, clock: Callable[[], float]) -> None:
        config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=2, read_timeout=5)
        self._dynamodb = session.client("dynamodb", config=config)
        sqs = session.client("sqs", config=config)
        self._dead_letters = DeadLetterQueue(lambda: sqs, settings.dead_letter_queue_url)
        self._settings = settings
        self._clock = clock

    def process(self, records: list[dict[str, Any]], remaining_ms: Callable[[], int]) -> BatchResult:
        return BatchResult(tuple(self._one(record) for record in records))

    def _one(self, record: dict[str, Any]) -> RecordResult:
        message_id = record["messageId"]
        try:
            message = parse_message(record)
            model = _MODELS.get(message.event_type)
            if model is None:
                raise PoisonMessage(ErrorType.UNKNOWN_EVENT_TYPE, message.event_type)
            try:
                payload = model.model_validate(message.payload)
            except ValidationError as error:
                raise PoisonMessage(ErrorType.SCHEMA_VIOLATION, str(error)) from None
        except PoisonMessage as poison:
            self._dead_letters.send(record, poison.error_type, poison.message)
            return RecordResult(message_id, Outcome.POISON, poison.error_type)
        try:
            if self._seen(message):
                return RecordResult(message_id, Outcome.DUPLICATE)
            if isinstance(payload, PaymentReceived):
                self._credit(payload, message)
            elif isinstance(payload, ReceiptRequested):
                self._send_receipt(payload, message)
            self._remember(message)
        except Exception as error:
            return RecordResult(message_id, Outcome.RETRIED, str(error))
        return RecordResult(message_id, Outcome.APPLIED)

    def _seen(self, message: Message) -> bool:
        item = self._dynamodb.get_item(
            TableName=self._settings.idempotency_table_name, Key={"id": {"S": message.record_id}}, ConsistentRead=True
        ).get("Item")
        return item is not None

    def _credit(self, payment: PaymentReceived, message: Message) -> None:
        table = self._settings.table_names["LedgerTable"]
        self._dynamodb.update_item(
            TableName=table,
            Key={"accountId": {"S": payment.accountId}, "entryId": {"S": "BALANCE"}},
            UpdateExpression="ADD balanceCents :amount",
            ExpressionAttributeValues={":amount": {"N": str(payment.amountCents)}},
        )
        self._dynamodb.put_item(
            TableName=table,
            Item={
                "accountId": {"S": payment.accountId},
                "entryId": {"S": f"PAYMENT#{payment.paymentId}"},
                "amountCents": {"N": str(payment.amountCents)},
                "idempotencyKey": {"S": message.idempotency_key},
            },
        )

    def _send_receipt(self, receipt: ReceiptRequested, message: Message) -> None:
        request = urllib.request.Request(
            self._settings.of(ReceiptSettings).receipt_webhook_url,
            data=json.dumps(receipt.model_dump(mode="json")).encode(),
            headers={"Content-Type": "application/json", "Idempotency-Key": message.idempotency_key},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=self._settings.of(ReceiptSettings).webhook_timeout_ms / 1000):
            pass
        self._dynamodb.put_item(
            TableName=self._settings.table_names["LedgerTable"],
            Item={"accountId": {"S": receipt.accountId}, "entryId": {"S": f"RECEIPT#{receipt.receiptId}"}},
        )

    def _remember(self, message: Message) -> None:
        self._dynamodb.put_item(
            TableName=self._settings.idempotency_table_name,
            Item={
                "id": {"S": message.record_id},
                "status": {"S": "COMPLETED"},
                "expiresAt": {"N": str(int(self._clock()) + self._settings.idempotency_ttl_seconds)},
                "payloadHash": {"S": message.payload_hash},
            },
        )
