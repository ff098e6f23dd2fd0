"""A message as the batch holds it after reading: what it is, and whether it can run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from consumer.envelope import Message, SqsMessage, message_group_id, parse_message, schema_violation
from consumer.errors import ConfigurationError, ErrorType, PoisonMessage
from consumer.handler import MessageHandler
from consumer.idempotency.writes import Write
from consumer.outcome import Log


@dataclass(frozen=True)
class Parsed:
    """It passed the contract and its handler's schema."""

    message: Message
    handler: MessageHandler[Any]
    payload: BaseModel
    # What its writes contend on besides its own key (a hot business item), if anything.
    contention_key: str | None = None

    def check_tables(self, writes: Sequence[Write]) -> None:
        declared = self.handler.table_names.values()
        for write in writes:
            if write.table not in declared:
                # The role's grants and the cold-start check follow the declaration: keep them honest.
                raise ConfigurationError(
                    f"handler of {self.message.event_type} writes table {write.table!r}, which is not one of its"
                    f" declared tables ({', '.join(self.handler.tables) or 'none'})"
                )


@dataclass(frozen=True)
class Rejected:
    """It can never succeed; it goes to the dead-letter queue."""

    poison: PoisonMessage


@dataclass(frozen=True)
class Prepared:
    message_id: str
    # The FIFO message group; None on a standard queue.
    group: str | None
    # None when the message was rejected before its key could be read.
    idempotency_key: str | None
    event_type: str | None
    # As SQS delivered it: a dead letter sends its body and attributes back as they came.
    original: SqsMessage
    state: Parsed | Rejected

    @classmethod
    def unread(cls, sqs_message: SqsMessage, poison: PoisonMessage) -> Prepared:
        """A message rejected before its key could be read."""
        return cls(sqs_message["messageId"], message_group_id(sqs_message), None, None, sqs_message, Rejected(poison))

    def log_keys(self) -> dict[str, str]:
        keys = {"message_id": self.message_id, "idempotency_key": self.idempotency_key or ""}
        return {**keys, "event_type": self.event_type} if self.event_type else keys


def prepare(sqs_message: SqsMessage, handlers: Mapping[str, MessageHandler[Any]], logger: Log) -> Prepared:
    """Read one message and route it, with no I/O, so the batch can group messages before any round trip."""
    try:
        message = parse_message(sqs_message)
        state = _route(message, handlers)
    except PoisonMessage as poison:
        return Prepared.unread(sqs_message, poison)
    except MemoryError:
        # The invocation ran out, not the message (bodies are capped): let Lambda retry the batch.
        raise
    except Exception as error:
        # Reading a message is deterministic: what failed once fails on every delivery.
        logger.exception("message could not be read", extra={"message_id": sqs_message["messageId"]})
        return Prepared.unread(
            sqs_message, PoisonMessage(ErrorType.UNPROCESSABLE_RECORD, f"{type(error).__name__}: {error}")
        )
    key, event_type = message.idempotency_key, message.event_type
    return Prepared(message.message_id, message.message_group_id, key, event_type, sqs_message, state)


def _route(message: Message, handlers: Mapping[str, MessageHandler[Any]]) -> Parsed | Rejected:
    handler = handlers.get(message.event_type)
    if handler is None:
        known = ", ".join(sorted(handlers))
        reason = f"no handler for eventType {message.event_type!r} (known: {known})"
        return Rejected(PoisonMessage(ErrorType.UNKNOWN_EVENT_TYPE, reason))
    try:
        payload = handler.payload_model.model_validate(message.payload)
    except ValidationError as error:
        return Rejected(schema_violation(error, prefix="payload"))
    # Hashed here, once accepted, inside the reading's guard: a defect in hashing is the message's, as in parsing.
    _ = message.payload_hash
    return Parsed(message, handler, payload, handler.contention_key(payload))
