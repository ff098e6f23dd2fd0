"""The envelope's edges that `make mutation` found untested: attribute keys, and a reason's length."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError, create_model, field_validator

from consumer.envelope import KeySource, parse_message, schema_violation
from consumer.errors import MAX_REASON_CHARS, ErrorType

BODY = json.dumps({"eventType": "Anything", "payload": {}})


def key_from(attribute: Any) -> tuple[str, KeySource]:
    message = parse_message(
        {"messageId": "m-1", "body": BODY, "attributes": {}, "messageAttributes": {"IdempotencyKey": attribute}}
    )
    return message.idempotency_key, message.key_source


@pytest.mark.parametrize(
    "attribute",
    [
        {"stringValue": "attr-key"},  # Lambda may leave dataType out: a string
        {"stringValue": "attr-key", "dataType": "String"},
        {"stringValue": "attr-key", "dataType": "String.uuid"},  # a custom type of String
        {"stringValue": "attr-key", "dataType": "String.with.dots"},
    ],
)
def test_a_string_attribute_of_any_string_type_is_the_key(attribute: dict[str, str]) -> None:
    assert key_from(attribute) == ("attr-key", KeySource.ATTRIBUTE)


@pytest.mark.parametrize(
    "attribute",
    [
        {"stringValue": "attr-key", "dataType": "Binary"},
        {"stringValue": "attr-key", "dataType": "Number"},
        {"stringValue": "attr-key", "dataType": "Stringly"},
        {"stringValue": "attr-key", "dataType": 7},
        {"stringValue": 7, "dataType": "String"},
        "attr-key",  # not the shape Lambda gives an attribute
    ],
)
def test_an_attribute_that_is_not_a_string_is_not_a_key(attribute: Any) -> None:
    assert key_from(attribute) == ("m-1", KeySource.MESSAGE_ID)


def violation(*messages: str) -> ValidationError:
    """A validation error per message, on fields f0, f1...: 'fN: Value error, <message>'."""

    def refuse(value: str, info: Any) -> str:
        raise ValueError(messages[int(info.field_name[1:])])

    fields: dict[str, Any] = {f"f{index}": (str, "") for index in range(len(messages))}
    model = create_model(
        "Refusing",
        __validators__={"refuse": field_validator(*fields, mode="before")(refuse)},
        **fields,
    )
    with pytest.raises(ValidationError) as error:
        model.model_validate({name: "x" for name in fields})
    return error.value


def test_an_error_on_the_whole_input_is_placed_on_the_body() -> None:
    with pytest.raises(ValidationError) as error:
        create_model("Empty").model_validate(7)

    assert schema_violation(error.value).message.startswith("body: Input should be")


def test_a_reason_of_exactly_the_limit_is_kept_whole() -> None:
    reason = schema_violation(violation("a" * (MAX_REASON_CHARS - len("f0: Value error, ")))).message

    assert len(reason) == MAX_REASON_CHARS
    assert reason.startswith("f0: Value error, aaa")


def test_one_error_longer_than_the_limit_is_counted_not_cut() -> None:
    poison = schema_violation(violation("a" * MAX_REASON_CHARS))

    assert poison.error_type == ErrorType.SCHEMA_VIOLATION
    assert poison.message == f"1 more past the reason's {MAX_REASON_CHARS} characters"


@pytest.mark.parametrize("count", [40, 41])
def test_a_long_list_keeps_as_many_errors_as_fit(count: int) -> None:
    # About 50 characters an error with its separator: some twenty fit, the rest are counted.
    reason = schema_violation(violation(*("b" * 30 for _ in range(count)))).message
    listed = reason.split("; ")
    shown = len(listed) - 1

    assert listed[-1] == f"{count - shown} more past the reason's {MAX_REASON_CHARS} characters"
    assert listed[:-1] == [f"f{index}: Value error, {'b' * 30}" for index in range(shown)]
    one_more = "; ".join(
        [*listed[:-1], f"f{shown}: Value error, {'b' * 30}", f"{count - shown - 1} more past the reason's 1000 ..."]
    )
    assert len(reason) <= MAX_REASON_CHARS < len(one_more)
