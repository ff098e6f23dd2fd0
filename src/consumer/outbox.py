"""Messages a handler emits, written to the outbox table in its effect's transaction, and read back by the relay.

A handler returns them in ``Effect.messages``; the core turns each into a ``Put`` on the outbox table, in the same
``TransactWriteItems`` as the idempotency record and the business writes: an outbox item exists if and only if the
effect committed. The table's stream feeds the relay (``consumer.relay``), which sends each item to its destination.
Delivery is at least once; every message carries a key derived from its source's record and its position
(``derived_key``), so a consumer that dedupes by it, as this one does, applies it exactly once.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from consumer.errors import ErrorType, PoisonMessage
from consumer.idempotency.writes import Put

# The outbox table's logical id in template.yaml: its name reaches the function as OUTBOX_TABLE_NAME.
OUTBOX_TABLE = "OutboxTable"

# A body's bytes, at most: SQS, SNS and EventBridge each take 256 KiB per message with its attributes, and the relay
# adds the key's attribute (at most about 700 bytes) and, on a bus, the source and detail type.
MAX_BODY_BYTES = 250_000

# Our envelope's key, at most (consumer.envelope's MAX_KEY_LENGTH and MAX_KEY_BYTES): a longer derived key hashes
# its source's key.
_MAX_KEY_LENGTH, _MAX_KEY_BYTES = 512, 1024

# A FIFO message group id or deduplication id: SQS's and SNS's rule.
_FIFO_ID = re.compile(r"[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}")
# An EventBridge source or detail type we accept: printable, as EventBridge's own rules match them.
_BUS_TEXT = re.compile(r"[\x20-\x7e]{1,256}")
_EVENT_TYPE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


class Kind(StrEnum):
    """What sort of destination an outbox item goes to: the relay's call for it."""

    QUEUE = "queue"
    TOPIC = "topic"
    BUS = "bus"


class Attr(StrEnum):
    """The outbox item's attributes: written by the consumer, read by the relay."""

    ID = "id"  # the derived key: one item per source record and position
    DESTINATION = "destination"  # the destination's logical id in template.yaml
    KIND = "kind"
    BODY = "body"  # what is sent: the message body, the topic's message, or the bus event's detail
    GROUP_ID = "groupId"  # FIFO queues and topics
    DEDUPLICATION_ID = "deduplicationId"  # FIFO queues and topics
    SOURCE = "source"  # buses
    DETAIL_TYPE = "detailType"  # buses
    SOURCE_RECORD = "sourceRecord"  # the emitting message's idempotency record, for logs
    CREATED_AT_MS = "createdAtMs"  # when the effect was built: the chain's latency starts there
    EXPIRES_AT = "expiresAt"  # the table's TTL attribute, epoch seconds


@dataclass(frozen=True)
class _Message:
    destination: str
    event_type: str
    payload: Any
    group_id: str | None = None
    deduplication_id: str | None = None
    raw: bool = False


@dataclass(frozen=True)
class QueueMessage(_Message):
    """A message for an SQS queue the handler declares in ``destinations``.

    Attributes
    ----------
    destination:
        The queue's logical id in template.yaml (``"ReceiptQueue"``), one of the handler's ``destinations``.
    event_type:
        The envelope's ``eventType``: the downstream consumer routes by it.
    payload:
        The envelope's ``payload``: anything ``json.dumps`` takes (a model as ``model.model_dump(mode="json")``).
    group_id:
        A FIFO queue's ``MessageGroupId``; on a standard queue, its fair-queue tenant; None for neither.
    deduplication_id:
        A FIFO queue's ``MessageDeduplicationId``; None derives one from the message's key.
    raw:
        True sends ``payload``'s JSON as the body, without the envelope; the key then travels only in the
        ``IdempotencyKey`` message attribute (which this project's consumer reads too).

    Example
    -------
    ``QueueMessage("ReceiptQueue", "ReceiptRequested", {"paymentId": p, "amountCents": 1250})``
    """


@dataclass(frozen=True)
class TopicMessage(_Message):
    """A message for an SNS topic the handler declares in ``destinations``: as ``QueueMessage``, published to the topic
    (``group_id`` and ``deduplication_id`` for a FIFO topic)."""


@dataclass(frozen=True)
class BusEvent:
    """An event for an EventBridge bus the handler declares in ``destinations``: its ``detail`` is the envelope (its
    ``eventType`` the ``detail_type``), so rules can match ``detail.payload`` and the key travels with the event.

    Example
    -------
    ``BusEvent("OrdersBus", "OrderPlaced", {"orderId": o}, source="shop.orders")``
    """

    destination: str
    event_type: str
    payload: Any
    source: str


Outgoing = QueueMessage | TopicMessage | BusEvent

_KINDS: dict[type[Outgoing], Kind] = {QueueMessage: Kind.QUEUE, TopicMessage: Kind.TOPIC, BusEvent: Kind.BUS}


def derived_key(record_id: str, position: int) -> str:
    """The key of the ``position``-th message (from 0) its source emitted: ``<record id>#<position>``, the record id
    being the source's ``<eventType>#<key>``. When that is past 512 characters or 1,024 UTF-8 bytes, the source's key
    is replaced by its SHA-256 (``<eventType>#sha256:<hex>#<position>``), so the key always fits the envelope."""
    key = f"{record_id}#{position}"
    if len(key) <= _MAX_KEY_LENGTH and len(key.encode()) <= _MAX_KEY_BYTES:
        return key
    event_type, _, source_key = record_id.partition("#")
    return f"{event_type}#sha256:{hashlib.sha256(source_key.encode()).hexdigest()}#{position}"


