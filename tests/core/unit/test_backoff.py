"""Retried records come back when a retry can succeed, not after the full visibility timeout."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from consumer.backoff import VisibilityBackoff, queue_url_from_arn
from consumer.batch import BatchRunner
from consumer.envelope import payload_hash
from consumer.idempotency import Claimed
from consumer.idempotency.observer import Tally
from consumer.outcome import MessageResult, Outcome
from testkit.lambda_sqs import record_from_message
from tests.core.handlers import CALL_EVENT, call_body, tally_body
from tests.core.unit.conftest import Clock, Consumer, make_consumer
from tests.kit import Remaining

QUEUE = "consumer-queue"


@pytest.fixture
def backoff(sqs: Any, clock: Clock) -> VisibilityBackoff:
    return VisibilityBackoff(
        lambda: sqs, base_seconds=2, max_seconds=300, logger=logging.getLogger("test"), clock=clock
    )


@pytest.mark.parametrize(("receive_count", "expected"), [(1, 2), (2, 4), (4, 16), (9, 300), (40, 300)])
def test_transient_failures_back_off_exponentially_by_receive_count(
    backoff: VisibilityBackoff, receive_count: int, expected: int
) -> None:
    result = MessageResult("m", Outcome.RETRIED, "throttled")

    assert backoff.delay_seconds(result, receive_count) == expected


def test_a_record_in_flight_elsewhere_returns_at_the_lease_end_or_the_backoff(
    backoff: VisibilityBackoff, clock: Clock
) -> None:
    lease_end_ms = int(clock.now * 1000) + 12_300

    def delay(retry_at_ms: int, receive_count: int) -> int:
        return backoff.delay_seconds(MessageResult("m", Outcome.IN_FLIGHT, retry_at_ms=retry_at_ms), receive_count)

    assert delay(lease_end_ms, 1) == 2  # the owner usually finishes long before its lease ends
    assert delay(lease_end_ms, 4) == 13  # never later than the lease end
    assert delay(lease_end_ms - 60_000, 4) == 0  # the lease already ran out


def test_queue_urls_are_derived_from_the_event_source_arn() -> None:
    assert (
        queue_url_from_arn("arn:aws:sqs:eu-west-1:123456789012:orders.fifo")
        == "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo"
    )
    with pytest.raises(ValueError, match="not an SQS queue ARN"):
        queue_url_from_arn("arn:aws:sns:eu-west-1:123456789012:topic")


def received(
    sqs: Any, count: int, visibility_timeout: int = 300, body: Callable[[int], str] = lambda i: tally_body(f"e-{i}")
) -> tuple[str, list[dict[str, Any]]]:
    """Send ``count`` messages (tally entries by default), receive them as Lambda would (real receipt handles)."""
    attributes = {"VisibilityTimeout": str(visibility_timeout)}
    url = sqs.create_queue(QueueName=QUEUE, Attributes=attributes)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for i in range(count):
        sqs.send_message(QueueUrl=url, MessageBody=body(i))
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    return url, [record_from_message(message, queue_arn=arn) for message in messages]


def visible(sqs: Any, url: str) -> set[str]:
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0).get("Messages", [])
    return {message["MessageId"] for message in messages}


def with_backoff(consumer: Consumer, backoff: VisibilityBackoff) -> BatchRunner:
    # The store reports its grouping to the consumer's own tally: this runner's reads nothing of it.
    return BatchRunner(
        consumer.batch._processor, max_workers=1, deadline_margin_ms=3_000, backoff=backoff, tally=Tally()
    )


def test_unstarted_records_are_made_visible_again_at_once(
    dynamodb: Any, sqs: Any, clock: Clock, backoff: VisibilityBackoff
) -> None:
    url, records = received(sqs, 3)
    batch = with_backoff(make_consumer(dynamodb, sqs, clock), backoff)

    response = batch.process(records, Remaining(100)).response()

    assert len(response["batchItemFailures"]) == 3
    assert visible(sqs, url) == {record["messageId"] for record in records}


def test_a_record_in_flight_elsewhere_is_hidden_for_its_backoff(dynamodb: Any, sqs: Any) -> None:
    # A queue whose visibility timeout is 0 would hand the record out again at once;
    # the backoff hides it for a while. The queue runs on real time, so the consumer
    # does too here.
    # A call (lock mode): its key can be held by another worker's claim.
    url, records = received(sqs, 1, visibility_timeout=0, body=lambda i: call_body(str(i)))
    wall_clock = Clock(time.time())
    consumer = make_consumer(dynamodb, sqs, wall_clock)
    busy = consumer.store.claim(f"{CALL_EVENT}#call-0", _hash(records[0]["body"]), 120_000)
    assert isinstance(busy, Claimed)
    backoff = VisibilityBackoff(
        lambda: sqs, base_seconds=2, max_seconds=300, logger=logging.getLogger("test"), clock=wall_clock
    )
    batch = with_backoff(consumer, backoff)

    response = batch.process(records, Remaining()).response()

    assert response["batchItemFailures"] == [{"itemIdentifier": records[0]["messageId"]}]
    assert visible(sqs, url) == set()


def test_a_failed_visibility_change_never_fails_the_batch(
    dynamodb: Any, sqs: Any, clock: Clock, backoff: VisibilityBackoff, caplog: pytest.LogCaptureFixture
) -> None:
    _, records = received(sqs, 1)
    records[0]["eventSourceARN"] = "arn:aws:sqs:us-east-1:123456789012:deleted-queue"
    batch = with_backoff(make_consumer(dynamodb, sqs, clock), backoff)

    with caplog.at_level(logging.WARNING):
        response = batch.process(records, Remaining(100)).response()

    assert len(response["batchItemFailures"]) == 1
    assert "visibility backoff not applied" in caplog.text


def _hash(body: str) -> str:
    return payload_hash(json.loads(body)["payload"])
