"""The negative control: a consumer that does idempotency the common, wrong way.

Read the record; if absent, run the handler, apply its writes one by one, then write the
record. No conditional claim, no fencing, no transaction: two deliveries of one key that
overlap both read "absent", a write retried after a lost answer is applied again, a crash
between the effect and the record leaves the effect without its record. It runs whatever
handlers are registered, as the real consumer does. The fault-injection harness, pointed
at it, must report violations, or it proves nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import boto3
from botocore.config import Config
from pydantic import ValidationError

from consumer.batch import BatchResult
from consumer.config import Settings
from consumer.dead_letter import DeadLetterQueue
from consumer.envelope import Message, parse_message
from consumer.errors import ErrorType, PoisonMessage
from consumer.handler import MessageContext, MessageHandler
from consumer.outcome import MessageResult, Outcome
from consumer.prepared import Prepared


class NaiveConsumer:
    def __init__(
        self,
        settings: Settings,
        session: boto3.session.Session,
        *,
        clock: Callable[[], float],
        handlers: Mapping[str, MessageHandler[Any]],
    ) -> None:
        config = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=2, read_timeout=5)
        self._dynamodb = session.client("dynamodb", config=config)
        sqs = session.client("sqs", config=config)
        self._dead_letters = DeadLetterQueue(lambda: sqs, settings.dead_letter_queue_url)
        self._handlers = dict(handlers)
        self._settings = settings
        self._clock = clock

    def process(self, records: list[dict[str, Any]], remaining_ms: Callable[[], int]) -> BatchResult:
        return BatchResult(tuple(self._one(record, remaining_ms) for record in records))

    def _one(self, record: dict[str, Any], remaining_ms: Callable[[], int]) -> MessageResult:
        message_id = record["messageId"]
        try:
            message = parse_message(record)
            handler = self._handlers.get(message.event_type)
            if handler is None:
                raise PoisonMessage(ErrorType.UNKNOWN_EVENT_TYPE, message.event_type)
            try:
                payload = handler.payload_model.model_validate(message.payload)
            except ValidationError as error:
                raise PoisonMessage(ErrorType.SCHEMA_VIOLATION, str(error)) from None
        except PoisonMessage as poison:
            self._dead_letters.send(Prepared.unread(record, poison), poison.error_type, poison.message)
            return MessageResult(message_id, Outcome.POISON, poison.error_type)
        try:
            if self._seen(message):
                return MessageResult(message_id, Outcome.DUPLICATE)
            context = MessageContext(message_id, message.idempotency_key, message.receive_count, remaining_ms)
            for write in handler.handle(payload, context).writes:
                # Each write on its own, as the handler would make it without the store's transaction.
                ((kind, request),) = write.to_transact_item().items()
                if kind in _CALLS:
                    getattr(self._dynamodb, _CALLS[kind])(**request)
            self._remember(message)
        except Exception as error:
            return MessageResult(message_id, Outcome.RETRIED, str(error))
        return MessageResult(message_id, Outcome.APPLIED)

    def _seen(self, message: Message) -> bool:
        item = self._dynamodb.get_item(
            TableName=self._settings.idempotency_table_name, Key={"id": {"S": message.record_id}}, ConsistentRead=True
        ).get("Item")
        return item is not None

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


# A condition check has no call of its own outside a transaction: the naive consumer skips it.
_CALLS = {"Put": "put_item", "Update": "update_item", "Delete": "delete_item"}
