"""The message contract: parse an SQS message into a validated envelope and its key.

Body: ``{"eventType": ..., "metadata": {"idempotencyKey": ...}, "payload": {...}}``.
The idempotency key is the first of: ``metadata.idempotencyKey``, the message
attribute ``IdempotencyKey`` (String), the SQS ``messageId``. A producer resending
the same logical message gets a new ``messageId``, so only the first two catch
producer resends; ``messageId`` still catches SQS's own redeliveries.

Limits (beyond them the message is poison, with the limit in its reason):

- body: ``MAX_BODY_BYTES``, SQS's own maximum; a larger body did not come through
  SQS, and parsing it would only spend the invocation's memory.
- nesting: ``MAX_NESTING_DEPTH`` levels of arrays and objects. The envelope needs 3;
  the limit leaves room for richer payloads while staying far below the depth at
  which Python's parser raises ``RecursionError``.
- key: ``MAX_KEY_LENGTH`` characters and ``MAX_KEY_BYTES`` UTF-8 bytes, so the
  namespaced record id stays under DynamoDB's 2,048-byte partition key limit; no
  blank keys (a key of only whitespace is a producer's bug, not a key: refused
  rather than stripped, since stripping could merge two producers' keys); only
  characters SQS can carry, since the key travels to the DLQ as an attribute.

Message fields that Lambda fills (``attributes``, ``messageAttributes``) are read
defensively: a malformed one is treated as absent, never as the message's fault.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from consumer.errors import MAX_REASON_CHARS, ErrorType, PoisonMessage

MAX_BODY_BYTES = 1024 * 1024
MAX_NESTING_DEPTH = 32
MAX_KEY_LENGTH = 512
MAX_KEY_BYTES = 1024

# A character SQS refuses in a message body or attribute value.
_NOT_SQS_TEXT = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

SqsMessage = Mapping[str, Any]

_SEPARATOR = "; "


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
    """One SQS message, parsed and keyed, ready to be routed."""

    message_id: str
    event_type: str
    idempotency_key: str
    key_source: KeySource
    payload: dict[str, Any]
    receive_count: int
    message_group_id: str | None

    @cached_property
    def payload_hash(self) -> str:
        """The canonical payload's hash, once a handler's schema has accepted the payload: a refused one never
        needs it, and for tens of thousands of fields it costs as much as reading the body."""
        return payload_hash(self.payload)

    @property
    def record_id(self) -> str:
        """The idempotency record's partition key: keys are namespaced by event type."""
        return f"{self.event_type}#{self.idempotency_key}"


def sqs_text(text: str) -> tuple[str, int]:
    """``text`` with each character SQS refuses replaced by U+FFFD, and how many were."""
    return _NOT_SQS_TEXT.subn("\ufffd", text)


def bounded(text: str) -> str:
    """A reason as a dead letter's attribute and a log line carry it: at most ``MAX_REASON_CHARS``, SQS-safe.

    Exception text can quote what came from outside (a field name, a server's words)."""
    return sqs_text(text[:MAX_REASON_CHARS])[0]


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def system_attributes(message: SqsMessage) -> Mapping[str, Any]:
    """The message's ``attributes`` (receive count, group id...), or nothing if malformed."""
    return _mapping(message.get("attributes"))


def message_group_id(message: SqsMessage) -> str | None:
    """The FIFO message group of an SQS message; None on a standard queue.

    A standard queue's message may carry ``MessageGroupId`` too: a fair queue's tenant, which
    orders nothing. Only a message from a FIFO queue (its ARN ends in ``.fifo``) has a group.
    """
    source = message.get("eventSourceARN")
    if not (isinstance(source, str) and source.endswith(".fifo")):
        return None
    group = system_attributes(message).get("MessageGroupId")
    return group if isinstance(group, str) and group else None


def receive_count(message: SqsMessage) -> int:
    """``ApproximateReceiveCount``, or 1 when it is missing or not a positive number."""
    try:
        return max(1, int(system_attributes(message)["ApproximateReceiveCount"]))
    except (KeyError, TypeError, ValueError):
        return 1


def message_attributes(message: SqsMessage) -> dict[str, Mapping[str, Any]]:
    """The message attributes that have the shape Lambda gives them."""
    return {
        name: value
        for name, value in _mapping(message.get("messageAttributes")).items()
        if isinstance(name, str) and isinstance(value, Mapping)
    }


