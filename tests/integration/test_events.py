"""Every sample event is an SQS event in Lambda's shape and does what its name promises."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from local.event_files import load_event
from local.stack import DeployedStack
from testkit import dead_letters
from testkit.webhook import WebhookSink
from tests.integration.lambda_shape import RECORD_KEYS

EVENTS = Path(__file__).resolve().parents[2] / "events"


def _ledger(stack: DeployedStack) -> dict[tuple[str, str], dict]:
    items = stack.servers.client("dynamodb").scan(TableName=stack.table_name("LedgerTable"))["Items"]
    return {(item["accountId"]["S"], item["entryId"]["S"]): item for item in items}


def _balances(stack: DeployedStack) -> dict[str, int]:
    return {
        account: int(item["balanceCents"]["N"])
        for (account, entry), item in _ledger(stack).items()
        if entry == "BALANCE"
    }


def _dead_letter_types(stack: DeployedStack) -> list[str]:
    parked = dead_letters.peek(stack.servers.client("sqs"), stack.dead_letter_queue.url)
    return sorted(letter.error_type or "" for letter in parked)


def test_every_event_file_is_covered_below() -> None:
    assert {path.name for path in EVENTS.glob("*.json")} == set(EXPECTED)


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


def _payment_single(stack: DeployedStack, sink: WebhookSink) -> None:
    assert _balances(stack) == {"acc-1": 1250}
    assert _dead_letter_types(stack) == []


def _batch_with_duplicates(stack: DeployedStack, sink: WebhookSink) -> None:
    # Two keys each sent twice (one in the body, one as the IdempotencyKey attribute): credited once each.
    assert _balances(stack) == {"acc-1": 4000, "acc-2": 1000}
    assert sum(entry.startswith("PAYMENT#") for _, entry in _ledger(stack)) == 3


def _poison(error_type: str) -> Callable[[DeployedStack, WebhookSink], None]:
    def check(stack: DeployedStack, sink: WebhookSink) -> None:
        assert _dead_letter_types(stack) == [error_type]
        assert _balances(stack) == {}

    return check


def _key_reuse(stack: DeployedStack, sink: WebhookSink) -> None:
    assert _balances(stack) == {"acc-3": 700}
    assert _dead_letter_types(stack) == ["IdempotencyKeyReused"]


def _receipt(stack: DeployedStack, sink: WebhookSink) -> None:
    (request,) = sink.received()
    assert request.idempotency_key == "rcpt-2024-000017"
    assert request.json()["receiptId"] == "rcpt-17"
    assert ("acc-1", "RECEIPT#rcpt-17") in _ledger(stack)


def _fifo(stack: DeployedStack, sink: WebhookSink) -> None:
    assert _balances(stack) == {"acc-4": 400, "acc-5": 600}


EXPECTED: dict[str, Callable[[DeployedStack, WebhookSink], None]] = {
    "payment-single.json": _payment_single,
    "payment-batch-with-duplicates.json": _batch_with_duplicates,
    "poison-invalid-json.json": _poison("InvalidJson"),
    "poison-schema-violation.json": _poison("SchemaViolation"),
    "poison-unknown-event-type.json": _poison("UnknownEventType"),
    "poison-key-reuse.json": _key_reuse,
    "receipt-requested.json": _receipt,
    "fifo-batch.json": _fifo,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_event_does_what_its_name_says(name: str, stack: DeployedStack, webhook_sink: WebhookSink) -> None:
    invocation = stack.runtime.invoke(load_event(EVENTS / name))

    assert invocation.succeeded, invocation.error
    assert invocation.response == {"batchItemFailures": []}, json.dumps(invocation.response)
    EXPECTED[name](stack, webhook_sink)
