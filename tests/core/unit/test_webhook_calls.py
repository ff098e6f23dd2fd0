"""A lock-mode webhook call through the whole consumer (the test CallHandler): redirects, a trickling server,
any key, status mapping, signing."""

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

from consumer.errors import ErrorType
from consumer.webhook import SigningKey, header_key
from testkit.lambda_sqs import sqs_record
from testkit.webhook import Answer, ReceivedRequest, WebhookSink
from tests.core.handlers import CALL_EVENT, CallHandler, call_body, recorded_call
from tests.core.unit.conftest import CALLS, Clock, Consumer, make_consumer
from tests.utils import settings_for_tests


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    with WebhookSink() as running:
        yield running


@pytest.fixture
def calls(dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink) -> Consumer:
    return make_consumer(dynamodb, sqs, clock, webhook_url=f"{sink.url}/calls", webhook_timeout_ms=1_000)


def test_a_redirect_is_not_followed_and_the_message_is_dead_lettered_with_the_reason(
    calls: Consumer, sink: WebhookSink
) -> None:
    sink.answer_next(Answer(status=302))

    assert calls.process([sqs_record("r", call_body("1"))]) == {"batchItemFailures": []}

    (letter,) = calls.dead_letters()
    assert letter.error_type == ErrorType.WEBHOOK_REJECTED
    assert letter.error_message == "HTTP 302: redirect not followed"
    assert [request.path for request in sink.received()] == ["/calls"]
    assert recorded_call(calls.dynamodb, CALLS, "1") is None


def test_a_trickling_server_cannot_hold_the_call_past_its_deadline(calls: Consumer, sink: WebhookSink) -> None:
    # Every byte comes within the 1 s timeout; the whole answer would take about 3 s.
    sink.answer_next(Answer(trickle_s=0.06))

    started = time.monotonic()
    failed = calls.failed_ids([sqs_record("r", call_body("1"))])
    held_s = time.monotonic() - started

    assert failed == ["r"]
    assert held_s < 1.8
    assert recorded_call(calls.dynamodb, CALLS, "1") is None


@pytest.mark.parametrize("key", ["заказ-1", "🧾 call", "line\r\nInjected: yes", 'a%41"\\ b'])
def test_every_key_the_envelope_accepts_reaches_the_webhook_the_same_on_every_try(
    calls: Consumer, sink: WebhookSink, key: str
) -> None:
    sink.answer_next(Answer(status=503))
    record = sqs_record("r", call_body("1", key=key))

    assert calls.failed_ids([record]) == ["r"]
    assert calls.failed_ids([record]) == []

    sent = header_key(key)
    assert sent.isascii()
    assert sink.keys() == [sent, sent]
    assert [request.headers["webhook-id"] for request in sink.received()] == [sent, sent]
    call = recorded_call(calls.dynamodb, CALLS, "1")
    assert call is not None and call["idempotencyKey"]["S"] == key
    assert calls.dead_letters() == []


def test_a_rejection_is_dead_lettered_without_the_response_body(calls: Consumer, sink: WebhookSink) -> None:
    sink.answer_next(Answer(status=422))

    assert calls.process([sqs_record("r", call_body("1"))]) == {"batchItemFailures": []}

    (letter,) = calls.dead_letters()
    assert (letter.error_type, letter.error_message) == (ErrorType.WEBHOOK_REJECTED, "HTTP 422")


# -- signing (Standard Webhooks) -------------------------------------------------------------------

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


def _secret(value: str) -> str:
    """A Secrets Manager secret holding ``value``: its ARN."""
    return str(boto3.client("secretsmanager").create_secret(Name="webhook-signing", SecretString=value)["ARN"])


def signed_calls(sink: WebhookSink, secret_arn: str) -> dict[str, Any]:
    """The call handler signing with the secret named by ``secret_arn``."""
    return {CALL_EVENT: CallHandler(settings_for_tests(), f"{sink.url}/calls", signing_key=SigningKey(secret_arn))}


def _verified(request: ReceivedRequest, secret: str) -> bool:
    """What a receiver does with the Standard Webhooks headers and the raw body."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{request.headers['webhook-id']}.{request.headers['webhook-timestamp']}.{request.body}".encode()
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return hmac.compare_digest(expected, request.headers["webhook-signature"])


def test_a_signed_call_verifies_with_the_secret_and_not_with_another(
    dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink
) -> None:
    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers=signed_calls(sink, _secret(SECRET)))

    assert consumer.failed_ids([sqs_record("r", call_body("1", key="заказ-1"))]) == []

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
    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers=signed_calls(sink, arn))

    (result,) = consumer.batch.process([sqs_record("r", call_body("1"))], consumer.remaining).results

    assert result.outcome.is_failure and said in (result.reason or ""), result
    assert sink.received() == []
    assert consumer.dead_letters() == []
    assert recorded_call(consumer.dynamodb, CALLS, "1") is None
