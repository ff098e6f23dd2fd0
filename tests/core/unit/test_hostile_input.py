"""No record can fail its batch: hostile bodies, keys and record fields each end in one outcome.

Each case sits beside a valid tally entry (tests/core/handlers.py) in the same batch: it must be applied
once, the hostile record dead-lettered with a precise ``ErrorType`` (or applied, where
the input is in fact valid), and the handler must return a partial batch response.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import pytest

from consumer.dead_letter import MAX_MESSAGE_BYTES, DeadLetterQueue, message_size
from consumer.envelope import MAX_BODY_BYTES, MAX_KEY_BYTES, MAX_KEY_LENGTH, MAX_NESTING_DEPTH
from consumer.errors import MAX_REASON_CHARS, ErrorType, PoisonMessage
from consumer.prepared import Prepared
from testkit.dead_letters import reasons
from testkit.lambda_sqs import sqs_record
from tests.core.handlers import TALLY_EVENT, UNIT, tally_body
from tests.core.hostile import Hostile, hostile_family
from tests.core.unit.conftest import Consumer, total

if TYPE_CHECKING:
    from types_boto3_sqs import SQSClient


def body_with(payload: Any, key: Any = "k-hostile", event_type: Any = TALLY_EVENT) -> str:
    return json.dumps({"eventType": event_type, "metadata": {"idempotencyKey": key}, "payload": payload})


def nested(depth: int) -> str:
    return '{"eventType":"' + TALLY_EVENT + '","payload":' + "[" * depth + "]" * depth + "}"


def error_types(consumer: Consumer) -> dict[str, str | None]:
    return reasons(consumer.dead_letters())


def run_beside_a_valid_message(
    consumer: Consumer, hostile: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str | None]]:
    response = consumer.process([sqs_record("good", tally_body("e-good", tally_id="t-good")), hostile])
    assert total(consumer.dynamodb, "t-good") == 1250
    return response, error_types(consumer)


HOSTILE_BODIES = [
    pytest.param(nested(5_000), ErrorType.NESTING_TOO_DEEP, id="5000-nested-arrays"),
    pytest.param(nested(MAX_NESTING_DEPTH + 1), ErrorType.NESTING_TOO_DEEP, id="just-past-the-depth-limit"),
    pytest.param("[" * 100_000, ErrorType.NESTING_TOO_DEEP, id="unterminated-deep-array"),
    pytest.param('{"a":' * 3_000 + "1" + "}" * 3_000, ErrorType.NESTING_TOO_DEEP, id="deep-objects"),
    pytest.param("x" * (MAX_BODY_BYTES + 1), ErrorType.BODY_TOO_LARGE, id="over-the-body-limit"),
    pytest.param(body_with({"note": "é" * 600_000}), ErrorType.BODY_TOO_LARGE, id="multibyte-over-the-limit"),
    pytest.param("", ErrorType.INVALID_JSON, id="empty"),
    pytest.param("null", ErrorType.SCHEMA_VIOLATION, id="null"),
    pytest.param("[1,2]", ErrorType.SCHEMA_VIOLATION, id="array"),
    pytest.param("\ud800", ErrorType.INVALID_JSON, id="lone-surrogate-text"),
    pytest.param(body_with({"n": 1}).replace("1", "1" * 4_301), ErrorType.INVALID_JSON, id="integer-past-4300-digits"),
    pytest.param(body_with({"entryId": "e", "tallyId": "t", "amount": float("nan"), "unit": UNIT}),
                 ErrorType.SCHEMA_VIOLATION, id="nan-amount"),
    pytest.param(body_with({"entryId": "e", "tallyId": "t", "amount": 10**30, "unit": UNIT}),
                 ErrorType.SCHEMA_VIOLATION, id="huge-amount"),
    pytest.param(body_with("not an object"), ErrorType.SCHEMA_VIOLATION, id="string-payload"),
    pytest.param(body_with({}, event_type="Tally#Added"), ErrorType.SCHEMA_VIOLATION, id="hash-in-event-type"),
    pytest.param(body_with({}, key=""), ErrorType.SCHEMA_VIOLATION, id="empty-key"),
    pytest.param(body_with({}, key="   \t"), ErrorType.SCHEMA_VIOLATION, id="blank-key"),
    pytest.param(body_with({}, key="k" * (MAX_KEY_LENGTH + 1)), ErrorType.SCHEMA_VIOLATION, id="long-key"),
    pytest.param(body_with({}, key="\U0001f600" * (MAX_KEY_BYTES // 4 + 1)), ErrorType.SCHEMA_VIOLATION,
                 id="key-over-the-byte-limit"),
    pytest.param(body_with({}, key="a\u0000b"), ErrorType.SCHEMA_VIOLATION, id="control-character-in-key"),
    pytest.param(body_with({}, key="\ud800"), ErrorType.SCHEMA_VIOLATION, id="lone-surrogate-in-key"),
    pytest.param(body_with({}, key=7), ErrorType.SCHEMA_VIOLATION, id="numeric-key"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "error_type"), HOSTILE_BODIES)
def test_a_hostile_body_is_dead_lettered_with_its_reason_and_never_fails_the_batch(
    consumer: Consumer, body: str, error_type: ErrorType
) -> None:
    response, dead = run_beside_a_valid_message(consumer, sqs_record("hostile", body))

    assert response == {"batchItemFailures": []}
    assert dead == {"hostile": error_type.value}


def test_the_deepest_nesting_allowed_is_read_and_judged_by_the_schema(consumer: Consumer) -> None:
    # The limit counts the body object itself, the payload, and what the payload holds.
    payload = {"entryId": "e", "tallyId": "t", "amount": 5, "unit": UNIT, "x": json.loads(nested(29))}
    assert json.dumps(payload).count("[") == 29

    _, dead = run_beside_a_valid_message(consumer, sqs_record("deep-but-fine", body_with(payload)))

    # Read, then refused by the handler's schema (extra field), not by the depth limit.
    assert dead == {"deep-but-fine": ErrorType.SCHEMA_VIOLATION.value}


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"attributes": {"ApproximateReceiveCount": "many"}}, id="non-numeric-receive-count"),
        pytest.param({"attributes": {"ApproximateReceiveCount": "1000000000000"}}, id="huge-receive-count"),
        pytest.param({"attributes": ["not", "a", "map"]}, id="attributes-a-list"),
        pytest.param({"attributes": None}, id="attributes-null"),
        pytest.param({"messageAttributes": "text"}, id="message-attributes-a-string"),
        pytest.param({"messageAttributes": {"IdempotencyKey": "flat"}}, id="attribute-not-a-map"),
        pytest.param({"messageAttributes": {"IdempotencyKey": {"dataType": 5, "stringValue": 3}}}, id="typed-wrong"),
        pytest.param(
            {"messageAttributes": {"IdempotencyKey": {"dataType": "Binary", "binaryValue": "AAEC"}}}, id="binary-key"
        ),
        pytest.param({"eventSourceARN": 42, "receiptHandle": None}, id="source-fields-wrong"),
    ],
)
def test_malformed_record_fields_are_read_as_absent_and_the_message_is_applied(
    consumer: Consumer, fields: dict[str, Any]
) -> None:
    record = {**sqs_record("odd", tally_body("e-odd", tally_id="t-odd")), **fields}

    response, dead = run_beside_a_valid_message(consumer, record)

    assert response == {"batchItemFailures": []}
    assert dead == {}
    assert total(consumer.dynamodb, "t-odd") == 1250


def test_a_blank_idempotency_key_attribute_is_refused_not_replaced_by_the_message_id(consumer: Consumer) -> None:
    body = json.dumps({"eventType": TALLY_EVENT, "payload": json.loads(tally_body("e-9"))["payload"]})
    attributes = {"IdempotencyKey": {"dataType": "String", "stringValue": "  "}}

    _, dead = run_beside_a_valid_message(consumer, sqs_record("blank-attr", body, message_attributes=attributes))

    assert dead == {"blank-attr": ErrorType.SCHEMA_VIOLATION.value}


def test_a_record_that_breaks_an_unforeseen_step_is_dead_lettered_as_unprocessable(
    consumer: Consumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A defect in reading a record fails the same way on every delivery: dead-letter it.
    def broken(payload: Any) -> str:
        raise RuntimeError("hashing broke")

    monkeypatch.setattr("consumer.envelope.payload_hash", broken)

    response = consumer.process([sqs_record("x", tally_body("e-x"))])

    assert response == {"batchItemFailures": []}
    (message,) = consumer.dead_letters()
    assert message.error_type == ErrorType.UNPROCESSABLE_RECORD.value
    assert "RuntimeError: hashing broke" in (message.error_message or "")


# -- the dead-letter copy stays within SQS's message limit --------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send_message(self, **request: Any) -> dict[str, Any]:
        self.sent.append(request)
        return {}


def recorded_queue(recorder: Recorder) -> DeadLetterQueue:
    """A dead-letter queue whose client records what it would send; it only needs ``send_message``."""
    return DeadLetterQueue(lambda: cast("SQSClient", recorder), "https://dlq")


def keyed(record: dict[str, Any], key: str | None) -> Prepared:
    return replace(Prepared.unread(record, PoisonMessage(ErrorType.INVALID_JSON, "unused")), idempotency_key=key)


def many_attributes() -> dict[str, Any]:
    return {f"Attr{i}": {"dataType": "String", "stringValue": "v" * 200} for i in range(6)}


@pytest.mark.parametrize("body_bytes", [MAX_BODY_BYTES - 500, MAX_BODY_BYTES - 10, MAX_BODY_BYTES])
def test_a_poison_message_at_the_size_limit_reaches_the_dlq_with_its_reason_within_the_limit(body_bytes: int) -> None:
    recorder = Recorder()
    record = sqs_record("big", "b" * body_bytes, message_attributes=many_attributes())

    recorded_queue(recorder).send(keyed(record, "key-1"), ErrorType.SCHEMA_VIOLATION, "too odd")

    (sent,) = recorder.sent
    attributes = sent["MessageAttributes"]
    assert message_size(sent["MessageBody"], attributes) <= MAX_MESSAGE_BYTES
    assert attributes["ErrorType"]["StringValue"] == "SchemaViolation"
    assert attributes["ErrorMessage"]["StringValue"] == "too odd"
    # The original attributes give way first, and say so.
    assert attributes["DroppedAttributes"]["StringValue"] == ",".join(sorted(many_attributes()))
    if "BodyTruncated" in attributes:
        assert attributes["BodyTruncated"]["StringValue"].startswith(f"{body_bytes} bytes, sha256:")
        assert sent["MessageBody"] == "b" * len(sent["MessageBody"])
    else:
        assert sent["MessageBody"] == "b" * body_bytes


def test_a_small_poison_message_keeps_its_body_and_attributes_untouched() -> None:
    recorder = Recorder()
    record = sqs_record("small", "{oops", message_attributes=many_attributes())

    recorded_queue(recorder).send(keyed(record, None), ErrorType.INVALID_JSON, "bad")

    (sent,) = recorder.sent
    assert sent["MessageBody"] == "{oops"
    assert set(sent["MessageAttributes"]) == {*many_attributes(), "ErrorType", "ErrorMessage", "OriginalMessageId"}


def test_a_truncated_body_is_cut_on_a_character_boundary() -> None:
    recorder = Recorder()
    record = sqs_record("wide", "€" * (MAX_BODY_BYTES // 3))

    recorded_queue(recorder).send(keyed(record, "k"), ErrorType.BODY_TOO_LARGE, "x" * 5_000)

    (sent,) = recorder.sent
    assert set(sent["MessageBody"]) == {"€"}
    assert len(sent["MessageAttributes"]["ErrorMessage"]["StringValue"]) == 1_000
    assert message_size(sent["MessageBody"], sent["MessageAttributes"]) <= MAX_MESSAGE_BYTES


VALID_PAYLOAD = {"entryId": "e", "tallyId": "t", "amount": 1, "unit": UNIT}


def test_a_field_name_sqs_cannot_carry_reaches_the_dlq_reason_replaced(consumer: Consumer) -> None:
    # Payload field names are echoed in the schema error; one SQS refuses must not make the send fail.
    hostile = sqs_record("nul-field", body_with({**VALID_PAYLOAD, "\u0000\u0008": 1}))
    assert consumer.process([hostile]) == {"batchItemFailures": []}
    (letter,) = consumer.dead_letters()
    assert letter.error_type == ErrorType.SCHEMA_VIOLATION
    reason = letter.error_message or ""
    assert "\ufffd" in reason
    assert "\u0000" not in reason
    assert "\u0008" not in reason


# -- at SQS's limits: the work per message grows with its size, never faster --------------------


@pytest.mark.parametrize("hostile", hostile_family(TALLY_EVENT, VALID_PAYLOAD), ids=lambda hostile: hostile.name)
def test_a_message_at_sqs_limits_is_dead_lettered_in_the_invocation_that_reads_it_and_its_batch_applied(
    consumer: Consumer, hostile: Hostile
) -> None:
    valid = [sqs_record(f"good-{index}", tally_body(f"e-{index}", tally_id=f"t-{index}")) for index in range(9)]
    record = sqs_record("hostile", hostile.body, message_attributes=hostile.message_attributes)

    response = consumer.process([*valid, record])

    assert response == {"batchItemFailures": []}
    assert [total(consumer.dynamodb, f"t-{index}") for index in range(9)] == [1250] * 9
    (letter,) = consumer.dead_letters()
    assert (letter.original_message_id, letter.error_type) == ("hostile", hostile.error_type)
    assert 0 < len(letter.error_message or "") <= MAX_REASON_CHARS
