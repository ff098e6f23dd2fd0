"""The outbox, on the consumer's side: a handler's messages are written in its effect's own transaction, so they exist
if and only if the effect committed, each under the key derived from its source's record and position; a message the
relay could never send dead-letters its source with its type, and the rest of the batch is applied."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from boto3.dynamodb.types import TypeDeserializer

from consumer.envelope import payload_hash
from consumer.errors import ErrorType, PoisonMessage
from consumer.handler import MessageContext, MessageHandler
from consumer.idempotency.answers import Claimed
from consumer.idempotency.writes import Put
from consumer.outbox import (
    MAX_BODY_BYTES,
    OUTBOX_TABLE,
    Attr,
    BusEvent,
    QueueMessage,
    TopicMessage,
    derived_key,
    outbox_writes,
)
from consumer.outcome import Outcome
from testkit.lambda_sqs import sqs_record
from testkit.tables import create_template_tables
from tests.core.handlers import (
    LOCKED_NOTICE_EVENT,
    NOTICE_EVENT,
    NOTICE_QUEUE,
    TALLY_EVENT,
    LockedNoticeHandler,
    NoticeHandler,
    notice_body,
    notice_entry,
    tally_entries,
    tally_payload,
)
from tests.core.unit.conftest import TALLIES, Consumer, make_consumer
from tests.kit import Clock, table_name_for_tests
from tests.utils import settings_for_tests

OUTBOX = table_name_for_tests(OUTBOX_TABLE)
TABLES = {OUTBOX_TABLE: OUTBOX}


@pytest.fixture
def outbox(dynamodb: Any) -> str:
    create_template_tables(dynamodb, TABLES)
    return OUTBOX


def emitting(dynamodb: Any, sqs: Any, clock: Clock, during: Any = None, **options: Any) -> Consumer:
    """The consumer with the notice handlers, both modes, and the outbox table."""
    settings = settings_for_tests(tables=TABLES)
    handlers: dict[str, MessageHandler[Any]] = {
        NOTICE_EVENT: NoticeHandler(settings, during),
        LOCKED_NOTICE_EVENT: LockedNoticeHandler(settings, during),
    }
    return make_consumer(dynamodb, sqs, clock, extra_handlers=handlers, tables=TABLES, **options)


def items(dynamodb: Any) -> dict[str, dict[str, Any]]:
    """The outbox's items by id, as plain values."""
    read = TypeDeserializer().deserialize
    scanned = dynamodb.scan(TableName=OUTBOX, ConsistentRead=True)["Items"]
    return {item["id"]["S"]: {name: read(value) for name, value in item.items()} for item in scanned}


def record(notice_id: str, *, locked: bool = False) -> str:
    return f"{LOCKED_NOTICE_EVENT if locked else NOTICE_EVENT}#notice-{notice_id}"


@pytest.mark.parametrize("locked", [False, True], ids=["optimistic", "lock"])
def test_an_applied_message_emits_each_of_its_messages_once_through_the_outbox(
    dynamodb: Any, sqs: Any, clock: Clock, outbox: str, locked: bool
) -> None:
    consumer = emitting(dynamodb, sqs, clock)

    assert consumer.outcomes([sqs_record("m", notice_body("n-1", 2, locked=locked))]) == [Outcome.APPLIED]

    source = record("n-1", locked=locked)
    keys = [f"{source}#0", f"{source}#1"]
    assert sorted(items(dynamodb)) == keys
    for position, key in enumerate(keys):
        item = items(dynamodb)[key]
        assert json.loads(item[Attr.BODY]) == {
            "eventType": TALLY_EVENT,
            "metadata": {"idempotencyKey": key},
            "payload": tally_payload(notice_entry("n-1", position), "t-1", amount=1),
        }
        assert (item[Attr.DESTINATION], item[Attr.KIND], item[Attr.SOURCE_RECORD]) == (NOTICE_QUEUE, "queue", source)
        assert item[Attr.CREATED_AT_MS] == int(clock() * 1000)
        assert item[Attr.EXPIRES_AT] == int(clock()) + consumer.settings.idempotency_ttl_seconds
    assert tally_entries(dynamodb, TALLIES, "t-1") == ["NOTICE#n-1"]


