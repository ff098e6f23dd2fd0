"""Transaction conflicts: retried in process, counted apart, never a second external call.

The conflicts are injected on the wire as DynamoDB answers them (a cancelled
transaction with ``TransactionConflict`` at an item's index, or
``TransactionConflictException`` on a single-item write), through the function's own
assembly. That the local stack produces them under real contention is proven on
DynamoDB Local behind the conflict emulation, not here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from botocore.stub import Stubber

from consumer.batch import _lanes
from consumer.conflicts import ConflictRetry
from consumer.errors import TransactionConflict
from consumer.idempotency import Conflicted, IdempotencyStore
from consumer.idempotency.record import Status
from consumer.outcome import Outcome
from consumer.prepared import Prepared
from testkit.lambda_sqs import FIFO_QUEUE_ARN, REGION, sqs_record
from testkit.webhook import WebhookSink
from tests.core.handlers import call_body, tally_body
from tests.core.unit.conftest import Clock, Consumer, make_consumer, total
from tests.kit import Remaining
from tests.utils import lines_run, offline_dynamodb


class Conflicts:
    """Answers the next ``count`` calls of ``operation`` with a transaction conflict instead of sending them."""

    def __init__(self, session: boto3.session.Session, operation: str, count: int) -> None:
        self.left = count
        self.operation = operation
        # botocore's stubs type every handler as returning None; a before-call handler may answer instead.
        session.events.register(f"before-call.dynamodb.{operation}", self._answer)  # type: ignore[arg-type]

    def _answer(self, params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        if self.left <= 0:
            return None
        self.left -= 1
        # As botocore's parser answers: the error and the response's metadata.
        answer: dict[str, Any] = {"ResponseMetadata": {"HTTPStatusCode": 400}}
        if self.operation == "TransactWriteItems":
            reasons = [{"Code": "None"}] * len(json.loads(params["body"])["TransactItems"])
            reasons[1] = {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
            answer["CancellationReasons"] = reasons
            answer["Error"] = {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"}
        else:
            answer["Error"] = {"Code": "TransactionConflictException", "Message": "Transaction is ongoing for the item"}
        return AWSResponse("", 400, HTTPHeaders(), None), answer


@pytest.fixture
def session(aws: None) -> boto3.session.Session:
    return boto3.session.Session(region_name=REGION)


def retry_policy() -> ConflictRetry:
    return ConflictRetry(base_ms=1, max_ms=4, margin_ms=1_000, sleep=lambda _: None)


@dataclass(frozen=True)
class Alone:
    """One message's batch: its outcome, and the conflicts the store's observer heard absorbed."""

    outcome: Outcome
    conflicts_absorbed: int
    retry_at_ms: int | None


def result_of(consumer: Consumer, record: dict[str, Any]) -> Alone:
    batch = consumer.batch.process([record], consumer.remaining)
    (result,) = batch.results
    return Alone(result.outcome, batch.conflicts_absorbed(), result.retry_at_ms)


# -- the retry policy ----------------------------------------------------------------------------


# Sixty: a hot item under several consumers, where handing the message back would cost a visibility timeout and a
# receive towards its redrive limit; no fixed number of tries is given.
@pytest.mark.parametrize("conflicts", [2, 60])
def test_a_conflicted_write_is_repeated_while_time_is_left_until_it_goes_through_and_the_retries_are_counted(
    conflicts: int,
) -> None:
    answers: list[Exception | str] = [*(TransactionConflict(str(n)) for n in range(conflicts)), "done"]

    def write() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert retry_policy().run(write, lambda: 30_000) == ("done", conflicts)


def test_the_last_conflict_is_answered_when_the_next_wait_would_end_inside_the_margin() -> None:
    calls: list[int] = []

    def write() -> None:
        calls.append(1)
        raise TransactionConflict("held")

    remaining = Remaining(5_000, then=[5_000, 5_000, 900])
    last, absorbed = retry_policy().run(write, remaining)
    assert isinstance(last, TransactionConflict)
    assert absorbed == 2
    assert len(calls) == 3


def test_waits_grow_exponentially_with_full_jitter_and_stop_at_the_cap() -> None:
    waits: list[float] = []
    policy = ConflictRetry(base_ms=10, max_ms=50, margin_ms=0, sleep=waits.append, jitter=lambda: 1.0)

    def write() -> None:
        raise TransactionConflict("held")

    last, _ = policy.run(write, Remaining(30_000, then=[30_000] * 5 + [0]))
    assert isinstance(last, TransactionConflict)
    assert waits == [0.01, 0.02, 0.04, 0.05, 0.05]


# -- the store's use of it -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "remaining"),
    [(None, lambda: 30_000), (retry_policy(), None)],
    ids=["no-policy", "no-time-given"],
)
def test_without_a_policy_or_a_time_to_bound_it_a_conflict_is_tried_once_and_answered_as_conflicted(
    policy: ConflictRetry | None, remaining: Any
) -> None:
    client = offline_dynamodb()
    store = IdempotencyStore(client, "records", ttl_seconds=60, conflicts=policy)
    with Stubber(client) as stub:
        stub.add_client_error("update_item", service_error_code="TransactionConflictException", http_status_code=400)
        conflicted = store.claim("Ev#k-1", "hash", lease_ms=30_000, remaining_ms=remaining)
        stub.assert_no_pending_responses()
    assert isinstance(conflicted, Conflicted)
    assert conflicted.conflicts_absorbed == 0
    assert conflicted.reason.startswith("DynamoDB TransactionConflictException")


# -- through the function's assembly ------------------------------------------------------------


def test_an_optimistic_message_that_meets_conflicts_is_applied_once_in_the_same_invocation(
    dynamodb: Any, sqs: Any, clock: Clock, session: boto3.session.Session
) -> None:
    Conflicts(session, "TransactWriteItems", 3)
    consumer = make_consumer(dynamodb, sqs, clock, session=session)

    result = result_of(consumer, sqs_record("m", tally_body("p-1")))

    assert (result.outcome, result.conflicts_absorbed) == (Outcome.APPLIED, 3)
    assert total(dynamodb, "t-1") == 1250


def test_an_optimistic_message_that_meets_conflicts_for_long_is_applied_once_in_the_same_invocation(
    dynamodb: Any, sqs: Any, clock: Clock, session: boto3.session.Session
) -> None:
    # Forty conflicts: more than any fixed number of tries a policy would have given it.
    Conflicts(session, "TransactWriteItems", 40)
    consumer = make_consumer(dynamodb, sqs, clock, session=session, conflict_retry_base_ms=1, conflict_retry_max_ms=1)

    result = result_of(consumer, sqs_record("m", tally_body("p-1")))

    assert (result.outcome, result.conflicts_absorbed) == (Outcome.APPLIED, 40)
    assert total(dynamodb, "t-1") == 1250


def test_an_optimistic_message_still_in_conflict_when_its_time_runs_out_is_its_own_outcome_and_comes_back_soon(
    dynamodb: Any, sqs: Any, clock: Clock, session: boto3.session.Session
) -> None:
    Conflicts(session, "TransactWriteItems", 1_000)
    consumer = make_consumer(dynamodb, sqs, clock, session=session, conflict_retry_base_ms=1, conflict_retry_max_ms=1)
    # Started with time left; the fourth conflict finds the invocation inside its margin.
    consumer.remaining = Remaining(30_000, then=[30_000] * 4 + [1_000])

    result = result_of(consumer, sqs_record("m", tally_body("p-1")))

    assert result.outcome is Outcome.CONFLICT
    assert result.outcome.is_failure
    assert result.conflicts_absorbed == 3
    # Back after at most a second, not after the transient-error backoff.
    assert result.retry_at_ms is not None
    assert 0 <= result.retry_at_ms - clock() * 1000 < 1_000
    assert total(dynamodb, "t-1") == 0


def test_a_lock_message_whose_commit_conflicts_is_committed_without_a_second_webhook_call(
    dynamodb: Any, sqs: Any, clock: Clock, session: boto3.session.Session, webhook: WebhookSink
) -> None:
    Conflicts(session, "TransactWriteItems", 5)
    consumer = make_consumer(dynamodb, sqs, clock, session=session, webhook_url=f"{webhook.url}/calls")

    result = result_of(consumer, sqs_record("r", call_body("1")))

    assert (result.outcome, result.conflicts_absorbed) == (Outcome.APPLIED, 5)
    assert webhook.keys() == ["call-1"]


def test_a_lock_message_whose_commit_stays_in_conflict_keeps_its_claim_so_a_redelivery_cannot_call_again(
    dynamodb: Any, sqs: Any, clock: Clock, session: boto3.session.Session, webhook: WebhookSink
) -> None:
    conflicts = Conflicts(session, "TransactWriteItems", 10_000)
    consumer = make_consumer(dynamodb, sqs, clock, session=session, webhook_url=f"{webhook.url}/calls")
    consumer.remaining = Remaining(30_000, then=[30_000, 30_000, 30_000, *[30_000] * 20, 1_000])

    first = result_of(consumer, sqs_record("r", call_body("1")))
    conflicts.left = 0
    consumer.remaining = Remaining(30_000)
    again = result_of(consumer, sqs_record("r2", call_body("1")))

    assert first.outcome is Outcome.CONFLICT
    # Not released: the redelivery finds the claim in flight and does not call.
    assert again.outcome is Outcome.IN_FLIGHT
    assert webhook.keys() == ["call-1"]
    record = consumer.store.get("CallRequested#call-1")
    assert record is not None and record.status is Status.IN_PROGRESS


def test_a_claim_refused_by_a_conflict_is_retried(
    dynamodb: Any, sqs: Any, clock: Clock, session: boto3.session.Session, webhook: WebhookSink
) -> None:
    Conflicts(session, "UpdateItem", 2)
    consumer = make_consumer(dynamodb, sqs, clock, session=session, webhook_url=f"{webhook.url}/calls")

    result = result_of(consumer, sqs_record("r", call_body("1")))

    assert (result.outcome, result.conflicts_absorbed) == (Outcome.APPLIED, 2)
    assert webhook.keys() == ["call-1"]


# -- lanes ----------------------------------------------------------------------------------------


def prepared(consumer: Consumer, records: list[dict[str, Any]]) -> list[Prepared]:
    return [consumer.batch._processor.prepare(record) for record in records]


def test_messages_to_one_tally_share_a_lane_and_other_tallies_run_beside_them(consumer: Consumer) -> None:
    records = [
        sqs_record("a1", tally_body("p-1", tally_id="hot")),
        sqs_record("b1", tally_body("p-2", tally_id="cold")),
        sqs_record("a2", tally_body("p-3", tally_id="hot")),
        sqs_record("bad", "{oops"),
        sqs_record("a3", tally_body("p-4", tally_id="hot")),
    ]

    lanes = _lanes(prepared(consumer, records), fifo=False)

    assert sorted(lanes) == [[0, 2, 4], [1], [3]]


def test_a_shared_key_and_a_shared_tally_join_lanes_transitively(consumer: Consumer) -> None:
    records = [
        sqs_record("x", tally_body("p-1", tally_id="t-a", key="k-1")),
        sqs_record("y", tally_body("p-2", tally_id="t-b", key="k-2")),
        # Same key as x, same tally as y: x, y and z must not run concurrently.
        sqs_record("z", json.dumps({**json.loads(tally_body("p-1", tally_id="t-b", key="k-1"))})),
    ]

    lanes = _lanes(prepared(consumer, records), fifo=False)

    assert lanes == [[0, 1, 2]]


def test_a_message_joining_a_lane_brings_its_own_keys_to_it(consumer: Consumer) -> None:
    records = [
        sqs_record("x", tally_body("p-1", tally_id="t-a", key="k-1")),
        # Joins x's lane by its key, and brings its tally t-b with it...
        sqs_record("y", json.dumps({**json.loads(tally_body("p-1", tally_id="t-b", key="k-1"))})),
        # ...so that a message to t-b, under a key of its own, waits in the same lane.
        sqs_record("z", tally_body("p-3", tally_id="t-b", key="k-3")),
    ]

    lanes = _lanes(prepared(consumer, records), fifo=False)

    assert lanes == [[0, 1, 2]]


def test_on_a_fifo_queue_a_message_without_a_group_is_a_lane_of_its_own(consumer: Consumer) -> None:
    # Only a malformed record lacks its group; it must not join any group's lane, whatever the group is called.
    records = [
        sqs_record(name, tally_body(f"p-{name}"), group_id=name, queue_arn=FIFO_QUEUE_ARN) for name in ("A", "XXXX")
    ]
    records.append(sqs_record("no-group", tally_body("p-none"), queue_arn=FIFO_QUEUE_ARN))

    lanes = _lanes(prepared(consumer, records), fifo=True)

    assert sorted(lanes) == [[0], [1], [2]]


def test_grouping_a_batch_into_lanes_is_linear_work_in_its_size(consumer: Consumer) -> None:
    # Lambda hands a standard queue's function up to 10,000 messages at once; a lane search over every lane (the
    # grouping as first written) made that quadratic. Lines run, counted, are the work: no clock in it.
    def work_for(count: int) -> int:
        # Distinct keys, the worst case for a search of every lane: each message starts a lane of its own.
        items = prepared(consumer, [sqs_record(f"m{i}", tally_body(f"p-{i}", tally_id=f"t-{i}")) for i in range(count)])
        return lines_run(lambda: _lanes(items, fifo=False))

    assert work_for(2_000) < 2.2 * work_for(1_000)


def test_a_hot_tally_batch_applies_every_entry_once_in_order(consumer: Consumer) -> None:
    records = [sqs_record(f"m{i}", tally_body(f"p-{i}", tally_id="hot", amount=100 + i)) for i in range(10)]

    response = consumer.process(records)

    assert response == {"batchItemFailures": []}
    assert total(consumer.dynamodb, "hot") == sum(100 + i for i in range(10))
