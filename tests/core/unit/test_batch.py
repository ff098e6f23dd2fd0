"""Whole batches through the consumer on the test handlers: the exact batchItemFailures, the DLQ, the tallies."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar, cast

import pytest
from pydantic import BaseModel

from consumer.batch import BatchResult
from consumer.envelope import payload_hash
from consumer.errors import TransientError
from consumer.handler import Effect, MessageContext, MessageHandler, Mode
from consumer.idempotency import Claimed
from consumer.idempotency.observer import Grouping
from consumer.idempotency.writes import Put
from consumer.outcome import MessageResult, Outcome
from consumer.prepared import Prepared
from consumer.processor import Life, MessageProcessor, Steps
from testkit.dead_letters import reasons
from testkit.lambda_sqs import FIFO_QUEUE_ARN, sqs_record
from testkit.webhook import Answer, WebhookSink
from tests.core.handlers import CALL_EVENT, TALLY_EVENT, TALLY_TABLE, call_body, recorded_call, tally_body
from tests.core.unit.conftest import CALLS, TALLIES, Clock, Consumer, entries, make_consumer, total
from tests.kit import Remaining
from tests.utils import settings_for_tests


@pytest.fixture
def calls(dynamodb: Any, sqs: Any, clock: Clock, webhook: WebhookSink) -> Consumer:
    return make_consumer(dynamodb, sqs, clock, webhook_url=f"{webhook.url}/calls", webhook_timeout_ms=500)


# -- mixed batches -------------------------------------------------------------------------


def test_a_mixed_batch_reports_exactly_the_records_to_retry(consumer: Consumer, clock: Clock) -> None:
    consumer.process([sqs_record("earlier", tally_body("p-0", amount=100))])
    # A call (lock mode) whose key another worker holds.
    busy = consumer.store.claim("CallRequested#call-9", _hash_of(call_body("9")), 60_000)
    assert isinstance(busy, Claimed)
    batch = [
        sqs_record("new", tally_body("p-1", amount=1250)),
        sqs_record("redelivered", tally_body("p-0", amount=100)),
        sqs_record("in-flight", call_body("9")),
        sqs_record("bad-json", "{oops"),
        sqs_record("unknown", json.dumps({"eventType": "NoSuchEventType", "payload": {}})),
        sqs_record("schema", json.dumps({"eventType": TALLY_EVENT, "payload": {"entryId": "x"}})),
        sqs_record("new-2", tally_body("p-2", tally_id="t-2", amount=99)),
    ]

    failed = consumer.failed_ids(batch)

    assert failed == ["in-flight"]
    assert reasons(consumer.dead_letters()) == {
        "bad-json": "InvalidJson",
        "unknown": "UnknownEventType",
        "schema": "SchemaViolation",
    }
    assert total(consumer.dynamodb, "t-1") == 1350
    assert total(consumer.dynamodb, "t-2") == 99


def test_a_batch_delivered_twice_applies_nothing_the_second_time(consumer: Consumer) -> None:
    batch = [sqs_record(f"m-{i}", tally_body(f"p-{i}", amount=10 * i)) for i in range(1, 8)]

    assert consumer.failed_ids(batch) == []
    assert consumer.failed_ids(batch) == []

    assert total(consumer.dynamodb, "t-1") == sum(10 * i for i in range(1, 8))
    assert len(entries(consumer.dynamodb, "t-1")) == 8  # 7 entries + the total


def test_a_producer_resend_with_a_new_message_id_is_a_duplicate(consumer: Consumer) -> None:
    consumer.process([sqs_record("first", tally_body("p-1", amount=500))])

    assert consumer.failed_ids([sqs_record("resent", tally_body("p-1", amount=500))]) == []
    assert total(consumer.dynamodb, "t-1") == 500


def test_duplicates_inside_one_batch_are_applied_once(consumer: Consumer) -> None:
    batch = [sqs_record(f"copy-{i}", tally_body("p-1", amount=500)) for i in range(5)]

    assert consumer.failed_ids(batch) == []
    assert total(consumer.dynamodb, "t-1") == 500


def test_a_key_reused_for_the_same_entry_with_another_content_goes_to_the_dlq(consumer: Consumer) -> None:
    consumer.process([sqs_record("original", tally_body("p-1", amount=500, key="shared-key"))])

    failed = consumer.failed_ids([sqs_record("reuse", tally_body("p-1", amount=900, key="shared-key"))])

    assert failed == []
    dead = consumer.dead_letters()
    assert reasons(dead) == {"reuse": "IdempotencyKeyReused"}
    assert "shared-key" in (dead[0].error_message or "")
    assert total(consumer.dynamodb, "t-1") == 500


def test_a_key_reused_for_a_call_with_another_payload_goes_to_the_dlq(calls: Consumer) -> None:
    calls.process([sqs_record("original", call_body("1", key="shared-key"))])

    failed = calls.failed_ids([sqs_record("reuse", call_body("2", key="shared-key"))])

    assert failed == []
    assert reasons(calls.dead_letters()) == {"reuse": "IdempotencyKeyReused"}


def test_a_key_reused_while_its_first_content_is_claimed_waits_and_is_applied_once_that_claim_is_released(
    calls: Consumer,
) -> None:
    # Claimed, the first content may still be refused or a poison, and released: dead-lettered as reused then, this
    # message would be in the DLQ while another delivery of it applies it. It waits, for its backoff (the other
    # content's lease end says nothing of when its own message settles it), and is applied once the key is free.
    first_body = call_body("1", key="shared-key")
    first = calls.store.claim(f"{CALL_EVENT}#shared-key", payload_hash(json.loads(first_body)["payload"]), 120_000)
    assert isinstance(first, Claimed)
    reuse = sqs_record("reuse", call_body("2", key="shared-key"))

    (waiting,) = calls.batch.process([reuse], calls.remaining).results

    assert (waiting.outcome, waiting.retry_at_ms, calls.dead_letters()) == (Outcome.IN_FLIGHT, None, [])
    assert calls.store.release(first) is True
    (applied,) = calls.batch.process([reuse], calls.remaining).results
    assert (applied.outcome, calls.dead_letters()) == (Outcome.APPLIED, [])


def test_a_key_reused_for_a_different_entry_goes_to_the_dlq_and_adds_nothing(consumer: Consumer) -> None:
    # A producer that regenerated its business id on a retry: another entry, another tally, same key.
    consumer.process([sqs_record("original", tally_body("p-1", amount=500, key="shared-key"))])

    failed = consumer.failed_ids([sqs_record("other", tally_body("p-2", tally_id="t-2", amount=900, key="shared-key"))])

    assert failed == []
    assert reasons(consumer.dead_letters()) == {"other": "IdempotencyKeyReused"}
    assert (total(consumer.dynamodb, "t-1"), total(consumer.dynamodb, "t-2")) == (500, 0)
    assert entries(consumer.dynamodb, "t-2") == []


def test_the_same_entry_under_another_key_is_refused_by_its_condition(consumer: Consumer) -> None:
    consumer.process([sqs_record("a", tally_body("p-1", amount=500, key="key-a"))])

    assert consumer.failed_ids([sqs_record("b", tally_body("p-1", amount=500, key="key-b"))]) == []

    assert reasons(consumer.dead_letters()) == {"b": "BusinessConditionFailed"}
    assert total(consumer.dynamodb, "t-1") == 500


def test_an_entry_in_another_unit_than_the_tally_is_refused(consumer: Consumer) -> None:
    consumer.process([sqs_record("eur", tally_body("p-1", amount=500))])
    usd = json.loads(tally_body("p-2", amount=700))
    usd["payload"]["unit"] = "USD"

    assert consumer.failed_ids([sqs_record("usd", json.dumps(usd))]) == []

    assert reasons(consumer.dead_letters()) == {"usd": "BusinessConditionFailed"}
    assert total(consumer.dynamodb, "t-1") == 500


@pytest.mark.parametrize(
    ("payload_change", "field"),
    [
        ({"amount": -5}, "payload.amount"),
        ({"amount": "12.50"}, "payload.amount"),
        ({"unit": "euro"}, "payload.unit"),
        ({"extra": 1}, "payload.extra"),
    ],
)
def test_a_payload_that_breaks_its_handlers_schema_is_poison(
    consumer: Consumer, payload_change: dict[str, Any], field: str
) -> None:
    body = json.loads(tally_body("p-1"))
    body["payload"].update(payload_change)

    assert consumer.failed_ids([sqs_record("bad", json.dumps(body))]) == []

    dead = consumer.dead_letters()
    assert reasons(dead) == {"bad": "SchemaViolation"}
    assert (dead[0].error_message or "").startswith(field)
    assert dead[0].body == json.dumps(body)


def test_a_failed_dead_letter_send_keeps_the_record_for_retry(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    missing_queue = "https://sqs.us-east-1.amazonaws.com/123456789012/no-such-queue"
    consumer = make_consumer(dynamodb, sqs, clock, dlq_url=missing_queue)

    failed = consumer.failed_ids([sqs_record("bad", "{oops"), sqs_record("good", tally_body("p-1"))])

    assert failed == ["bad"]
    assert total(dynamodb, "t-1") == 1250


def test_the_original_message_attributes_travel_to_the_dlq(consumer: Consumer) -> None:
    attributes = {"TraceId": {"stringValue": "t-1", "dataType": "String"}}

    consumer.process([sqs_record("bad", "{oops", message_attributes=attributes)])

    (dead,) = consumer.dead_letters()
    assert dead.attributes["TraceId"]["StringValue"] == "t-1"
    assert "not JSON" in (dead.error_message or "")


# -- FIFO and deadline ---------------------------------------------------------------------


def test_fifo_stops_a_group_at_its_first_failure_and_runs_other_groups(consumer: Consumer) -> None:
    busy = consumer.store.claim("CallRequested#call-a2", _hash_of(call_body("a2")), 60_000)
    assert isinstance(busy, Claimed)
    batch = [
        sqs_record("a1", tally_body("a1", amount=1), group_id="A", queue_arn=FIFO_QUEUE_ARN),
        sqs_record("b1", tally_body("b1", tally_id="t-b", amount=10), group_id="B", queue_arn=FIFO_QUEUE_ARN),
        sqs_record("a2", call_body("a2"), group_id="A", queue_arn=FIFO_QUEUE_ARN),
        sqs_record("b2", tally_body("b2", tally_id="t-b", amount=20), group_id="B", queue_arn=FIFO_QUEUE_ARN),
        sqs_record("a3", tally_body("a3", amount=4), group_id="A", queue_arn=FIFO_QUEUE_ARN),
    ]

    results = consumer.batch.process(batch, consumer.remaining).results

    assert [result.message_id for result in results if result.outcome.is_failure] == ["a2", "a3"]
    # a3 was not started, and may come back at once: the clock's now, in ms.
    reason = "not started: earlier message a2 of group A failed"
    assert results[4] == MessageResult("a3", Outcome.RETRIED, reason, 1_800_000_000_000)
    assert total(consumer.dynamodb, "t-1") == 1
    assert total(consumer.dynamodb, "t-b") == 30


@pytest.mark.parametrize("fails", ["before-its-apply", "at-its-apply"])
def test_fifo_stops_an_optimistic_group_at_its_first_failure_whenever_in_its_life_it_fails(
    consumer: Consumer, monkeypatch: pytest.MonkeyPatch, fails: str
) -> None:
    # Optimistic groups are interleaved on the invocation's thread: a failure ends a life either before its apply
    # (its handler raised) or at the apply's answer (the key is in flight elsewhere); either way the group stops.
    first = tally_body("a1", amount=1)
    if fails == "at-its-apply":
        assert isinstance(consumer.store.claim("TallyAdded#add-a1", _hash_of(first), 60_000), Claimed)
    else:
        handle = MessageProcessor._handle

        def raising(self: MessageProcessor, item: Prepared, parsed: Any, remaining_ms: Callable[[], int]) -> Effect:
            if item.message_id == "a1":
                raise TransientError("the handler's downstream is down")
            return handle(self, item, parsed, remaining_ms)

        monkeypatch.setattr(MessageProcessor, "_handle", raising)
    batch = [
        sqs_record("a1", first, group_id="A", queue_arn=FIFO_QUEUE_ARN),
        sqs_record("b1", tally_body("b1", tally_id="t-b", amount=10), group_id="B", queue_arn=FIFO_QUEUE_ARN),
        sqs_record("a2", tally_body("a2", amount=4), group_id="A", queue_arn=FIFO_QUEUE_ARN),
    ]

    results = consumer.batch.process(batch, consumer.remaining).results

    assert [result.message_id for result in results if result.outcome.is_failure] == ["a1", "a2"]
    assert results[2].reason == "not started: earlier message a1 of group A failed"
    assert total(consumer.dynamodb, "t-b") == 10
    assert entries(consumer.dynamodb, "t-1") == []


def test_fifo_stops_a_lock_group_at_a_copy_whose_settling_fails(
    calls: Consumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lock group runs on a thread of its own; a copy of an applied message is settled without a run of its own, and
    # when settling it fails (here the reuse of the first copy's outcome raises), the group stops there as at any
    # failure.
    def failing(self: MessageProcessor, item: Prepared, first: MessageResult) -> MessageResult:
        raise RuntimeError("the copy's outcome could not be told")

    monkeypatch.setattr(MessageProcessor, "reuse", failing)
    body = call_body("a1")
    batch = [
        sqs_record("a1", body, group_id="A", queue_arn=FIFO_QUEUE_ARN),
        sqs_record("a1-again", body, group_id="A", queue_arn=FIFO_QUEUE_ARN),
        sqs_record("a2", tally_body("a2", amount=4), group_id="A", queue_arn=FIFO_QUEUE_ARN),
    ]

    results = calls.batch.process(batch, calls.remaining).results

    assert [(result.message_id, result.outcome) for result in results] == [
        ("a1", Outcome.APPLIED),
        ("a1-again", Outcome.RETRIED),
        ("a2", Outcome.RETRIED),
    ]
    assert results[2].reason == "not started: earlier message a1-again of group A failed"
    assert entries(calls.dynamodb, "t-1") == []


def test_fair_queue_tenants_on_a_standard_queue_stay_independent(consumer: Consumer) -> None:
    # The same batch as above, from a standard queue: MessageGroupId is a fair-queue tenant, not an order.
    busy = consumer.store.claim("CallRequested#call-a2", _hash_of(call_body("a2")), 60_000)
    assert isinstance(busy, Claimed)
    batch = [
        sqs_record("a1", tally_body("a1", amount=1), group_id="A"),
        sqs_record("a2", call_body("a2"), group_id="A"),
        sqs_record("a3", tally_body("a3", amount=4), group_id="A"),
    ]

    assert consumer.failed_ids(batch) == ["a2"]
    assert total(consumer.dynamodb, "t-1") == 5  # a3 ran although a2, of its tenant, failed


def test_fifo_poison_is_handled_and_does_not_stop_its_group(consumer: Consumer) -> None:
    batch = [
        sqs_record("a1", "{oops", group_id="A", queue_arn=FIFO_QUEUE_ARN),
        sqs_record("a2", tally_body("a2", amount=2), group_id="A", queue_arn=FIFO_QUEUE_ARN),
    ]

    assert consumer.failed_ids(batch) == []
    assert total(consumer.dynamodb, "t-1") == 2


def test_no_record_starts_when_the_invocation_is_about_to_time_out(consumer: Consumer) -> None:
    consumer.remaining.ms = consumer.settings.deadline_margin_ms - 1
    batch = [sqs_record(f"m-{i}", tally_body(f"p-{i}")) for i in range(3)]

    results = consumer.batch.process(batch, consumer.remaining).results

    # Each may come back at once: the clock's now (1_800_000_000 s), in ms.
    reason = "not started: the invocation is about to time out"
    assert results == tuple(MessageResult(f"m-{i}", Outcome.RETRIED, reason, 1_800_000_000_000) for i in range(3))
    assert total(consumer.dynamodb, "t-1") == 0


def test_records_left_when_the_deadline_nears_mid_batch_are_reported(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    consumer = make_consumer(dynamodb, sqs, clock)
    # Two records start with time to spare; then the clock is within the margin.
    consumer.remaining = Remaining(30_000, then=[30_000, 30_000, consumer.settings.deadline_margin_ms - 1])
    batch = [sqs_record(f"m-{i}", tally_body(f"p-{i}", tally_id=f"t-{i}")) for i in range(4)]

    failed = consumer.failed_ids(batch)

    assert failed == ["m-2", "m-3"]
    assert [total(dynamodb, f"t-{i}") for i in range(4)] == [1250, 1250, 0, 0]


def test_a_message_starts_with_exactly_the_margin_left(consumer: Consumer) -> None:
    consumer.remaining.ms = consumer.settings.deadline_margin_ms

    assert consumer.failed_ids([sqs_record("m-1", tally_body("p-1"))]) == []
    assert total(consumer.dynamodb, "t-1") == 1250


def test_once_the_deadline_stopped_a_lane_no_later_message_starts_even_with_time_back(consumer: Consumer) -> None:
    # The same key, so one lane: the first is not started, and the second is not tried although time came back.
    consumer.remaining = Remaining(30_000, then=[consumer.settings.deadline_margin_ms - 1, 30_000])
    batch = [sqs_record("m-1", tally_body("p-1")), sqs_record("m-2", tally_body("p-1"))]

    results = consumer.batch.process(batch, consumer.remaining).results

    reason = "not started: the invocation is about to time out"
    assert results == tuple(MessageResult(f"m-{i}", Outcome.RETRIED, reason, 1_800_000_000_000) for i in (1, 2))


@pytest.mark.parametrize(
    ("records", "said"),
    [
        (None, "event has no 'Records' list: this function takes SQS events only"),
        ([{"body": "{}"}], "message 0 has no messageId: not an SQS message"),
        ([sqs_record("m-1", "{}"), sqs_record("m-1", "{}")], "messageId m-1 appears twice in one batch"),
    ],
    ids=["no-list", "no-message-id", "message-id-twice"],
)
def test_an_event_that_is_not_from_sqs_fails_loudly(consumer: Consumer, records: Any, said: str) -> None:
    with pytest.raises(ValueError) as raised:
        consumer.batch.process(records, consumer.remaining)
    assert str(raised.value) == said


# -- the batch around its processor ------------------------------------------------------------


def _answer_from(thread_names: list[str], remaining_seen: list[object]) -> Any:
    """A processor's execute that records where and with what it ran, and applies without a store (moto in process
    is not thread-safe)."""

    def execute(self: MessageProcessor, item: Prepared, remaining_ms: Callable[[], int]) -> MessageResult:
        thread_names.append(threading.current_thread().name)
        remaining_seen.append(remaining_ms)
        return MessageResult(item.message_id, Outcome.APPLIED)

    return execute


@pytest.mark.parametrize(
    ("max_workers", "keys", "threads"),
    [(1, ["a", "b", "c"], 1), (3, ["a", "a", "a"], 1), (3, ["a", "b", "c"], 3)],
    ids=["one-worker", "one-lane", "three-lanes-three-workers"],
)
def test_lock_lanes_run_on_threads_of_their_own_only_when_there_are_several_and_workers_for_them(
    dynamodb: Any,
    sqs: Any,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    max_workers: int,
    keys: list[str],
    threads: int,
) -> None:
    names: list[str] = []
    answer = _answer_from(names, [])
    # Each lane's message waits for the others' (bounded): lanes that run at once hold as many threads at once.
    together = threading.Barrier(threads, timeout=5)

    def execute(self: MessageProcessor, item: Prepared, remaining_ms: Callable[[], int]) -> MessageResult:
        if threads > 1:
            together.wait()
        return cast("MessageResult", answer(self, item, remaining_ms))

    monkeypatch.setattr(MessageProcessor, "execute", execute)
    consumer = make_consumer(dynamodb, sqs, clock, max_workers=max_workers)
    batch = [sqs_record(f"m-{i}", call_body(str(i), key=key, tally_id=key)) for i, key in enumerate(keys)]

    assert consumer.failed_ids(batch) == []
    # The invocation's own thread is one of the workers; the pool gives the others.
    caller = threading.current_thread().name
    expected = {caller} if threads == 1 else {caller, *(f"message_{n}" for n in range(threads - 1))}
    assert set(names) == expected, names


def test_optimistic_lanes_are_interleaved_on_the_invocations_thread_beside_lock_lanes_on_their_own(
    dynamodb: Any, sqs: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch, webhook: WebhookSink
) -> None:
    # Optimistic handlers never wait outside the store: each lane's next message runs up to its apply, and the applies
    # go together; the lock lane has a thread of its own, its handler free to wait under its lease.
    ran: list[tuple[str, str]] = []
    handle = MessageProcessor._handle

    def recorded(self: MessageProcessor, item: Prepared, parsed: Any, remaining_ms: Callable[[], int]) -> Effect:
        ran.append((item.message_id, threading.current_thread().name))
        return handle(self, item, parsed, remaining_ms)

    monkeypatch.setattr(MessageProcessor, "_handle", recorded)
    consumer = make_consumer(dynamodb, sqs, clock, webhook.url, max_workers=3)
    batch = [
        sqs_record("a1", tally_body("a1", tally_id="t-a")),
        sqs_record("a2", tally_body("a2", tally_id="t-a")),
        sqs_record("b1", tally_body("b1", tally_id="t-b")),
        sqs_record("call", call_body("1", tally_id="t-c")),
    ]
    result = consumer.batch.process(batch, consumer.remaining)

    assert result.counts() == Counter({Outcome.APPLIED: 4})
    caller = threading.current_thread().name
    optimistic = [(name, thread) for name, thread in ran if name != "call"]
    assert optimistic == [("a1", caller), ("b1", caller), ("a2", caller)]
    assert [thread for name, thread in ran if name == "call"] == ["message_0"]
    assert total(dynamodb, "t-a") == 2500


class _Died(BaseException):
    """A lane's thread dies here: nothing of a message's catches it."""


def test_what_escapes_a_lane_escapes_the_batch_once_every_other_lane_has_ended(
    dynamodb: Any, sqs: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended: list[str] = []
    died_first = threading.Event()

    def execute(self: MessageProcessor, item: Prepared, remaining_ms: Callable[[], int]) -> MessageResult:
        if item.message_id == "dies":
            died_first.set()
            raise _Died
        died_first.wait(5)
        time.sleep(0.2)  # ends well after the other lane died
        ended.append(item.message_id)
        return MessageResult(item.message_id, Outcome.APPLIED)

    monkeypatch.setattr(MessageProcessor, "execute", execute)
    consumer = make_consumer(dynamodb, sqs, clock, max_workers=3)
    batch = [sqs_record(name, call_body(name, tally_id=name)) for name in ("dies", "lives-1", "lives-2")]

    with pytest.raises(_Died):
        consumer.failed_ids(batch)
    # No thread of the batch was left running into whatever comes next.
    assert sorted(ended) == ["lives-1", "lives-2"]


def test_one_pool_of_max_workers_threads_serves_every_invocation(
    dynamodb: Any, sqs: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    changed = threading.Condition()
    names: list[str] = []
    running = [0]
    most_at_once = [0]

    def execute(self: MessageProcessor, item: Prepared, remaining_ms: Callable[[], int]) -> MessageResult:
        with changed:
            names.append(threading.current_thread().name)
            running[0] += 1
            most_at_once[0] = max(most_at_once[0], running[0])
            changed.notify_all()
            # Each lane holds its thread while the batch hands out the rest: a pool of more threads starts a third.
            changed.wait_for(lambda: running[0] > 2, timeout=0.3)
            running[0] -= 1
        return MessageResult(item.message_id, Outcome.APPLIED)

    monkeypatch.setattr(MessageProcessor, "execute", execute)
    consumer = make_consumer(dynamodb, sqs, clock, max_workers=2, group_commit=False)
    for invocation in ("a", "b"):
        batch = [sqs_record(f"{invocation}-{i}", call_body(f"{invocation}{i}", tally_id=f"t-{i}")) for i in range(4)]
        assert consumer.failed_ids(batch) == []

    # The invocation's own thread is one of the workers, so the pool has one thread fewer.
    assert len(names) == 8
    assert set(names) <= {threading.current_thread().name, "message_0"}
    assert most_at_once[0] == 2


def test_a_batch_starts_no_thread_past_the_pools_own_while_the_pool_is_busy(
    dynamodb: Any, sqs: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # max_workers 2: the invocation's own thread and a pool of one. That one is held busy when the batch hands out its
    # lanes, so the lane it was given waits for it (or runs on the invocation's thread): no other thread is started.
    consumer = make_consumer(dynamodb, sqs, clock, max_workers=2, group_commit=False)
    busy, free = threading.Event(), threading.Event()

    def elsewhere() -> None:
        busy.set()
        free.wait(timeout=30)

    held = consumer.batch._executor().submit(elsewhere)
    assert busy.wait(timeout=30)

    def execute(self: MessageProcessor, item: Prepared, remaining_ms: Callable[[], int]) -> MessageResult:
        free.set()
        return MessageResult(item.message_id, Outcome.APPLIED)

    monkeypatch.setattr(MessageProcessor, "execute", execute)
    before = set(threading.enumerate())
    batch = [sqs_record(f"m-{i}", call_body(f"m{i}", tally_id=f"t-{i}")) for i in range(4)]

    assert consumer.failed_ids(batch) == []

    held.result(timeout=30)
    # A pool's threads live on after their work: any the batch had started would still be here.
    assert [thread.name for thread in threading.enumerate() if thread not in before] == []


def test_an_invocation_that_died_leaves_its_transactions_out_of_the_next_ones_figures(
    dynamodb: Any, sqs: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first invocation applies one message, then dies in the next (a Lambda timeout): what its store told the
    # observer was never taken. The next invocation's figures are its own.
    begin = MessageProcessor.begin

    def dies_on_the_second(self: MessageProcessor, item: Prepared, remaining_ms: Callable[[], int]) -> Life:
        if item.message_id == "dies":
            raise _Died
        return begin(self, item, remaining_ms)

    monkeypatch.setattr(MessageProcessor, "begin", dies_on_the_second)
    consumer = make_consumer(dynamodb, sqs, clock)
    with pytest.raises(_Died):
        consumer.failed_ids([sqs_record("applied", tally_body("e-1")), sqs_record("dies", tally_body("e-2"))])
    assert total(dynamodb, "t-1") == 1250

    result = consumer.batch.process([sqs_record("next", tally_body("e-3", tally_id="t-3"))], consumer.remaining)

    assert result.counts() == Counter({Outcome.APPLIED: 1})
    assert (result.grouping.transactions, result.grouping.messages) == (1, 1)


def test_a_copy_whose_first_runs_outcome_cannot_be_reused_is_retried_and_stops_its_fifo_group(
    dynamodb: Any, sqs: Any, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: MessageProcessor, item: Prepared, first: MessageResult) -> MessageResult:
        raise RuntimeError("reuse broke")

    monkeypatch.setattr(MessageProcessor, "reuse", broken)
    consumer = make_consumer(dynamodb, sqs, clock)
    batch = [
        sqs_record(name, tally_body(entry), group_id="g", queue_arn=FIFO_QUEUE_ARN)
        for name, entry in (("first", "e-1"), ("copy", "e-1"), ("later", "e-2"))
    ]

    results = consumer.batch.process(batch, consumer.remaining).results

    # Never the whole batch for one message: the copy is retried, and FIFO order holds the group's later message.
    assert results == (
        MessageResult("first", Outcome.APPLIED),
        MessageResult("copy", Outcome.RETRIED, "RuntimeError: reuse broke"),
        MessageResult(
            "later", Outcome.RETRIED, "not started: earlier message copy of group g failed", int(clock.now * 1000)
        ),
    )
    assert entries(dynamodb, "t-1") == ["ENTRY#e-1", "TOTAL"]


def test_a_batch_result_counts_its_outcomes_and_the_conflicts_absorbed() -> None:
    result = BatchResult(
        (
            MessageResult("a", Outcome.APPLIED),
            MessageResult("b", Outcome.APPLIED),
            MessageResult("c", Outcome.RETRIED, "busy"),
        ),
        Grouping(transactions=2, messages=2, conflicts_absorbed=3),
    )

    assert result.counts() == Counter({Outcome.APPLIED: 2, Outcome.RETRIED: 1})
    assert result.conflicts_absorbed() == 3
    assert result.response() == {"batchItemFailures": [{"itemIdentifier": "c"}]}


def test_a_rejected_message_is_run_with_the_invocations_remaining_time(
    consumer: Consumer, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []
    begin = MessageProcessor.begin

    def seeing(self: MessageProcessor, item: Prepared, remaining_ms: Callable[[], int]) -> Life:
        seen.append(remaining_ms)
        return begin(self, item, remaining_ms)

    monkeypatch.setattr(MessageProcessor, "begin", seeing)

    consumer.failed_ids([sqs_record("poison", "{oops")])

    assert seen == [consumer.remaining]


@pytest.mark.parametrize("when", ["at-start", "at-its-answer"])
def test_an_error_escaping_a_messages_life_retries_that_message_alone(
    consumer: Consumer, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    life = MessageProcessor._life

    def broken(self: MessageProcessor, item: Prepared, remaining_ms: Callable[[], int]) -> Steps:
        if item.message_id != "boom":
            return (yield from life(self, item, remaining_ms))
        if when == "at-its-answer":
            yield from life(self, item, remaining_ms)
        raise RuntimeError("a bug in the core")

    monkeypatch.setattr(MessageProcessor, "_life", broken)
    batch = [sqs_record("boom", tally_body("p-1", tally_id="t-1")), sqs_record("ok", tally_body("p-2", tally_id="t-2"))]

    results = consumer.batch.process(batch, consumer.remaining).results

    assert results == (
        MessageResult("boom", Outcome.RETRIED, "RuntimeError: a bug in the core"),
        MessageResult("ok", Outcome.APPLIED),
    )


# -- lock mode: the call webhook -----------------------------------------------------------


def test_a_call_is_posted_once_with_the_idempotency_key(calls: Consumer, webhook: WebhookSink) -> None:
    batch = [sqs_record("r1", call_body("1")), sqs_record("r1-copy", call_body("1"))]

    assert calls.failed_ids(batch) == []
    assert calls.failed_ids([sqs_record("r1-redelivered", call_body("1"))]) == []

    assert webhook.keys() == ["call-1"]
    assert webhook.received()[0].json()["callId"] == "1"
    call = recorded_call(calls.dynamodb, CALLS, "1")
    assert call is not None and call["idempotencyKey"]["S"] == "call-1"


def test_a_webhook_4xx_is_poison_and_frees_the_key(calls: Consumer, webhook: WebhookSink) -> None:
    webhook.answer_next(Answer(422))

    assert calls.failed_ids([sqs_record("r1", call_body("1"))]) == []

    assert reasons(calls.dead_letters()) == {"r1": "WebhookRejected"}
    assert calls.store.get("CallRequested#call-1") is None


@pytest.mark.parametrize("status", [500, 503, 429])
def test_a_webhook_5xx_or_429_is_retried_and_the_claim_released(
    calls: Consumer, webhook: WebhookSink, status: int
) -> None:
    webhook.answer_next(Answer(status))

    assert calls.failed_ids([sqs_record("r1", call_body("1"))]) == ["r1"]
    assert calls.store.get("CallRequested#call-1") is None  # the retry can claim at once

    assert calls.failed_ids([sqs_record("r1", call_body("1"))]) == []
    assert webhook.keys() == ["call-1", "call-1"]


def test_a_webhook_timeout_is_retried(calls: Consumer, webhook: WebhookSink) -> None:
    webhook.answer_next(Answer(delay_s=1.0))  # the consumer waits 500 ms

    assert calls.failed_ids([sqs_record("r1", call_body("1"))]) == ["r1"]
    assert calls.store.get("CallRequested#call-1") is None


def test_a_lock_handler_raising_transient_leaves_the_message_in_the_queue(consumer: Consumer) -> None:
    assert consumer.failed_ids([sqs_record("r1", call_body("1"))]) == ["r1"]
    assert consumer.dead_letters() == []


def test_copies_of_a_rejected_call_in_one_batch_all_reach_the_dlq(calls: Consumer, webhook: WebhookSink) -> None:
    webhook.answer_next(Answer(400))

    assert calls.failed_ids([sqs_record("r1", call_body("1")), sqs_record("r1-copy", call_body("1"))]) == []

    assert reasons(calls.dead_letters()) == {"r1": "WebhookRejected", "r1-copy": "WebhookRejected"}
    assert len(webhook.received()) == 1


# -- lock mode: failures inside the handler -------------------------------------------------


class Empty(BaseModel):
    pass


class ExplodingHandler(MessageHandler[Empty]):
    event_type: ClassVar[str] = "Explode"
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = Empty

    def handle(self, payload: Empty, context: MessageContext) -> Effect:
        raise RuntimeError("bug in business code")


class TakenOverHandler(MessageHandler[Empty]):
    """Runs so long that its lease runs out and another worker takes the key over."""

    event_type: ClassVar[str] = "Slow"
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = Empty
    tables: ClassVar[tuple[str, ...]] = (TALLY_TABLE,)

    def __init__(self, clock: Clock, take_over: Any) -> None:
        super().__init__(settings_for_tests())
        self.clock = clock
        self.take_over = take_over
        self.usurper: Claimed | None = None

    def handle(self, payload: Empty, context: MessageContext) -> Effect:
        self.clock.advance(120)  # past the lease, well before the record's TTL
        self.usurper = self.take_over()
        return Effect("zombie", (Put(TALLIES, {"tallyId": "zombie", "entryId": "WRITE"}),))


def empty_body(event_type: str, key: str) -> str:
    return json.dumps({"eventType": event_type, "metadata": {"idempotencyKey": key}, "payload": {}})


def test_an_unexpected_handler_error_is_retried_and_the_others_applied(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers={"Explode": ExplodingHandler(settings_for_tests())})

    failed = consumer.failed_ids([sqs_record("boom", empty_body("Explode", "k")), sqs_record("ok", tally_body("p"))])

    assert failed == ["boom"]
    assert consumer.store.get("Explode#k") is None
    assert total(dynamodb, "t-1") == 1250


def test_a_worker_whose_lease_was_taken_over_commits_nothing(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    consumer: Consumer | None = None

    def take_over() -> Any:
        assert consumer is not None
        return consumer.store.claim("Slow#k", _hash_of(empty_body("Slow", "k")), 60_000)

    handler = TakenOverHandler(clock, take_over)
    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers={"Slow": handler}, lease_max_ms=30_000)

    failed = consumer.failed_ids([sqs_record("slow", empty_body("Slow", "k"))])

    assert failed == ["slow"]
    assert isinstance(handler.usurper, Claimed)
    record = consumer.store.get("Slow#k")
    assert record is not None
    assert record.owner_token == handler.usurper.owner_token  # the newer owner's claim stands
    assert entries(dynamodb, "zombie") == []


def _hash_of(body: str) -> str:
    return payload_hash(json.loads(body)["payload"])


def test_transient_errors_raised_by_a_handler_are_retried(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    class Flaky(ExplodingHandler):
        event_type: ClassVar[str] = "Flaky"

        def handle(self, payload: Empty, context: MessageContext) -> Effect:
            raise TransientError("downstream busy")

    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers={"Flaky": Flaky(settings_for_tests())})

    assert consumer.failed_ids([sqs_record("f", empty_body("Flaky", "k"))]) == ["f"]
    assert consumer.store.get("Flaky#k") is None


def test_exception_text_reaches_the_logs_bounded_and_without_what_sqs_refuses(
    dynamodb: Any, sqs: Any, clock: Clock
) -> None:
    class Chatty(ExplodingHandler):
        event_type: ClassVar[str] = "Chatty"

        def handle(self, payload: Empty, context: MessageContext) -> Effect:
            # What a downstream or a field name could put into an exception's text.
            raise TransientError("field \x00\x08 " + "x" * 50_000)

    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers={"Chatty": Chatty(settings_for_tests())})

    (result,) = consumer.batch.process([sqs_record("c", empty_body("Chatty", "k"))], consumer.remaining).results

    assert result.reason is not None and len(result.reason) <= 1_000
    assert "\x00" not in result.reason and "\x08" not in result.reason
    assert result.reason.startswith("field \ufffd\ufffd x")


def test_a_write_to_a_table_the_handler_does_not_declare_is_refused_and_retried(
    dynamodb: Any, sqs: Any, clock: Clock
) -> None:
    class Undeclared(ExplodingHandler):
        event_type: ClassVar[str] = "Undeclared"
        mode: ClassVar[Mode] = Mode.OPTIMISTIC

        def handle(self, payload: Empty, context: MessageContext) -> Effect:
            # Its role grant and cold-start check follow ``tables``, which names nothing.
            return Effect("sneaky", (Put(TALLIES, {"tallyId": "sneaky", "entryId": "WRITE"}),))

    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers={"Undeclared": Undeclared(settings_for_tests())})

    results = consumer.batch.process([sqs_record("u", empty_body("Undeclared", "k"))], consumer.remaining).results

    assert [result.outcome for result in results] == [Outcome.RETRIED]
    assert "writes table 'tally', which is not one of its declared tables (none)" in (results[0].reason or "")
    assert entries(dynamodb, "sneaky") == []
    assert consumer.store.get("Undeclared#k") is None