@pytest.mark.parametrize("locked", [False, True], ids=["optimistic", "lock"])
def test_a_duplicate_emits_nothing(dynamodb: Any, sqs: Any, clock: Clock, outbox: str, locked: bool) -> None:
    consumer = emitting(dynamodb, sqs, clock)
    body = notice_body("n-1", 1, locked=locked)
    # A copy in the same batch, then a redelivery later.
    assert consumer.outcomes([sqs_record("a", body), sqs_record("b", body)]) == [Outcome.APPLIED, Outcome.DUPLICATE]
    first = items(dynamodb)
    clock.advance(60)

    assert consumer.outcomes([sqs_record("c", body)]) == [Outcome.DUPLICATE]

    assert items(dynamodb) == first
    assert len(first) == 1


@pytest.mark.parametrize("locked", [False, True], ids=["optimistic", "lock"])
def test_a_refused_message_emits_nothing(dynamodb: Any, sqs: Any, clock: Clock, outbox: str, locked: bool) -> None:
    consumer = emitting(dynamodb, sqs, clock)
    consumer.process([sqs_record("a", notice_body("n-1", 1, locked=locked))])

    # The same notice under another key: its entry's condition refuses it, and with it its messages.
    refused = notice_body("n-1", 3, key="another-key", locked=locked)
    assert consumer.outcomes([sqs_record("b", refused)]) == [Outcome.POISON]

    (letter,) = consumer.dead_letters()
    assert letter.error_type == ErrorType.BUSINESS_CONDITION_FAILED
    assert sorted(items(dynamodb)) == [f"{record('n-1', locked=locked)}#0"]


@pytest.mark.parametrize("locked", [False, True], ids=["optimistic", "lock"])
@pytest.mark.parametrize(
    ("fields", "error_type", "said"),
    [
        ({"destination": "ElsewhereQueue"}, ErrorType.UNDECLARED_DESTINATION, "'ElsewhereQueue', which is not one of"),
        ({"padding": MAX_BODY_BYTES}, ErrorType.OUTGOING_MESSAGE_TOO_LARGE, f"at most {MAX_BODY_BYTES} fit"),
        # With its entry, 100 business items: past what one transaction holds with the record.
        ({"count": 99}, ErrorType.INVALID_HANDLER_TRANSACTION, "got 100"),
    ],
    ids=["undeclared destination", "too large", "too many"],
)
def test_a_message_the_relay_could_never_send_is_dead_lettered_with_its_type_and_its_batch_applied(
    dynamodb: Any,
    sqs: Any,
    clock: Clock,
    outbox: str,
    locked: bool,
    fields: dict[str, Any],
    error_type: ErrorType,
    said: str,
) -> None:
    consumer = emitting(dynamodb, sqs, clock)
    bad = notice_body("bad", **{"count": 1, **fields}, locked=locked)

    outcomes = consumer.outcomes([sqs_record("bad", bad), sqs_record("good", notice_body("good", 1, locked=locked))])

    assert outcomes == [Outcome.POISON, Outcome.APPLIED]
    (letter,) = consumer.dead_letters()
    assert (letter.original_message_id, letter.error_type) == ("bad", error_type)
    assert said in (letter.error_message or "")
    # Nothing of it landed: neither its messages nor its entry.
    assert sorted(items(dynamodb)) == [f"{record('good', locked=locked)}#0"]
    assert tally_entries(dynamodb, TALLIES, "t-1") == ["NOTICE#good"]


def test_a_fenced_commit_emits_nothing(dynamodb: Any, sqs: Any, clock: Clock, outbox: str) -> None:
    usurpers: list[object] = []
    source = record("n-1", locked=True)
    payload = {"noticeId": "n-1", "tallyId": "t-1", "count": 2}

    def outlive_the_lease(_: MessageContext) -> None:
        clock.advance(60)  # past the lease: a redelivery claims the key meanwhile
        usurpers.append(consumer.store.claim(source, payload_hash(payload), 60_000))

    consumer = emitting(dynamodb, sqs, clock, outlive_the_lease, lease_max_ms=10_000)

    assert consumer.outcomes([sqs_record("m", notice_body("n-1", 2, locked=True))]) == [Outcome.RETRIED]

    assert isinstance(usurpers[0], Claimed)
    assert items(dynamodb) == {}
    assert tally_entries(dynamodb, TALLIES, "t-1") == []


# -- the items, as outbox_writes builds them --------------------------------------------------------------------------