def payload_hash(payload: dict[str, Any]) -> str:
    """Hash of the canonical JSON so that key order and whitespace do not matter."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # surrogatepass: JSON may spell a lone surrogate ("\ud800"); it must hash, not raise.
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def schema_violation(error: ValidationError, prefix: str = "") -> PoisonMessage:
    """Every validation error, with where it is, as poison: as many as a dead letter's reason holds, then a count.

    One pass that stops at the reason's limit: a payload can carry tens of thousands of errors, and the
    reason's work must not grow with them (joining the whole list once per error left out was quadratic)."""
    total, shown, length = error.error_count(), [], -len(_SEPARATOR)
    for item in error.errors(include_url=False, include_context=False, include_input=False):
        where = ".".join([*([prefix] if prefix else []), *(str(part) for part in item["loc"])]) or "body"
        text = f"{where}: {item['msg']}"
        if length + len(_SEPARATOR) + len(text) > MAX_REASON_CHARS:
            break
        shown.append(text)
        length += len(_SEPARATOR) + len(text)
    # The count of those left out must fit too: give back listed errors until it does.
    while len(shown) < total:
        rest = f"{total - len(shown)} more past the reason's {MAX_REASON_CHARS} characters"
        if length + len(_SEPARATOR) + len(rest) <= MAX_REASON_CHARS:
            shown.append(rest)
            break
        length -= len(_SEPARATOR) + len(shown.pop())
    return PoisonMessage(ErrorType.SCHEMA_VIOLATION, _SEPARATOR.join(shown))


def _nesting_depth(value: object) -> int:
    """Depth of arrays and objects, iteratively: a recursive walk would be the hazard it measures."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING_DEPTH:
            return deepest
        # Only containers go on the stack: a wide object's scalars are most of its values.
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _parse_body(message: SqsMessage) -> dict[str, Any]:
    body = message.get("body")
    if not isinstance(body, str):
        raise PoisonMessage(ErrorType.INVALID_JSON, f"body is not text, got {type(body).__name__}")
    # A character is at most 4 bytes in UTF-8: only a long body is worth encoding to measure.
    if len(body) * 4 > MAX_BODY_BYTES and (size := len(body.encode("utf-8", "surrogatepass"))) > MAX_BODY_BYTES:
        raise PoisonMessage(ErrorType.BODY_TOO_LARGE, f"body is {size} bytes, the limit is {MAX_BODY_BYTES}")
    try:
        parsed = json.loads(body)
    # ValueError, not only JSONDecodeError: an integer of more than 4,300 digits raises it too.
    except ValueError as error:
        raise PoisonMessage(ErrorType.INVALID_JSON, f"body is not JSON: {error}") from None
    except RecursionError:
        raise PoisonMessage(
            ErrorType.NESTING_TOO_DEEP, f"body nests deeper than the limit of {MAX_NESTING_DEPTH}"
        ) from None
    # Each array or object opens with a bracket: a body with no more of them than the limit cannot nest past it.
    if body.count("{") + body.count("[") > MAX_NESTING_DEPTH and _nesting_depth(parsed) > MAX_NESTING_DEPTH:
        raise PoisonMessage(ErrorType.NESTING_TOO_DEEP, f"body nests deeper than the limit of {MAX_NESTING_DEPTH}")
    if not isinstance(parsed, dict):
        raise PoisonMessage(ErrorType.SCHEMA_VIOLATION, f"body must be a JSON object, got {type(parsed).__name__}")
    return parsed


def _attribute_key(message: SqsMessage) -> str | None:
    attribute = message_attributes(message).get("IdempotencyKey")
    if attribute is None:
        return None
    data_type = attribute.get("dataType", "String")
    if not isinstance(data_type, str) or data_type.split(".", 1)[0] != "String":
        return None
    value = attribute.get("stringValue")
    return value if isinstance(value, str) else None


def _check_key(key: str, source: KeySource) -> None:
    def refuse(why: str) -> PoisonMessage:
        return PoisonMessage(ErrorType.SCHEMA_VIOLATION, f"idempotency key ({source}) {why}")

    if not key.strip():
        raise refuse("is empty or blank")
    if len(key) > MAX_KEY_LENGTH:
        raise refuse(f"is longer than {MAX_KEY_LENGTH} characters")
    if _NOT_SQS_TEXT.search(key):
        raise refuse("holds characters SQS cannot carry (control characters or lone surrogates)")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise refuse(f"is longer than {MAX_KEY_BYTES} bytes in UTF-8")


def parse_message(message: SqsMessage) -> Message:
    """Parse one SQS message; raise ``PoisonMessage`` when the body breaks the contract."""
    message_id: str = message["messageId"]
    try:
        envelope = Envelope.model_validate(_parse_body(message))
    except ValidationError as error:
        raise schema_violation(error) from None

    if envelope.metadata.idempotencyKey is not None:
        key, source = envelope.metadata.idempotencyKey, KeySource.BODY
    elif (attribute_key := _attribute_key(message)) is not None:
        key, source = attribute_key, KeySource.ATTRIBUTE
    else:
        key, source = message_id, KeySource.MESSAGE_ID
    _check_key(key, source)

    return Message(
        message_id=message_id,
        event_type=envelope.eventType,
        idempotency_key=key,
        key_source=source,
        payload=envelope.payload,
        receive_count=receive_count(message),
        message_group_id=message_group_id(message),
    )
