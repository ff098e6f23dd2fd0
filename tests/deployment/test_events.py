"""Every sample event is an SQS event in Lambda's shape; each of its messages ends applied once, as a duplicate or
in the DLQ with a reason, and delivered again it changes no declared table. The core's own poison samples are
dead-lettered for what their names say. What an example's samples do to its tables is checked in tests/app/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from consumer.envelope import parse_message
from consumer.errors import PoisonMessage
from consumer.idempotency.record import Attr, Status
from local.event_files import load_event
from local.stack import DeployedStack
from tests.tooling import generic
from tests.tooling.lambda_shape import RECORD_KEYS

EVENTS = Path(__file__).resolve().parents[2] / "events"
# The core's poison samples, whatever handlers are registered: a body that is not JSON, a type no handler takes.
CORE_POISON = {"poison-invalid-json.json": "InvalidJson", "poison-unknown-event-type.json": "UnknownEventType"}


def invoke(stack: DeployedStack, name: str) -> dict[str, object]:
    invocation = stack.runtime.invoke(load_event(EVENTS / name))
    assert invocation.succeeded, invocation.error
    assert invocation.response == {"batchItemFailures": []}, json.dumps(invocation.response)
    return invocation.response


def dead_letter_types(stack: DeployedStack) -> list[str]:
    return sorted(letter.error_type or "" for letter in generic.letters(stack))


@pytest.mark.parametrize("name", sorted(path.name for path in EVENTS.glob("*.json")))
def test_event_has_lambdas_sqs_shape(name: str) -> None:
    event = load_event(EVENTS / name)
    assert event["Records"]
    for record in event["Records"]:
        assert set(record) == RECORD_KEYS
        assert record["eventSource"] == "aws:sqs"
        assert record["eventSourceARN"].startswith("arn:aws:sqs:")
        assert int(record["attributes"]["ApproximateReceiveCount"]) >= 1
        for attribute in record["messageAttributes"].values():
            assert set(attribute) >= {"stringValue", "dataType"}


@pytest.mark.parametrize("name", sorted(CORE_POISON))
def test_a_core_poison_sample_is_dead_lettered_for_what_its_name_says(name: str, stack: DeployedStack) -> None:
    before = generic.declared_items(stack)
    invoke(stack, name)
    assert dead_letter_types(stack) == [CORE_POISON[name]]
    assert generic.declared_items(stack) == before


def _record_ends(stack: DeployedStack, record: dict[str, object], dead_lettered: set[str]) -> str | None:
    """Why this record is not settled (its key's record completed, or itself dead-lettered); ``None`` if it is."""
    if record["messageId"] in dead_lettered:
        return None
    try:
        message = parse_message(record)
    except PoisonMessage as poison:
        return f"{record['messageId']} refused ({poison}) but not dead-lettered"
    found = generic.record(stack, message.event_type, message.idempotency_key)
    if found is None or found[Attr.STATUS]["S"] != Status.COMPLETED:
        return f"{record['messageId']} ({message.event_type}, key {message.idempotency_key}) neither applied nor parked"
    return None


@pytest.mark.parametrize("name", sorted(path.name for path in EVENTS.glob("*.json") if path.name not in CORE_POISON))
def test_every_message_of_a_sample_ends_settled_and_a_second_delivery_changes_nothing(
    name: str, stack: DeployedStack
) -> None:
    invoke(stack, name)
    once, parked = generic.declared_items(stack), generic.letters(stack)
    reasons = {letter.original_message_id: letter.error_type for letter in parked}
    assert all(reasons.values()), f"{name}: a dead letter without a reason: {parked}"
    records = load_event(EVENTS / name)["Records"]
    assert [why for r in records if (why := _record_ends(stack, r, set(reasons)))] == [], name

    invoke(stack, name)  # the same messages delivered again (SQS's at-least-once)
    assert generic.declared_items(stack) == once, f"{name}: a second delivery changed a declared table"
    again = [letter for letter in generic.letters(stack) if letter.original_message_id in reasons]
    assert sorted(letter.error_type or "" for letter in again) == sorted(2 * [str(t) for t in reasons.values()])
