"""Webhook signing as the reference ``standardwebhooks`` library verifies it, and the client's hardening.

Every case the project sends is verified by the reference, not by our own HMAC: keys with CR/LF
and emoji, 900 KB bodies, retries, a rotated secret (two signatures). The secret lives in moto's
Secrets Manager in process and is read through ``SigningKey`` as the function reads it.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any, ClassVar

import boto3
import pytest
from pydantic import BaseModel
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from consumer.errors import ConfigurationError, ErrorType, PoisonMessage, TransientError
from consumer.handler import Effect, MessageContext, MessageHandler, Mode
from consumer.webhook import SECRET_MAX_AGE_S, SigningKey, WebhookClient, signing_key
from testkit.dead_letters import reasons
from testkit.lambda_sqs import sqs_record
from testkit.webhook import Answer, ReceivedRequest, WebhookSink
from tests.core.unit.conftest import Clock, make_consumer
from tests.utils import settings_for_tests

KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
DEADLINE_S = 5.0


def secret_arn(value: str, name: str = "webhook-signing") -> str:
    return str(boto3.client("secretsmanager").create_secret(Name=name, SecretString=value)["ARN"])


def rotate(arn: str, value: str) -> None:
    """What a rotation leaves: ``value`` as AWSCURRENT, the value before it as AWSPREVIOUS."""
    boto3.client("secretsmanager").put_secret_value(SecretId=arn, SecretString=value)


def verifies(request: ReceivedRequest, secret: str) -> bool:
    try:
        Webhook(secret).verify(request.body, request.headers, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


def new_secret(size: int, fill: int) -> str:
    return "whsec_" + base64.b64encode(bytes([fill]) * size).decode()


@pytest.fixture
def sink() -> Any:
    with WebhookSink() as running:
        yield running


# -- what the project sends, verified by the reference ----------------------------------------------


@pytest.mark.parametrize(
    ("key", "body"),
    [
        pytest.param("order-17:line.2_a", b'{"receiptId":"r-1"}', id="plain-key"),
        pytest.param("line\r\nbreak", b'{"receiptId":"r-2"}', id="key-with-cr-lf"),
        pytest.param("k-\U0001f600-\u00e9", '{"note":"\U0001f600 caf\u00e9"}'.encode(), id="emoji-key-and-body"),
        pytest.param(
            "k-large", json.dumps({"note": "\U0001f600" * 225_000}, ensure_ascii=False).encode(), id="900-kb-body"
        ),
    ],
)
def test_every_call_verifies_with_the_reference_library(aws: None, sink: WebhookSink, key: str, body: bytes) -> None:
    client = WebhookClient(sink.url, signing_key=SigningKey(secret_arn(SECRET)))

    assert client.post(body, key, DEADLINE_S).status == 200

    (request,) = sink.received()
    assert request.body.encode() == body
    assert verifies(request, SECRET)
    assert not verifies(request, new_secret(32, 7))


def test_each_retry_is_signed_for_its_own_timestamp_with_the_same_webhook_id(aws: None, sink: WebhookSink) -> None:
    times = iter([time.time(), time.time() + 60])
    client = WebhookClient(sink.url, signing_key=SigningKey(secret_arn(SECRET)), clock=lambda: next(times))
    sink.answer_next(Answer(503))

    with pytest.raises(TransientError, match="503"):
        client.post(b'{"n":1}', "k-retry", DEADLINE_S)
    assert client.post(b'{"n":1}', "k-retry", DEADLINE_S).status == 200

    first, second = sink.received()
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == "k-retry"
    assert first.headers["webhook-timestamp"] != second.headers["webhook-timestamp"]
    assert verifies(first, SECRET) and verifies(second, SECRET)


# -- rotation: the previous secret signs too, and the secret is read again -------------------------


def test_after_a_rotation_a_call_verifies_with_the_new_secret_and_with_the_old(aws: None, sink: WebhookSink) -> None:
    arn = secret_arn(SECRET)
    rotate(arn, new_secret(32, 9))
    client = WebhookClient(sink.url, signing_key=SigningKey(arn))

    client.post(b'{"n":1}', "k-rotated", DEADLINE_S)

    (request,) = sink.received()
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    assert verifies(request, new_secret(32, 9))
    assert verifies(request, SECRET)


def test_a_secret_never_rotated_signs_once(aws: None) -> None:
    assert SigningKey(secret_arn(SECRET))() == (KEY,)


def test_a_malformed_previous_value_signs_nothing_and_stops_nothing(aws: None) -> None:
    arn = secret_arn("whsec_not base64!")
    rotate(arn, SECRET)

    assert SigningKey(arn)() == (KEY,)


def test_the_secret_is_read_again_once_its_max_age_has_passed(aws: None, clock: Clock) -> None:
    arn = secret_arn(SECRET)
    key = SigningKey(arn, clock=clock)
    assert key() == (KEY,)

    rotate(arn, new_secret(32, 9))
    clock.advance(SECRET_MAX_AGE_S - 1)
    assert key() == (KEY,)  # kept until its age is up
    clock.advance(1)
    assert key() == (bytes([9]) * 32, KEY)


def test_a_secret_that_cannot_be_read_again_stops_the_call(aws: None, clock: Clock) -> None:
    arn = secret_arn(SECRET)
    key = SigningKey(arn, clock=clock)
    key()
    boto3.client("secretsmanager").delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    clock.advance(SECRET_MAX_AGE_S)

    with pytest.raises(ConfigurationError, match="cannot be read"):
        key()


# -- the secret's text, as the reference reads it --------------------------------------------------


def test_a_64_byte_key_as_the_base64_command_prints_it_is_read_as_the_reference_reads_it() -> None:
    key = bytes(range(64))
    # What `head -c 64 /dev/urandom | base64` prints: 76 columns, then the rest on a second line.
    secret = "whsec_" + base64.encodebytes(key).decode()
    assert "\n" in secret.strip()

    assert signing_key(secret, "s") == key == Webhook(secret)._whsecret


@pytest.mark.parametrize(
    "key", [pytest.param(bytes(range(32)), id="unpadded-32"), pytest.param(bytes(range(100)), id="100-bytes")]
)
def test_unpadded_base64_and_keys_over_64_bytes_are_accepted_as_the_reference_accepts_them(key: bytes) -> None:
    secret = "whsec_" + base64.b64encode(key).decode().rstrip("=")

    assert signing_key(secret, "s") == key == Webhook(secret)._whsecret


@pytest.mark.parametrize("secret", ["whsec_AAAA*AAAA", "whsec_" + "A" * 33, "AAAA" * 11])
def test_a_secret_that_is_not_base64_after_whsec_is_still_refused(secret: str) -> None:
    with pytest.raises(ConfigurationError, match="not a Standard Webhooks secret"):
        signing_key(secret, "s")


# -- headers a caller adds ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["webhook-signature", "WEBHOOK-SIGNATURE", "Webhook-Id", "idempotency-key"])
def test_a_caller_cannot_send_a_header_of_ours_in_any_case(aws: None, sink: WebhookSink, name: str) -> None:
    client = WebhookClient(sink.url, signing_key=SigningKey(secret_arn(SECRET)))

    with pytest.raises(ConfigurationError, match=f"header {name} is set by WebhookClient"):
        client.post(b"{}", "k", DEADLINE_S, headers={name: "v1,forged"})
    assert sink.received() == []


@pytest.mark.parametrize("value", ["t-1\r\nX-Injected: 1", "t-1\n", "t-1\x00", "t-\u20ac"])
def test_a_header_value_http_cannot_carry_is_poison_that_never_quotes_it(sink: WebhookSink, value: str) -> None:
    with pytest.raises(PoisonMessage) as raised:
        WebhookClient(sink.url).post(b"{}", "k", DEADLINE_S, headers={"X-Tenant": value})

    assert raised.value.error_type is ErrorType.WEBHOOK_REJECTED
    assert "header X-Tenant" in str(raised.value) and value not in str(raised.value)
    assert sink.received() == []


def test_a_callers_own_header_goes_beside_ours(sink: WebhookSink) -> None:
    WebhookClient(sink.url).post(b"{}", "k", DEADLINE_S, headers={"X-Tenant": "t-1"})

    (request,) = sink.received()
    assert request.headers["X-Tenant"] == "t-1"
    assert request.headers["Idempotency-Key"] == "k"


# -- the processor: a bad header and a long reason, each a bounded dead letter ------------------------


class Probe(BaseModel):
    tenant: str = "t-1"
    reason: str | None = None


class ProbeHandler(MessageHandler[Probe]):
    """Lock mode: raises the reason it is given, or posts with the tenant as a header."""

    event_type: ClassVar[str] = "Probe"
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = Probe

    def __init__(self, client: WebhookClient) -> None:
        super().__init__(settings_for_tests())
        self.client = client

    def handle(self, payload: Probe, context: MessageContext) -> Effect:
        if payload.reason is not None:
            raise PoisonMessage(ErrorType.BUSINESS_CONDITION_FAILED, payload.reason)
        self.client.post(b"{}", context.idempotency_key, DEADLINE_S, headers={"X-Tenant": payload.tenant})
        return Effect("posted")


def probe_record(message_id: str, **payload: str) -> dict[str, Any]:
    body = {"eventType": "Probe", "metadata": {"idempotencyKey": message_id}, "payload": payload}
    return sqs_record(message_id, json.dumps(body))


def test_a_header_value_from_the_message_dead_letters_it_without_the_value_in_the_log(
    dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers={"Probe": ProbeHandler(WebhookClient(sink.url))})

    with caplog.at_level(logging.INFO):
        response = consumer.process([probe_record("bad", tenant="t\r\nX-Injected: secret-ish")])

    assert response == {"batchItemFailures": []}
    assert reasons(consumer.dead_letters()) == {"bad": ErrorType.WEBHOOK_REJECTED.value}
    assert not any("X-Injected" in str(value) for record in caplog.records for value in vars(record).values())
    assert sink.received() == []


def test_the_dead_lettered_log_line_bounds_its_reason_as_the_dlq_copy_does(
    dynamodb: Any, sqs: Any, clock: Clock, sink: WebhookSink, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers={"Probe": ProbeHandler(WebhookClient(sink.url))})

    with caplog.at_level(logging.WARNING):
        consumer.process([probe_record("long", reason="field " + "f" * 900_000)])

    (reason,) = [getattr(record, "reason", "") for record in caplog.records if record.getMessage() == "dead-lettered"]
    assert reason.startswith("field fff")
    assert len(reason) <= 1_000
    (letter,) = consumer.dead_letters()
    assert len(letter.error_message or "") <= 1_000
