"""The message contract: which key wins, what is poison, and why."""

from __future__ import annotations

import gc
import json
import sys
from types import FrameType
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from consumer.envelope import KeySource, parse_message, payload_hash, schema_violation
from consumer.errors import MAX_REASON_CHARS, ErrorType, PoisonMessage
from testkit.lambda_sqs import FIFO_QUEUE_ARN, sqs_record
from tests.core.handlers import TALLY_EVENT, tally_payload

PAYLOAD = tally_payload("e-1")
ATTRIBUTE_KEY = {"IdempotencyKey": {"stringValue": "attr-key", "dataType": "String"}}


def body(**overrides: object) -> str:
    envelope: dict[str, object] = {"eventType": TALLY_EVENT, "metadata": {"idempotencyKey": "body-key"}}
    envelope["payload"] = PAYLOAD
    envelope.update(overrides)
    return json.dumps(envelope)


def test_the_body_key_wins_over_the_attribute_and_the_message_id() -> None:
    message = parse_message(sqs_record("m-1", body(), message_attributes=ATTRIBUTE_KEY))

    assert message.idempotency_key == "body-key"
    assert message.key_source is KeySource.BODY
    assert message.record_id == f"{TALLY_EVENT}#body-key"


def test_the_attribute_key_is_used_when_the_body_has_none() -> None:
    message = parse_message(sqs_record("m-1", body(metadata={}), message_attributes=ATTRIBUTE_KEY))

    assert message.idempotency_key == "attr-key"
    assert message.key_source is KeySource.ATTRIBUTE


def test_without_any_key_the_message_id_protects_against_redelivery() -> None:
    message = parse_message(sqs_record("m-1", body(metadata={})))

    assert message.idempotency_key == "m-1"
    assert message.key_source is KeySource.MESSAGE_ID


def test_a_non_string_attribute_is_not_a_key() -> None:
    attributes = {"IdempotencyKey": {"binaryValue": "AAE=", "dataType": "Binary"}}

    assert parse_message(sqs_record("m-1", body(metadata={}), message_attributes=attributes)).idempotency_key == "m-1"


def test_the_payload_hash_ignores_key_order_and_whitespace() -> None:
    reordered = dict(reversed(list(PAYLOAD.items())))

    assert payload_hash(PAYLOAD) == payload_hash(reordered)
    assert payload_hash(PAYLOAD) != payload_hash({**PAYLOAD, "amount": 1251})


def test_fifo_group_and_receive_count_are_read_from_the_attributes() -> None:
    message = parse_message(sqs_record("m-1", body(), group_id="t-1", receive_count=3, queue_arn=FIFO_QUEUE_ARN))

    assert message.message_group_id == "t-1"
    assert message.receive_count == 3


@pytest.mark.parametrize(
    ("raw", "error_type", "detail"),
    [
        ("{not json", "InvalidJson", "body is not JSON"),
        ("", "InvalidJson", "body is not JSON"),
        ("[1, 2]", "SchemaViolation", "must be a JSON object, got list"),
        (json.dumps({"metadata": {}, "payload": {}}), "SchemaViolation", "eventType: Field required"),
        (json.dumps({"eventType": TALLY_EVENT}), "SchemaViolation", "payload: Field required"),
        (json.dumps({"eventType": "Bad Type!", "payload": {}}), "SchemaViolation", "eventType: String should match"),
        (
            json.dumps({"eventType": TALLY_EVENT, "metadata": {"idempotencyKey": ""}, "payload": {}}),
            "SchemaViolation",
            "metadata.idempotencyKey",
        ),
        (json.dumps({"eventType": TALLY_EVENT, "payload": [1]}), "SchemaViolation", "payload: Input should be"),
    ],
)
def test_bodies_that_break_the_contract_are_poison_with_a_specific_reason(
    raw: str, error_type: str, detail: str
) -> None:
    with pytest.raises(PoisonMessage) as poison:
        parse_message(sqs_record("m-1", raw))

    assert poison.value.error_type == error_type
    assert detail in poison.value.message


def test_an_overlong_key_is_poison() -> None:
    attributes = {"IdempotencyKey": {"stringValue": "k" * 513, "dataType": "String"}}

    with pytest.raises(PoisonMessage, match="longer than 512"):
        parse_message(sqs_record("m-1", body(metadata={}), message_attributes=attributes))


class _Payload(BaseModel):
    count: int
    label: str


def test_a_schema_violation_lists_every_field_error() -> None:
    with pytest.raises(ValidationError) as error:
        _Payload.model_validate({"count": "many", "label": 7})

    poison = schema_violation(error.value, prefix="payload")

    assert poison.error_type == ErrorType.SCHEMA_VIOLATION
    assert poison.message == (
        "payload.count: Input should be a valid integer, unable to parse string as an integer; "
        "payload.label: Input should be a valid string"
    )


def test_a_schema_violation_beyond_a_dead_letters_reason_lists_what_fits_then_counts_the_rest() -> None:
    many = {f"field_{index:03}": (int, ...) for index in range(200)}
    with pytest.raises(ValidationError) as error:
        create_model("Wide", **many).model_validate({})  # type: ignore[call-overload]

    message = schema_violation(error.value).message

    assert len(message) <= MAX_REASON_CHARS
    listed = message.split("; ")
    assert listed[0] == "field_000: Field required"
    assert listed[-1] == f"{200 - len(listed) + 1} more past the reason's {MAX_REASON_CHARS} characters"
    assert listed[:-1] == [f"field_{index:03}: Field required" for index in range(len(listed) - 1)]


def _errors(count: int) -> ValidationError:
    """``count`` errors of one length each: fields a closed model does not know, named f00000, f00001..."""
    with pytest.raises(ValidationError) as error:
        create_model("Closed", __config__=ConfigDict(extra="forbid")).model_validate(
            {f"f{index:05}": 0 for index in range(count)}
        )
    return error.value


def _calls_to_build_a_reason(error: ValidationError) -> int:
    """Function calls, Python's and built-in ones (each join among them), while the reason is built."""
    calls = 0

    def count(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    # A collection during the count would run finalizers left by earlier tests, counted as this reason's calls.
    gc.collect()
    gc.disable()
    sys.setprofile(count)
    try:
        schema_violation(error)
    finally:
        sys.setprofile(None)
        gc.enable()
    return calls


def test_the_reason_of_50000_errors_costs_the_work_of_what_it_shows_not_of_what_it_counts() -> None:
    few, many = _errors(500), _errors(50_000)
    schema_violation(few)  # the first reason of a process pays one-time work (lazy imports): not counted

    # A wider count of those left out may give back one listed error: a handful of calls, never one per error.
    assert _calls_to_build_a_reason(many) - _calls_to_build_a_reason(few) <= 10
    message = schema_violation(many).message
    assert len(message) <= MAX_REASON_CHARS
    assert message.startswith("f00000: Extra inputs are not permitted; f00001: ")
    assert message.endswith(f" more past the reason's {MAX_REASON_CHARS} characters")
