"""The receipt's webhook call through the whole handler: redirects, a trickling server, any key, status mapping."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3
import pytest

from consumer.errors import ConfigurationError, ErrorType
from consumer.webhook import header_key
from testkit.lambda_sqs import sqs_record
from testkit.messages import receipt_body
from testkit.webhook import Answer, ReceivedRequest, WebhookSink
from tests.unit.conftest import Clock, Consumer, ledger_entries, make_consumer


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    with WebhookSink() as running:
        yield running


@pytest.fixture
def receipts(dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink) -> Consumer:
    return make_consumer(dynamodb, sqs, clock, webhook_url=sink.receipts_url, webhook_timeout_ms=1_000)


def test_a_redirect_is_not_followed_and_the_receipt_is_dead_lettered_with_the_reason(
    receipts: Consumer, sink: WebhookSink
) -> None:
    sink.answer_next(Answer(status=302))

    assert receipts.process([sqs_record("r", receipt_body("1"))]) == {"batchItemFailures": []}

    (letter,) = receipts.dead_letters()
    assert letter.error_type == ErrorType.WEBHOOK_REJECTED
    assert letter.error_message == "HTTP 302: redirect not followed"
    assert [request.path for request in sink.received()] == ["/receipts"]
    assert ledger_entries(receipts.dynamodb, "acc-1") == []


def test_a_trickling_server_cannot_hold_the_call_past_its_deadline(receipts: Consumer, sink: WebhookSink) -> None:
    # Every byte comes within the 1 s timeout; the whole answer would take about 3 s.
    sink.answer_next(Answer(trickle_s=0.06))

    started = time.monotonic()
    failed = receipts.failed_ids([sqs_record("r", receipt_body("1"))])
    held_s = time.monotonic() - started

    assert failed == ["r"]
    assert held_s < 1.8
    assert ledger_entries(receipts.dynamodb, "acc-1") == []


@pytest.mark.parametrize("key", ["заказ-1", "🧾 receipt", "line\r\nInjected: yes", 'a%41"\\ b'])
def test_every_key_the_envelope_accepts_reaches_the_webhook_the_same_on_every_try(
    receipts: Consumer, sink: WebhookSink, key: str
) -> None:
    sink.answer_next(Answer(status=503))
    record = sqs_record("r", receipt_body("1", key=key))

    assert receipts.failed_ids([record]) == ["r"]
    assert receipts.failed_ids([record]) == []

    sent = header_key(key)
    assert sent.isascii()
    assert sink.keys() == [sent, sent]
    assert [request.headers["webhook-id"] for request in sink.received()] == [sent, sent]
    assert ledger_entries(receipts.dynamodb, "acc-1") == ["RECEIPT#1"]
    assert receipts.dead_letters() == []


def test_a_rejection_is_dead_lettered_without_the_response_body(receipts: Consumer, sink: WebhookSink) -> None:
    sink.answer_next(Answer(status=422))

    assert receipts.process([sqs_record("r", receipt_body("1"))]) == {"batchItemFailures": []}

    (letter,) = receipts.dead_letters()
    assert (letter.error_type, letter.error_message) == (ErrorType.WEBHOOK_REJECTED, "HTTP 422")


@pytest.mark.parametrize("url", ["http://example.com/receipts", "ftp://127.0.0.1/receipts", "https:///no-host"])
def test_a_plain_http_or_odd_url_beyond_loopback_is_refused_at_start(
    dynamodb: Any, sqs: Any, clock: Clock, url: str
) -> None:
    with pytest.raises(ConfigurationError, match="RECEIPT_WEBHOOK_URL must"):
        make_consumer(dynamodb, sqs, clock, webhook_url=url)


# -- signing (Standard Webhooks) -------------------------------------------------------------------

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


def _secret(value: str) -> str:
    """A Secrets Manager secret holding ``value``: its ARN."""
    return str(boto3.client("secretsmanager").create_secret(Name="webhook-signing", SecretString=value)["ARN"])


def _verified(request: ReceivedRequest, secret: str) -> bool:
    """What a receiver does with the Standard Webhooks headers and the raw body."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.{request.body}".encode()
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return hmac.compare_digest(expected, request.headers["webhook-signature"])


def test_a_signed_call_verifies_with_the_secret_and_not_with_another(
    dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink
) -> None:
    consumer = make_consumer(dynamodb, sqs, clock, webhook_url=sink.receipts_url, webhook_secret_arn=_secret(SECRET))

    assert consumer.failed_ids([sqs_record("r", receipt_body("1", key="заказ-1"))]) == []

    (request,) = sink.received()
    assert _verified(request, SECRET)
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 60
    assert not _verified(request, "whsec_" + base64.b64encode(bytes(32)).decode())
    tampered = replace(request, body=request.body.replace('"1"', '"2"'))
    assert not _verified(tampered, SECRET)


@pytest.mark.parametrize(
    ("stored", "said"),
    [(None, "cannot be read"), ("not-a-whsec-secret", "not a Standard Webhooks secret"), ("whsec_c2hvcnQ=", "bytes")],
)
def test_a_missing_or_malformed_secret_sends_nothing_unsigned_and_keeps_the_message(
    dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink, stored: str | None, said: str
) -> None:
    arn = _secret(stored) if stored else "arn:aws:secretsmanager:us-east-1:123456789012:secret:absent-AbCdEf"
    consumer = make_consumer(dynamodb, sqs, clock, webhook_url=sink.receipts_url, webhook_secret_arn=arn)

    (result,) = consumer.batch.process([sqs_record("r", receipt_body("1"))], consumer.remaining).results

    assert result.outcome.is_failure and said in (result.reason or ""), result
    assert sink.received() == []
    assert consumer.dead_letters() == []
    assert ledger_entries(consumer.dynamodb, "acc-1") == []


def test_a_webhook_beyond_loopback_without_a_secret_is_refused_at_start(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    with pytest.raises(ConfigurationError, match="RECEIPT_WEBHOOK_URL beyond loopback needs a signing key"):
        make_consumer(dynamodb, sqs, clock, webhook_url="https://receipts.example.com/hook")
