"""The receipt example's own checks: its webhook settings, and one receipt posted and recorded per key."""

from __future__ import annotations

import base64
from typing import Any

import boto3
import pytest

from consumer.api import ConfigurationError
from service.handlers.receipt_requested import ReceiptRequestedHandler
from tests.kit import (
    Answer,
    Clock,
    Consumer,
    WebhookSink,
    answer_id,
    consumer_of,
    create_template_tables,
    envelope,
    settings_for,
    sqs_record,
)

LEDGER = "ledger"


def receipt(receipt_id: str, key: str | None = None) -> str:
    payload = {
        "receiptId": receipt_id,
        "paymentId": f"p-{receipt_id}",
        "accountId": "acc-1",
        "amountCents": 1250,
        "currency": "EUR",
        "email": "acc-1@example.com",
    }
    return envelope("ReceiptRequested", key or f"receipt-{receipt_id}", payload)


def consumer_with(dynamodb: Any, sqs: Any, clock: Clock, **settings: Any) -> Consumer:
    create_template_tables(dynamodb, {"LedgerTable": LEDGER})
    built = settings_for([ReceiptRequestedHandler], tables={"LedgerTable": LEDGER}, **settings)
    return consumer_of(dynamodb, sqs, clock, {"ReceiptRequested": ReceiptRequestedHandler(built)}, built)


@pytest.fixture
def sink(api_sink: WebhookSink) -> WebhookSink:
    return api_sink


def ledger_item(dynamodb: Any, entry: str) -> dict[str, Any] | None:
    key = {"accountId": {"S": "acc-1"}, "entryId": {"S": entry}}
    item: dict[str, Any] | None = dynamodb.get_item(TableName=LEDGER, Key=key, ConsistentRead=True).get("Item")
    return item


def test_a_receipt_is_posted_once_and_recorded_in_the_ledger(
    dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink
) -> None:
    receipts = consumer_with(dynamodb, sqs, clock, receipt_webhook_url=f"{sink.url}/ReceiptWebhookUrl")

    assert receipts.failed_ids([sqs_record("r1", receipt("1")), sqs_record("r1-copy", receipt("1"))]) == []
    assert receipts.failed_ids([sqs_record("r1-redelivered", receipt("1"))]) == []

    assert sink.keys() == ["receipt-1"]
    assert sink.received()[0].json()["receiptId"] == "1"
    entry = ledger_item(dynamodb, "RECEIPT#1")
    assert entry is not None and entry["webhookStatus"] == {"N": "200"}
    # What the receipt service answered is committed with the record: its id for this delivery.
    assert entry["deliveryId"] == {"S": answer_id("receipt-1")}


def test_an_empty_answer_commits_no_delivery_id(dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink) -> None:
    sink.answer_next(Answer(status=204, body=""))
    receipts = consumer_with(dynamodb, sqs, clock, receipt_webhook_url=f"{sink.url}/receipts")

    assert receipts.failed_ids([sqs_record("r1", receipt("1"))]) == []

    entry = ledger_item(dynamodb, "RECEIPT#1")
    assert entry is not None and entry["webhookStatus"] == {"N": "204"} and "deliveryId" not in entry


def test_an_answer_that_is_not_json_is_dead_lettered_in_its_own_words_and_nothing_recorded(
    dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink
) -> None:
    sink.answer_next(Answer(body=b"<html>maintenance</html>"))
    receipts = consumer_with(dynamodb, sqs, clock, receipt_webhook_url=f"{sink.url}/receipts")

    assert receipts.failed_ids([sqs_record("r1", receipt("1"))]) == []

    (letter,) = receipts.dead_letters()
    assert letter.error_type == "WebhookAnswerUnreadable"
    assert letter.error_message == "HTTP 200: the answer's 24 bytes are not JSON"
    assert ledger_item(dynamodb, "RECEIPT#1") is None


def test_receipts_wait_in_the_queue_while_no_webhook_is_configured(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    receipts = consumer_with(dynamodb, sqs, clock)

    assert receipts.failed_ids([sqs_record("r1", receipt("1"))]) == ["r1"]
    assert receipts.dead_letters() == []
    assert ledger_item(dynamodb, "RECEIPT#1") is None


@pytest.mark.parametrize("url", ["http://example.com/receipts", "ftp://127.0.0.1/receipts", "https:///no-host"])
def test_a_plain_http_or_odd_url_beyond_loopback_is_refused_at_start(url: str) -> None:
    with pytest.raises(ConfigurationError, match="RECEIPT_WEBHOOK_URL"):
        ReceiptRequestedHandler(settings_for([ReceiptRequestedHandler], receipt_webhook_url=url))


def test_a_webhook_beyond_loopback_without_a_secret_is_refused_at_start() -> None:
    with pytest.raises(ConfigurationError, match="RECEIPT_WEBHOOK_URL beyond loopback needs a signing key"):
        ReceiptRequestedHandler(
            settings_for([ReceiptRequestedHandler], receipt_webhook_url="https://receipts.example.com/hook")
        )


def test_the_secret_setting_signs_each_receipt(dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink) -> None:
    secret = "whsec_" + base64.b64encode(bytes(range(32))).decode()
    arn = boto3.client("secretsmanager").create_secret(Name="receipt-signing", SecretString=secret)["ARN"]
    receipts = consumer_with(
        dynamodb, sqs, clock, receipt_webhook_url=f"{sink.url}/ReceiptWebhookUrl", webhook_secret_arn=arn
    )

    assert receipts.failed_ids([sqs_record("r", receipt("1"))]) == []

    (request,) = sink.received()
    assert request.headers["webhook-signature"].startswith("v1,")