def _bad(message: Outgoing, position: int, why: str) -> PoisonMessage:
    return PoisonMessage(
        ErrorType.INVALID_OUTGOING_MESSAGE,
        f"outgoing message {position} ({message.event_type!r} to {message.destination!r}): {why}",
    )


def _body(message: Outgoing, position: int, key: str) -> str:
    if not _EVENT_TYPE.fullmatch(str(message.event_type)):
        raise _bad(message, position, "its event type must be 1 to 128 letters, digits, '_', '.', ':' or '-'")
    raw = isinstance(message, _Message) and message.raw
    content = (
        message.payload
        if raw
        else {
            "eventType": message.event_type,
            "metadata": {"idempotencyKey": key},
            "payload": message.payload,
        }
    )
    try:
        body = json.dumps(content, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise _bad(message, position, f"its payload is not JSON: {error}") from None
    size = len(body.encode())
    if size > MAX_BODY_BYTES:
        raise PoisonMessage(
            ErrorType.OUTGOING_MESSAGE_TOO_LARGE,
            f"outgoing message {position} ({message.event_type!r} to {message.destination!r}) is {size} bytes; at"
            f" most {MAX_BODY_BYTES} fit a queue's, a topic's or a bus's message with its key",
        )
    return body


def _fields(message: Outgoing, position: int, key: str) -> dict[str, str]:
    if isinstance(message, BusEvent):
        if not _BUS_TEXT.fullmatch(str(message.source)):
            raise _bad(message, position, "its source must be 1 to 256 printable ASCII characters")
        return {Attr.SOURCE: message.source, Attr.DETAIL_TYPE: message.event_type}
    if message.group_id is None:
        if message.deduplication_id is not None:
            raise _bad(message, position, "a deduplication id goes with a group id (FIFO only)")
        return {}
    deduplication_id = message.deduplication_id or hashlib.sha256(key.encode()).hexdigest()
    for name, value in (("group id", message.group_id), ("deduplication id", deduplication_id)):
        if not _FIFO_ID.fullmatch(str(value)):
            raise _bad(message, position, f"its {name} must be 1 to 128 ASCII letters, digits or punctuation")
    return {Attr.GROUP_ID: message.group_id, Attr.DEDUPLICATION_ID: deduplication_id}


def outbox_writes(
    messages: Sequence[Outgoing],
    *,
    table: str,
    destinations: Sequence[str],
    record_id: str,
    now_ms: int,
    ttl_seconds: int,
) -> tuple[Put, ...]:
    """Each of ``messages`` as a ``Put`` of its outbox item on ``table``, in order: raise ``PoisonMessage`` for one the
    relay could never send (an undeclared destination, too large, not JSON), the same on every delivery."""
    puts = []
    for position, message in enumerate(messages):
        kind = _KINDS.get(type(message))
        if kind is None:
            raise PoisonMessage(
                ErrorType.INVALID_OUTGOING_MESSAGE,
                f"outgoing message {position} is a {type(message).__name__}; a handler emits a QueueMessage, a"
                " TopicMessage or a BusEvent",
            )
        if message.destination not in destinations:
            raise PoisonMessage(
                ErrorType.UNDECLARED_DESTINATION,
                f"outgoing message {position} ({message.event_type!r}) goes to {message.destination!r}, which is not"
                f" one of the handler's declared destinations ({', '.join(destinations) or 'none'})",
            )
        key = derived_key(record_id, position)
        item: dict[str, Any] = {
            Attr.ID: key,
            Attr.DESTINATION: message.destination,
            Attr.KIND: kind.value,
            Attr.BODY: _body(message, position, key),
            **_fields(message, position, key),
            Attr.SOURCE_RECORD: record_id,
            Attr.CREATED_AT_MS: now_ms,
            Attr.EXPIRES_AT: now_ms // 1000 + ttl_seconds,
        }
        puts.append(Put(table=table, item={str(name): value for name, value in item.items()}))
    return tuple(puts)


@dataclass(frozen=True)
class OutboxItem:
    """An outbox item as the relay reads it from the stream's new image."""

    key: str
    destination: str
    kind: Kind
    body: str
    group_id: str | None = None
    deduplication_id: str | None = None
    source: str | None = None
    detail_type: str | None = None
    created_at_ms: int | None = None

    @classmethod
    def from_image(cls, image: Mapping[str, Mapping[str, Any]]) -> OutboxItem:
        """Read a stream record's ``NewImage`` (DynamoDB's typed values); raise ``ValueError`` naming what is wrong."""

        def text(name: Attr, *, required: bool = True) -> str | None:
            value = image.get(name)
            if value is None and not required:
                return None
            if not isinstance(value, Mapping) or not isinstance(value.get("S"), str):
                raise ValueError(f"outbox item has no text attribute {name.value!r}")
            return str(value["S"])

        created = image.get(Attr.CREATED_AT_MS)
        try:
            created_at_ms = int(created["N"]) if isinstance(created, Mapping) and "N" in created else None
        except (TypeError, ValueError):
            raise ValueError(f"outbox item's {Attr.CREATED_AT_MS.value!r} is no number: {created!r:.80}") from None
        item = cls(
            key=text(Attr.ID) or "",
            destination=text(Attr.DESTINATION) or "",
            kind=Kind(text(Attr.KIND) or ""),
            body=text(Attr.BODY) or "",
            group_id=text(Attr.GROUP_ID, required=False),
            deduplication_id=text(Attr.DEDUPLICATION_ID, required=False),
            source=text(Attr.SOURCE, required=False),
            detail_type=text(Attr.DETAIL_TYPE, required=False),
            created_at_ms=created_at_ms,
        )
        if item.kind is Kind.BUS and not (item.source and item.detail_type):
            raise ValueError("a bus's outbox item has no source or detail type")
        return item
