"""The message contract: parse an SQS record into a validated envelope and its key.

Body: ``{"eventType": ..., "metadata": {"idempotencyKey": ...}, "payload": {...}}``.
The idempotency key is the first of: ``metadata.idempotencyKey``, the message
attribute ``IdempotencyKey`` (String), the SQS ``messageId``. A producer resending
the same logical message gets a new ``messageId``, so only the first two catch
producer resends; ``messageId`` still catches SQS's own redeliveries.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from consumer.errors import PoisonMessage

MAX_KEY_LENGTH = 512


class KeySource(StrEnum):
    BODY = "metadata.idempotencyKey"
    ATTRIBUTE = "messageAttributes.IdempotencyKey"
    MESSAGE_ID = "messageId"


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")

    idempotencyKey: str | None = Field(default=None, min_length=1, max_length=MAX_KEY_LENGTH)


class Envelope(BaseModel):
    model_config = ConfigDict(extra="ignore")

    eventType: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:-]+$")
    metadata: Metadata = Field(default_factory=Metadata)
    payload: dict[str, Any]


@dataclass(frozen=True)
class Message:
    """One SQS record, parsed and keyed, ready to be routed."""

    message_id: str
    event_type: str
    idempotency_key: str
    key_source: KeySource
    payload: dict[str, Any]
    payload_hash: str
    receive_count: int
    message_group_id: str | None

    @property
    def record_id(self) -> str:
        """The idempotency record's partition key: keys are namespaced by event type."""
        return f"{self.event_type}#{self.idempotency_key}"


def message_group_id(record: dict[str, Any]) -> str | None:
    """The FIFO message group of an SQS record; None on a standard queue."""
    return (record.get("attributes") or {}).get("MessageGroupId")


def payload_hash(payload: dict[str, Any]) -> str:
    """Hash of the canonical JSON so that key order and whitespace do not matter."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _attribute_key(record: dict[str, Any]) -> str | None:
    attribute = (record.get("messageAttributes") or {}).get("IdempotencyKey") or {}
    if attribute.get("dataType", "String").split(".", 1)[0] != "String":
        return None
    value = attribute.get("stringValue")
    if isinstance(value, str) and value.strip():
        return value
    return None


def schema_violation(error: ValidationError, prefix: str = "") -> PoisonMessage:
    """The first validation error, with where it is, as poison (the rest are counted)."""
    first = error.errors()[0]
    where = ".".join([*([prefix] if prefix else []), *(str(part) for part in first["loc"])]) or "body"
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return PoisonMessage("SchemaViolation", f"{where}: {first['msg']}{more}")


def parse_message(record: dict[str, Any]) -> Message:
    """Parse one SQS record; raise ``PoisonMessage`` when the body breaks the contract."""
    message_id = record["messageId"]
    attributes = record.get("attributes") or {}
    try:
        body = json.loads(record.get("body") or "")
    except (json.JSONDecodeError, TypeError) as error:
        raise PoisonMessage("InvalidJson", f"body is not JSON: {error}") from None
    if not isinstance(body, dict):
        raise PoisonMessage("SchemaViolation", f"body must be a JSON object, got {type(body).__name__}")
    try:
        envelope = Envelope.model_validate(body)
    except ValidationError as error:
        raise schema_violation(error) from None

    if envelope.metadata.idempotencyKey is not None:
        key, source = envelope.metadata.idempotencyKey, KeySource.BODY
    elif (attribute_key := _attribute_key(record)) is not None:
        key, source = attribute_key, KeySource.ATTRIBUTE
    else:
        key, source = message_id, KeySource.MESSAGE_ID
    if len(key) > MAX_KEY_LENGTH:
        raise PoisonMessage("SchemaViolation", f"idempotency key longer than {MAX_KEY_LENGTH} characters")

    return Message(
        message_id=message_id,
        event_type=envelope.eventType,
        idempotency_key=key,
        key_source=source,
        payload=envelope.payload,
        payload_hash=payload_hash(envelope.payload),
        receive_count=int(attributes.get("ApproximateReceiveCount", "1")),
        message_group_id=message_group_id(record),
    )
