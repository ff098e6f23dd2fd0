"""The envelope's edges that `make mutation` found untested: attribute keys, a reason's length, the receive count, the
payload's hash, the key's and the body's limits, the FIFO group."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError, create_model, field_validator

from consumer.envelope import (
    MAX_BODY_BYTES,
    MAX_KEY_BYTES,
    MAX_KEY_LENGTH,
    MAX_NESTING_DEPTH,
    KeySource,
    message_group_id,
    parse_message,
    payload_hash,
    receive_count,
    schema_violation,
)
from consumer.errors import MAX_REASON_CHARS, ErrorType, PoisonMessage
from testkit.lambda_sqs import FIFO_QUEUE_ARN

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


@pytest.mark.parametrize(
    ("attributes", "count"),
    [({"ApproximateReceiveCount": "3"}, 3), ({"ApproximateReceiveCount": "1"}, 1), ({}, 1)]
    + [({"ApproximateReceiveCount": raw}, 1) for raw in ("0", "-2", "many", None)],
)
def test_the_receive_count_is_sqss_own_or_1(attributes: dict[str, Any], count: int) -> None:
    assert receive_count({"messageId": "m-1", "body": BODY, "attributes": attributes}) == count


# The bytes hashed, checked apart with `printf '<bytes>' | sha256sum`. A record stores its payload's hash, and a resend
# is compared with it: a change of the hash across a deploy would dead-letter every resend as IdempotencyKeyReused.
@pytest.mark.parametrize(
    ("payload", "digest"),
    [
        # {"a":[1,{"x":2.5,"y":null}],"b":"é"}: keys sorted, no spaces, UTF-8 as is
        (
            {"b": "é", "a": [1, {"y": None, "x": 2.5}]},
            "6d8a693d1044e6f7262c2760333e43808b17250bd4da60d1c4d806c58462b8c9",
        ),
        # {"s":"<ed a0 80>"}: a lone surrogate JSON may spell, hashed as its UTF-8 form rather than refused
        ({"s": "\ud800"}, "8e04c1d28e2fa74bca9317362371e5be8429ed0323472094c4e0d0ef4d2d6396"),
    ],
    ids=["canonical", "lone-surrogate"],
)
def test_the_payload_hash_is_the_sha256_of_its_canonical_json(payload: dict[str, Any], digest: str) -> None:
    assert payload_hash(payload) == digest


@pytest.mark.parametrize(
    ("key", "refused"),
    [
        (" \t", "is empty or blank"),
        ("k" * MAX_KEY_LENGTH, None),
        ("k" * (MAX_KEY_LENGTH + 1), f"is longer than {MAX_KEY_LENGTH} characters"),
        ("a\x01b", "holds characters SQS cannot carry (control characters or lone surrogates)"),
        ("\U0001f600" * (MAX_KEY_BYTES // 4), None),
        ("\U0001f600" * (MAX_KEY_BYTES // 4 + 1), f"is longer than {MAX_KEY_BYTES} bytes in UTF-8"),
    ],
    ids=["blank", "longest", "one-too-long", "control-character", "most-bytes", "one-character-too-many-bytes"],
)
def test_a_key_is_refused_blank_or_past_its_length_and_kept_at_it(key: str, refused: str | None) -> None:
    # From the attribute: the body's key is bounded by the envelope's model first.
    message = {"messageId": "m-1", "body": BODY, "messageAttributes": {"IdempotencyKey": {"stringValue": key}}}
    if refused is None:
        assert parse_message(message).idempotency_key == key
    else:
        with pytest.raises(PoisonMessage) as raised:
            parse_message(message)
        said = f"idempotency key (messageAttributes.IdempotencyKey) {refused}"
        assert (raised.value.error_type, raised.value.message) == (ErrorType.SCHEMA_VIOLATION, said)


@pytest.mark.parametrize("container", ["arrays", "objects"])
def test_a_body_too_deep_is_refused_whatever_sits_beside_the_deep_part(container: str) -> None:
    # The scalar is read first: the walk must go on past it to the deep part. Arrays or objects alone: each kind of
    # bracket counts toward the depth the body may reach.
    deep: Any = 1
    for _ in range(MAX_NESTING_DEPTH + 1):
        deep = [deep] if container == "arrays" else {"d": deep}
    body = json.dumps({"eventType": "Anything", "payload": {"deep": deep}, "z": 1})

    with pytest.raises(PoisonMessage) as raised:
        parse_message({"messageId": "m-1", "body": body})
    said = f"body nests deeper than the limit of {MAX_NESTING_DEPTH}"
    assert (raised.value.error_type, raised.value.message) == (ErrorType.NESTING_TOO_DEEP, said)


@pytest.mark.parametrize(
    ("attributes", "group"),
    [({"MessageGroupId": "g-1"}, "g-1"), ({"MessageGroupId": ""}, None), ({"MessageGroupId": 7}, None), ("x", None)],
    ids=["a-group", "empty", "not-text", "attributes-not-a-mapping"],
)
def test_a_fifo_messages_group_is_its_text_or_none(attributes: Any, group: str | None) -> None:
    message = {"messageId": "m-1", "body": BODY, "eventSourceARN": FIFO_QUEUE_ARN, "attributes": attributes}
    assert message_group_id(message) == group


def test_a_body_that_is_not_text_says_what_it_is() -> None:
    with pytest.raises(PoisonMessage) as raised:
        parse_message({"messageId": "m-1", "body": 7})
    assert (raised.value.error_type, raised.value.message) == (ErrorType.INVALID_JSON, "body is not text, got int")


@pytest.mark.parametrize(("extra", "too_large"), [(0, False), (1, True)], ids=["at-the-limit", "one-byte-over"])
def test_a_body_is_refused_past_its_byte_limit_and_kept_at_it(extra: int, too_large: bool) -> None:
    frame = json.dumps({"eventType": "Anything", "payload": {"pad": ""}})
    body = frame.replace('"pad": ""', '"pad": "' + "x" * (MAX_BODY_BYTES - len(frame) + extra) + '"')
    assert len(body.encode()) == MAX_BODY_BYTES + extra

    if too_large:
        with pytest.raises(PoisonMessage) as raised:
            parse_message({"messageId": "m-1", "body": body})
        said = f"body is {MAX_BODY_BYTES + 1} bytes, the limit is {MAX_BODY_BYTES}"
        assert (raised.value.error_type, raised.value.message) == (ErrorType.BODY_TOO_LARGE, said)
    else:
        assert parse_message({"messageId": "m-1", "body": body}).payload == {"pad": "x" * (len(body) - len(frame))}


def test_two_errors_two_characters_past_the_limit_leave_the_second_counted_and_the_reason_within_it() -> None:
    # 982 + "; " + 18 = 1,002: the second does not fit, nor does the first with the count beside it.
    first, second = "a" * (982 - len("f0: Value error, ")), "b"

    reason = schema_violation(violation(first, second)).message

    assert len(reason) <= MAX_REASON_CHARS
    assert reason == f"2 more past the reason's {MAX_REASON_CHARS} characters"


def test_a_count_that_fills_the_reason_to_its_last_character_is_kept_beside_what_fits() -> None:
    rest = f"1 more past the reason's {MAX_REASON_CHARS} characters"
    first = "a" * (MAX_REASON_CHARS - len("; ") - len(rest) - len("f0: Value error, "))

    reason = schema_violation(violation(first, "b" * 50)).message

    assert reason == f"f0: Value error, {first}; {rest}"
    assert len(reason) == MAX_REASON_CHARS