def written(*messages: Any, destinations: tuple[str, ...] = ("Q", "T", "B"), record_id: str = "E#k") -> list[Any]:
    puts = outbox_writes(
        messages, table=OUTBOX, destinations=destinations, record_id=record_id, now_ms=1_000_500, ttl_seconds=10
    )
    return [dict(put.item) for put in puts]


def test_each_kind_of_message_carries_what_its_destination_needs() -> None:
    queue, topic, bus = written(
        QueueMessage("Q", "Queued", {"a": 1}, group_id="g-1"),
        TopicMessage("T", "Published", [1, 2], raw=True),
        BusEvent("B", "Happened", {"b": 2}, source="shop.orders"),
    )

    key = "E#k#0"
    assert queue == {
        "id": key,
        "destination": "Q",
        "kind": "queue",
        "body": '{"eventType":"Queued","metadata":{"idempotencyKey":"E#k#0"},"payload":{"a":1}}',
        "groupId": "g-1",
        # Derived from the key, so a resend within SQS's five minutes is dropped by the queue itself too.
        "deduplicationId": hashlib.sha256(key.encode()).hexdigest(),
        "sourceRecord": "E#k",
        "createdAtMs": 1_000_500,
        "expiresAt": 1_010,
    }
    assert (topic["kind"], topic["body"], "groupId" in topic) == ("topic", "[1,2]", False)
    assert (bus["kind"], bus["source"], bus["detailType"]) == ("bus", "shop.orders", "Happened")
    assert json.loads(bus["body"])["metadata"] == {"idempotencyKey": "E#k#2"}


def test_a_key_past_the_envelopes_limits_hashes_its_sources_key_and_keeps_its_position() -> None:
    long_key = "k" * 600
    key = derived_key(f"Event#{long_key}", 7)

    assert key == f"Event#sha256:{hashlib.sha256(long_key.encode()).hexdigest()}#7"
    assert derived_key(f"Event#{'k' * 500}", 7) == f"Event#{'k' * 500}#7"  # 508 characters: kept as it is
    assert len(derived_key(f"Event#{'k' * 504}", 10)) < 512  # 513 characters otherwise
    # 254 characters of four bytes each: a key the envelope takes (1,016 bytes), derived past its 1,024 bytes.
    wide = "\U0001f4e6" * 254
    digest = hashlib.sha256(wide.encode()).hexdigest()
    assert derived_key(f"OrderPaid#{wide}", 0) == f"OrderPaid#sha256:{digest}#0"  # 1,028 bytes otherwise


@pytest.mark.parametrize(
    ("message", "error_type", "said"),
    [
        (QueueMessage("Q", "E", {"x": float("nan")}), ErrorType.INVALID_OUTGOING_MESSAGE, "its payload is not JSON"),
        (QueueMessage("Q", "E", {"x": object()}), ErrorType.INVALID_OUTGOING_MESSAGE, "its payload is not JSON"),
        (QueueMessage("Q", "no spaces", {}), ErrorType.INVALID_OUTGOING_MESSAGE, "its event type must be"),
        (QueueMessage("Q", "E", {}, deduplication_id="d"), ErrorType.INVALID_OUTGOING_MESSAGE, "goes with a group id"),
        (QueueMessage("Q", "E", {}, group_id="g" * 129), ErrorType.INVALID_OUTGOING_MESSAGE, "its group id must be"),
        (BusEvent("B", "E", {}, source=""), ErrorType.INVALID_OUTGOING_MESSAGE, "its source must be"),
        (Put(table=OUTBOX, item={}), ErrorType.INVALID_OUTGOING_MESSAGE, "is a Put; a handler emits a QueueMessage"),
        (QueueMessage("X", "E", {}), ErrorType.UNDECLARED_DESTINATION, "'X', which is not one of"),
        (QueueMessage("Q", "E", "é" * (MAX_BODY_BYTES // 2)), ErrorType.OUTGOING_MESSAGE_TOO_LARGE, "bytes; at most"),
    ],
    ids=["nan", "object", "event type", "dedup alone", "group id", "source", "a write", "undeclared", "too large"],
)
def test_a_message_the_relay_could_never_send_is_named_in_its_own_words(
    message: Any, error_type: ErrorType, said: str
) -> None:
    with pytest.raises(PoisonMessage) as raised:
        written(QueueMessage("Q", "Fine", {}), message)

    assert raised.value.error_type == error_type
    assert said in raised.value.message
    assert raised.value.message.startswith("outgoing message 1")
