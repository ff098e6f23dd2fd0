"""What a 2xx answer gives a lock-mode handler: its status, headers and body, bounded, within the call's deadline."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from consumer.errors import ConfigurationError, ErrorType, PoisonMessage, TransientError
from consumer.webhook import WebhookClient, WebhookResponse
from testkit.webhook import Answer, WebhookSink, answer_id


@pytest.fixture
def sink() -> Iterator[WebhookSink]:
    with WebhookSink() as running:
        yield running


def test_a_2xx_answer_gives_its_status_headers_and_body(sink: WebhookSink) -> None:
    sink.answer_next(Answer(status=201, body={"labelId": "lbl-7", "carrier": "dhl"}))

    answer = WebhookClient(f"{sink.url}/labels").post(b"{}", "label-1", 5)

    assert answer.status == 201
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"labelId": "lbl-7", "carrier": "dhl"}
    assert int(answer.headers["content-length"]) == len(answer.body)


def test_an_idempotent_api_answers_the_same_id_for_the_same_key(sink: WebhookSink) -> None:
    client = WebhookClient(f"{sink.url}/charges")

    first, again = (client.post(b"{}", "charge-1", 5).json()["id"] for _ in range(2))

    assert first == again == answer_id("charge-1")
    assert client.post(b"{}", "charge-2", 5).json()["id"] != first


def test_an_answer_past_the_bound_is_an_error_in_its_own_words_never_cut(sink: WebhookSink) -> None:
    sink.answer_next(Answer(body="x" * 2_000))

    with pytest.raises(PoisonMessage) as refused:
        WebhookClient(sink.url, max_answer_bytes=1_000).post(b"{}", "big", 5)

    assert refused.value.error_type == ErrorType.WEBHOOK_ANSWER_UNREADABLE
    assert "over the client's 1000 bytes" in refused.value.message


def test_an_answer_at_the_bound_is_read_whole(sink: WebhookSink) -> None:
    document = "x" * 998  # with its quotes, 1,000 bytes of JSON
    sink.answer_next(Answer(body=document))

    assert WebhookClient(sink.url, max_answer_bytes=1_000).post(b"{}", "edge", 5).json() == document


def test_an_answer_that_is_not_json_is_an_error_only_when_read_as_json_and_never_quoted() -> None:
    answer = WebhookResponse(200, {}, b"<html>secret-token</html>")

    assert answer.body == b"<html>secret-token</html>"
    with pytest.raises(PoisonMessage) as refused:
        answer.json()
    assert refused.value.error_type == ErrorType.WEBHOOK_ANSWER_UNREADABLE
    assert "secret-token" not in refused.value.message


def test_a_body_that_trickles_past_the_deadline_ends_the_call_at_it(sink: WebhookSink) -> None:
    # Status and headers arrive at once; the body's bytes one every 0.1 s, about 3 s in all against a 1 s deadline.
    sink.answer_next(Answer(body="y" * 30, trickle_s=0.1, trickle_body_only=True))

    started = time.monotonic()
    with pytest.raises(TransientError, match="deadline"):
        WebhookClient(sink.url).post(b"{}", "slow", 1.0)

    assert time.monotonic() - started < 1.8


def test_a_negative_bound_is_refused_at_start() -> None:
    with pytest.raises(ConfigurationError, match="max_answer_bytes must be 0 or more"):
        WebhookClient("http://127.0.0.1:9/x", "CARRIER_API_URL", max_answer_bytes=-1)
