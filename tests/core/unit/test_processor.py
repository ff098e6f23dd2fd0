"""One message through the processor: what it logs, what a copy in its batch is told, what a guard holds,
what a release takes back, and the time a handler is told it has.

On the core's test handlers (tests/core/handlers.py), moto in process, a clock the test moves, and a log that
records each line with its fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import boto3
import pytest

from consumer.envelope import payload_hash
from consumer.errors import ConfigurationError, PoisonMessage, TransientError
from consumer.handler import Effect, Guard, MessageContext, Mode
from consumer.idempotency import Claimed
from consumer.idempotency.record import Status, reservation_token
from consumer.idempotency.writes import ConditionCheck
from consumer.outcome import MessageResult, Outcome
from consumer.processor import ABANDONED_RELEASED, BUSY, TAKEN_OVER
from testkit.dead_letters import reasons
from testkit.lambda_sqs import REGION, sqs_record
from tests.core.handlers import (
    CALL_EVENT,
    HOLD_EVENT,
    TALLY_EVENT,
    HoldHandler,
    HoldRequested,
    TallyAdded,
    TallyHandler,
    call_body,
    hold_body,
    hold_key,
    tally_body,
)
from tests.core.unit.conftest import CALLS, Clock, Consumer, make_consumer
from tests.core.unit.test_conflicts import Conflicts
from tests.kit import Remaining
from tests.utils import settings_for_tests

NOW_MS = 1_800_000_000_000  # the test clock's start
LEASE_MS = 10_000
HOLD_RECORD = f"{HOLD_EVENT}#hold-h-1"
HOLD_TAKEN = "hold h-1 is taken"
HOLD_CANCELLED = (
    f"hold h-1 was cancelled (condition of a Put on {CALLS} failed: holdToken = :token AND #status = :held)"
)
# A log line: (level, message, fields).
Line = tuple[str, str, dict[str, object]]
UNDO_REFUSED = f"hold h-1 is no longer ours (condition of a Delete on {CALLS} failed: holdToken = :token)"


class RecordingLog:
    """A ``consumer.outcome.Log`` that keeps every line."""

    def __init__(self) -> None:
        self.lines: list[Line] = []

    def info(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None:
        self.lines.append(("info", msg, dict(extra or {})))

    def warning(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None:
        self.lines.append(("warning", msg, dict(extra or {})))

    def error(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None:
        self.lines.append(("error", msg, dict(extra or {})))

    def exception(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None:
        self.lines.append(("exception", msg, dict(extra or {})))

    def of(self, message_id: str) -> list[Line]:
        return [line for line in self.lines if line[2].get("message_id") == message_id]


class TellingTally(TallyHandler):
    """The tally handler, noting what its context tells it: (message id, key, receive count, remaining ms)."""

    def __init__(self) -> None:
        super().__init__(settings_for_tests())
        self.seen: list[tuple[str, str, int, int]] = []

    def handle(self, payload: TallyAdded, context: MessageContext) -> Effect:
        told = (context.message_id, context.idempotency_key, context.receive_count, context.remaining_ms())
        self.seen.append(told)
        return super().handle(payload, context)


class ReleaseConflicts(Conflicts):
    """Answers the next ``count`` releases (a transaction deleting the record, its first item) with a conflict,
    or with the request's ``error`` when one is set (throttled)."""

    error = ""

    def _answer(self, params: dict[str, Any], **rest: Any) -> Any:
        first = json.loads(params["body"])["TransactItems"][0]
        answer = super()._answer(params, **rest) if "Delete" in first else None
        if answer is not None and self.error:
            answer[1]["Error"] = {"Code": self.error, "Message": "Rate of requests exceeds the allowed throughput"}
            answer[1].pop("CancellationReasons")
        return answer


@pytest.fixture
def log() -> RecordingLog:
    return RecordingLog()


@pytest.fixture
def session(aws: None) -> boto3.session.Session:
    return boto3.session.Session(region_name=REGION)


def keys(message_id: str, key: str, event_type: str) -> dict[str, object]:
    return {"message_id": message_id, "idempotency_key": key, "event_type": event_type}


def hold_keys(message_id: str) -> dict[str, object]:
    return keys(message_id, "hold-h-1", HOLD_EVENT)


def run(consumer: Consumer, *records: dict[str, Any]) -> tuple[MessageResult, ...]:
    return consumer.batch.process(list(records), consumer.remaining).results


def holding(dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog, handler: HoldHandler, **options: Any) -> Consumer:
    """The consumer with ``handler`` for holds, leases of ``LEASE_MS`` and 30 s left in the invocation."""
    return make_consumer(
        dynamodb, sqs, clock, extra_handlers={HOLD_EVENT: handler}, logger=log, lease_max_ms=LEASE_MS, **options
    )


def hold_item(dynamodb: Any) -> dict[str, str] | None:
    key = {name: {"S": value} for name, value in hold_key("h-1").items()}
    item = dynamodb.get_item(TableName=CALLS, Key=key, ConsistentRead=True).get("Item")
    return None if item is None else {name: value["S"] for name, value in item.items()}


def held_by(key: str, status: str = "HELD") -> dict[str, str]:
    """The hold h-1 as the message of ``key`` holds it: marked with that message's reservation token."""
    token = reservation_token(f"{HOLD_EVENT}#{key}", payload_hash({"holdId": "h-1"}))
    return {**hold_key("h-1"), "status": status, "holdToken": token}


def set_the_hold(dynamodb: Any, key: str, status: str) -> None:
    """What another part of the business does meanwhile: the hold cancelled, or given to another key."""
    dynamodb.put_item(TableName=CALLS, Item={name: {"S": value} for name, value in held_by(key, status).items()})


# -- copies inside one batch ---------------------------------------------------------------


def test_a_copy_of_an_applied_message_is_a_duplicate_of_the_first_and_says_so(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    consumer = make_consumer(dynamodb, sqs, clock, logger=log)

    results = run(consumer, sqs_record("first", tally_body("p-1")), sqs_record("copy", tally_body("p-1")))

    assert results == (
        MessageResult("first", Outcome.APPLIED),
        MessageResult("copy", Outcome.DUPLICATE, "duplicate of first"),
    )
    assert log.of("copy") == [
        ("info", "duplicate in batch", {**keys("copy", "add-p-1", TALLY_EVENT), "first": "first"})
    ]


def test_a_copy_of_a_message_in_flight_elsewhere_is_told_the_same_and_when_to_come_back(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    consumer = make_consumer(dynamodb, sqs, clock, logger=log)
    busy = consumer.store.claim(f"{CALL_EVENT}#call-9", payload_hash(json.loads(call_body("9"))["payload"]), 60_000)
    assert isinstance(busy, Claimed)

    results = run(consumer, sqs_record("first", call_body("9")), sqs_record("copy", call_body("9")))

    expected = MessageResult("copy", Outcome.IN_FLIGHT, "claimed by another worker", retry_at_ms=NOW_MS + 60_000)
    assert results == (replace(expected, message_id="first"), expected)
    assert log.of("copy") == [
        ("info", "retry with the first copy", {**keys("copy", "call-9", CALL_EVENT), "first": "first"})
    ]


# -- what a handler is told and what is stored -----------------------------------------------


def test_an_optimistic_handler_is_told_its_message_and_the_invocations_time_and_its_result_is_stored(
    dynamodb: Any, sqs: Any, clock: Clock
) -> None:
    handler = TellingTally()
    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers={TALLY_EVENT: handler})
    consumer.remaining.ms = 12_345

    results = run(consumer, sqs_record("m", tally_body("p-1"), receive_count=3))

    assert results == (MessageResult("m", Outcome.APPLIED),)
    assert handler.seen == [("m", "add-p-1", 3, 12_345)]
    record = consumer.store.get(f"{TALLY_EVENT}#add-p-1")
    assert record is not None and record.result_value() == {"tallyId": "t-1", "added": 1250}


def test_an_unexpected_error_in_a_handler_is_logged_with_its_trace_and_retried_under_its_type(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    class Buggy(TallyHandler):
        def handle(self, payload: TallyAdded, context: MessageContext) -> Effect:
            raise KeyError("tallyId")

    consumer = make_consumer(
        dynamodb, sqs, clock, logger=log, extra_handlers={TALLY_EVENT: Buggy(settings_for_tests())}
    )

    assert run(consumer, sqs_record("m", tally_body("p-1"))) == (
        MessageResult("m", Outcome.RETRIED, "KeyError: 'tallyId'"),
    )
    assert log.of("m") == [
        ("exception", "unexpected error", keys("m", "add-p-1", TALLY_EVENT)),
        ("warning", "will retry", {**keys("m", "add-p-1", TALLY_EVENT), "reason": "KeyError: 'tallyId'"}),
    ]


def test_a_message_its_handler_refuses_is_dead_lettered_under_the_handlers_reason_and_nothing_is_written(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    class Refusing(TallyHandler):
        def handle(self, payload: TallyAdded, context: MessageContext) -> Effect:
            raise PoisonMessage("InsufficientStock", "9000 asked, 5000 in stock")

    consumer = make_consumer(
        dynamodb, sqs, clock, logger=log, extra_handlers={TALLY_EVENT: Refusing(settings_for_tests())}
    )

    (result,) = run(consumer, sqs_record("m", tally_body("p-1")))

    assert (result.outcome, result.reason) == (Outcome.POISON, "InsufficientStock: 9000 asked, 5000 in stock")
    (letter,) = consumer.dead_letters()
    assert (letter.original_message_id, letter.error_type, letter.error_message) == (
        "m",
        "InsufficientStock",
        "9000 asked, 5000 in stock",
    )
    assert log.of("m") == [
        (
            "warning",
            "dead-lettered",
            {
                **keys("m", "add-p-1", TALLY_EVENT),
                "error_type": "InsufficientStock",
                "reason": "9000 asked, 5000 in stock",
            },
        )
    ]
    assert consumer.store.get(f"{TALLY_EVENT}#add-p-1") is None


def test_a_message_still_in_conflict_when_its_time_runs_out_says_why_and_how_many_were_absorbed(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog, session: boto3.session.Session
) -> None:
    Conflicts(session, "TransactWriteItems", 1_000)
    consumer = make_consumer(
        dynamodb, sqs, clock, session=session, logger=log, conflict_retry_base_ms=1, conflict_retry_max_ms=1
    )
    consumer.remaining = Remaining(30_000, then=[30_000] * 4 + [1_000])

    (result,) = run(consumer, sqs_record("m", tally_body("p-1")))

    assert (result.outcome, result.reason) == (Outcome.CONFLICT, "transaction cancelled: TransactionConflict")
    assert log.of("m") == [
        ("warning", "transaction conflict not absorbed", {**keys("m", "add-p-1", TALLY_EVENT), "absorbed": 3})
    ]


# -- a guarded lock-mode handler -----------------------------------------------------------


def test_a_guard_reserves_with_the_claim_and_handle_is_told_the_time_left_under_its_lease(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    during_handle: list[object] = []

    def look(context: MessageContext) -> None:
        during_handle.append(hold_item(dynamodb))
        clock.advance(4)
        during_handle.append(context.remaining_ms())

    handler = HoldHandler(settings_for_tests(), look)
    consumer = holding(dynamodb, sqs, clock, log, handler)

    assert run(consumer, sqs_record("h", hold_body("h-1"))) == (MessageResult("h", Outcome.APPLIED),)

    # The guard is told the invocation's time; handle the lease's, which runs out first.
    assert handler.seen == [("guard", 30_000), ("handle", LEASE_MS)]
    assert during_handle == [held_by("hold-h-1"), LEASE_MS - 4_000]
    assert hold_item(dynamodb) == held_by("hold-h-1", "DONE")
    record = consumer.store.get(HOLD_RECORD)
    assert record is not None and record.status is Status.COMPLETED and record.result_value() == {"holdId": "h-1"}


def test_an_optimistic_handler_with_a_guard_stops_the_processor_at_start(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    # Its guard would never run (only lock mode runs one): a configuration error, named, before any message.
    class OptimisticHold(HoldHandler):
        mode: ClassVar[Mode] = Mode.OPTIMISTIC

    with pytest.raises(ConfigurationError) as refused:
        make_consumer(dynamodb, sqs, clock, extra_handlers={HOLD_EVENT: OptimisticHold(settings_for_tests())})
    assert str(refused.value) == f"handler of {HOLD_EVENT} defines a guard, which only lock mode runs"


def test_a_guard_that_refuses_claims_nothing_and_runs_no_handle(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    handler = HoldHandler(settings_for_tests())
    consumer = holding(dynamodb, sqs, clock, log, handler)
    set_the_hold(dynamodb, "hold-other", "HELD")

    (result,) = run(consumer, sqs_record("h", hold_body("h-1")))

    assert (result.outcome, result.reason) == (
        Outcome.POISON,
        f"BusinessConditionFailed: {HOLD_TAKEN} (condition of a Put on {CALLS} failed:"
        " attribute_not_exists(callId) OR holdToken = :token)",
    )
    assert reasons(consumer.dead_letters()) == {"h": "BusinessConditionFailed"}
    assert handler.seen == [("guard", 30_000)]
    assert consumer.store.get(HOLD_RECORD) is None
    assert hold_item(dynamodb) == held_by("hold-other")


class MarkedHold(HoldHandler):
    """Holds as ``HoldHandler`` does, its hold marked ``held_by``: another message's hold makes it wait, not refuse."""

    def guard(self, payload: HoldRequested, context: MessageContext) -> Guard:
        held = super().guard(payload, context)
        return Guard(tuple(replace(write, held_by="holdToken") for write in held.writes), held.undo)


def test_a_guard_that_meets_another_messages_hold_is_retried_not_dead_lettered(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    handler = MarkedHold(settings_for_tests())
    consumer = holding(dynamodb, sqs, clock, log, handler)
    set_the_hold(dynamodb, "hold-other", "HELD")

    (result,) = run(consumer, sqs_record("h", hold_body("h-1")))

    condition = "attribute_not_exists(callId) OR holdToken = :token"
    reason = f"{BUSY}: {HOLD_TAKEN} (condition of a Put on {CALLS} failed: {condition})"
    assert result == MessageResult("h", Outcome.RETRIED, reason)
    assert log.of("h") == [("warning", "will retry", {**hold_keys("h"), "reason": reason})]
    assert reasons(consumer.dead_letters()) == {}
    assert handler.seen == [("guard", 30_000)]
    assert consumer.store.get(HOLD_RECORD) is None
    assert hold_item(dynamodb) == held_by("hold-other")


def test_a_failed_handle_releases_the_claim_and_its_reservation_quietly(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    def fail(_: MessageContext) -> None:
        raise TransientError("downstream busy")

    consumer = holding(dynamodb, sqs, clock, log, HoldHandler(settings_for_tests(), fail))

    assert run(consumer, sqs_record("h", hold_body("h-1"))) == (MessageResult("h", Outcome.RETRIED, "downstream busy"),)

    assert consumer.store.get(HOLD_RECORD) is None
    assert hold_item(dynamodb) is None
    assert log.of("h") == [("warning", "will retry", {**hold_keys("h"), "reason": "downstream busy"})]


def test_a_release_that_meets_a_transaction_conflict_is_retried_until_it_goes_through(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog, session: boto3.session.Session
) -> None:
    conflicts = ReleaseConflicts(session, "TransactWriteItems", 1)

    def fail(_: MessageContext) -> None:
        raise TransientError("downstream busy")

    consumer = holding(dynamodb, sqs, clock, log, HoldHandler(settings_for_tests(), fail), session=session)

    assert run(consumer, sqs_record("h", hold_body("h-1")))[0].outcome is Outcome.RETRIED

    assert conflicts.left == 0
    assert consumer.store.get(HOLD_RECORD) is None
    assert hold_item(dynamodb) is None
    assert [line[1] for line in log.of("h")] == ["will retry"]


def test_a_commit_refused_by_its_condition_is_dead_lettered_and_the_reservation_taken_back(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog, session: boto3.session.Session
) -> None:
    conflicts = ReleaseConflicts(session, "TransactWriteItems", 1)
    handler = HoldHandler(settings_for_tests(), lambda _: set_the_hold(dynamodb, "hold-h-1", "CANCELLED"))
    consumer = holding(dynamodb, sqs, clock, log, handler, session=session)

    (result,) = run(consumer, sqs_record("h", hold_body("h-1")))

    assert (result.outcome, result.reason) == (Outcome.POISON, f"BusinessConditionFailed: {HOLD_CANCELLED}")
    assert reasons(consumer.dead_letters()) == {"h": "BusinessConditionFailed"}
    # Released past a conflict, undo and all: the key is free and the cancelled hold is gone.
    assert conflicts.left == 0
    assert consumer.store.get(HOLD_RECORD) is None
    assert hold_item(dynamodb) is None
    assert log.of("h") == [
        (
            "warning",
            "dead-lettered",
            {**hold_keys("h"), "error_type": "BusinessConditionFailed", "reason": HOLD_CANCELLED},
        )
    ]


def test_a_claimed_message_its_handler_refuses_is_dead_lettered_once_released_past_a_conflict(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog, session: boto3.session.Session
) -> None:
    conflicts = ReleaseConflicts(session, "TransactWriteItems", 1)

    def refuse(_: MessageContext) -> None:
        raise PoisonMessage("HoldRefused", "the desk refuses hold h-1")

    consumer = holding(dynamodb, sqs, clock, log, HoldHandler(settings_for_tests(), refuse), session=session)

    (result,) = run(consumer, sqs_record("h", hold_body("h-1")))

    assert (result.outcome, result.reason) == (Outcome.POISON, "HoldRefused: the desk refuses hold h-1")
    # Released past the conflict (absorbed as any transition's), undo and all, before the dead letter.
    assert conflicts.left == 0
    assert consumer.store.get(HOLD_RECORD) is None
    assert hold_item(dynamodb) is None


def test_a_refused_commit_whose_release_is_throttled_is_retried_with_both_reasons_not_dead_lettered(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog, session: boto3.session.Session
) -> None:
    throttled = ReleaseConflicts(session, "TransactWriteItems", 1)
    throttled.error = "ProvisionedThroughputExceededException"
    handler = HoldHandler(settings_for_tests(), lambda _: set_the_hold(dynamodb, "hold-h-1", "CANCELLED"))
    consumer = holding(dynamodb, sqs, clock, log, handler, session=session)

    (result,) = run(consumer, sqs_record("h", hold_body("h-1")))

    assert result.outcome is Outcome.RETRIED
    assert (result.reason or "").startswith("release failed (DynamoDB ProvisionedThroughputExceededException")
    assert (result.reason or "").endswith(f"so not yet dead-lettered: BusinessConditionFailed: {HOLD_CANCELLED}")
    assert reasons(consumer.dead_letters()) == {}
    record = consumer.store.get(HOLD_RECORD)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert hold_item(dynamodb) == held_by("hold-h-1", "CANCELLED")


def test_a_refused_commit_is_dead_lettered_even_when_its_release_fails(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    handler = HoldHandler(settings_for_tests(), lambda _: set_the_hold(dynamodb, "hold-other", "CANCELLED"))
    consumer = holding(dynamodb, sqs, clock, log, handler)

    (result,) = run(consumer, sqs_record("h", hold_body("h-1")))

    assert (result.outcome, result.reason) == (Outcome.POISON, f"BusinessConditionFailed: {HOLD_CANCELLED}")
    record = consumer.store.get(HOLD_RECORD)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert hold_item(dynamodb) == held_by("hold-other", "CANCELLED")
    assert log.of("h") == [
        ("warning", "release failed", {**hold_keys("h"), "error": f"BusinessConditionFailed: {UNDO_REFUSED}"}),
        (
            "warning",
            "dead-lettered",
            {**hold_keys("h"), "error_type": "BusinessConditionFailed", "reason": HOLD_CANCELLED},
        ),
    ]


FENCED = f"lease on {HOLD_RECORD} lost before commit; record is now held IN_PROGRESS by another owner"
NO_CLAIM = f"release found the key {TAKEN_OVER}"


@pytest.mark.parametrize(
    ("fail", "reason", "release_lines"),
    [
        # handle fails: the release finds the new owner's record, leaves it, and says so.
        (True, "too slow", [("warning", NO_CLAIM, hold_keys("h"))]),
        # handle returns: the commit is fenced, and nothing is released.
        (False, FENCED, []),
    ],
)
def test_a_message_whose_claim_is_taken_over_during_handle_leaves_the_key_to_its_new_owner(
    dynamodb: Any,
    sqs: Any,
    clock: Clock,
    log: RecordingLog,
    fail: bool,
    reason: str,
    release_lines: list[Line],
) -> None:
    usurpers: list[object] = []

    def outlive_the_lease(_: MessageContext) -> None:
        clock.advance(LEASE_MS / 1000 + 1)  # while the message's redelivery claims it
        usurpers.append(consumer.store.claim(HOLD_RECORD, payload_hash({"holdId": "h-1"}), 60_000))
        if fail:
            raise TransientError("too slow")

    consumer = holding(dynamodb, sqs, clock, log, HoldHandler(settings_for_tests(), outlive_the_lease))

    assert run(consumer, sqs_record("h", hold_body("h-1"))) == (MessageResult("h", Outcome.RETRIED, reason),)

    (usurper,) = usurpers
    assert isinstance(usurper, Claimed)
    record = consumer.store.get(HOLD_RECORD)
    assert record is not None and record.owner_token == usurper.owner_token
    assert hold_item(dynamodb) == held_by("hold-h-1")  # the redelivery's now, under the same key
    assert log.of("h") == [*release_lines, ("warning", "will retry", {**hold_keys("h"), "reason": reason})]


@pytest.mark.parametrize("usurper_commits", [False, True])
def test_a_refused_commit_whose_claim_is_taken_over_before_its_release_is_left_to_the_new_owner_not_dead_lettered(
    dynamodb: Any,
    sqs: Any,
    clock: Clock,
    log: RecordingLog,
    session: boto3.session.Session,
    usurper_commits: bool,
) -> None:
    # Between the commit DynamoDB refused (the hold cancelled) and the release, the message's redelivery takes the key
    # over (and may commit it): dead-lettered now, the message would be in the DLQ while its new owner applies it, or
    # leave the new owner's claim with no message to come back to it.
    usurpers: list[Claimed] = []
    transactions = 0

    def take_over_after_the_commit(**_: Any) -> None:
        nonlocal transactions
        transactions += 1
        if transactions != 2:  # the claim with its guard, then the commit
            return
        clock.advance(LEASE_MS / 1000 + 1)
        usurper = consumer.store.claim(HOLD_RECORD, payload_hash({"holdId": "h-1"}), 60_000)
        assert isinstance(usurper, Claimed)
        usurpers.append(usurper)
        if usurper_commits:
            consumer.store.commit(usurper, {"holdId": "h-1"})

    handler = HoldHandler(settings_for_tests(), lambda _: set_the_hold(dynamodb, "hold-h-1", "CANCELLED"))
    session.events.register("after-call.dynamodb.TransactWriteItems", take_over_after_the_commit)
    consumer = holding(dynamodb, sqs, clock, log, handler, session=session)

    (result,) = run(consumer, sqs_record("h", hold_body("h-1")))

    (usurper,) = usurpers
    assert result.outcome is Outcome.RETRIED
    assert result.reason == f"{TAKEN_OVER}, so not dead-lettered: BusinessConditionFailed: {HOLD_CANCELLED}"
    assert reasons(consumer.dead_letters()) == {}
    record = consumer.store.get(HOLD_RECORD)
    assert record is not None and record.owner_token == usurper.owner_token
    assert record.status is (Status.COMPLETED if usurper_commits else Status.IN_PROGRESS)


def test_a_release_whose_undo_is_refused_releases_nothing_and_logs_why(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    def lose_the_hold(_: MessageContext) -> None:
        set_the_hold(dynamodb, "hold-other", "HELD")
        raise TransientError("downstream busy")

    consumer = holding(dynamodb, sqs, clock, log, HoldHandler(settings_for_tests(), lose_the_hold))

    assert run(consumer, sqs_record("h", hold_body("h-1"))) == (MessageResult("h", Outcome.RETRIED, "downstream busy"),)

    # Nothing released: the lease runs out and frees the key.
    record = consumer.store.get(HOLD_RECORD)
    assert record is not None and record.status is Status.IN_PROGRESS
    assert hold_item(dynamodb) == held_by("hold-other")
    assert log.of("h") == [
        ("warning", "release failed", {**hold_keys("h"), "error": f"BusinessConditionFailed: {UNDO_REFUSED}"}),
        ("warning", "will retry", {**hold_keys("h"), "reason": "downstream busy"}),
    ]


class _Died(BaseException):
    """The worker dies here (a Lambda timeout): nothing of the message's catches it, nothing is released."""


class DeskHold(HoldHandler):
    """Holds as ``HoldHandler`` does, while the desk (an item of its table) is open."""

    def guard(self, payload: HoldRequested, context: MessageContext) -> Guard:
        held = super().guard(payload, context)
        desk_open = ConditionCheck(CALLS, {"callId": "DESK"}, "attribute_exists(callId)", reason="the desk is closed")
        return Guard((desk_open, *held.writes), held.undo)


def test_a_takeover_its_guard_refuses_releases_the_dead_workers_claim_and_hold_before_its_dead_letter(
    dynamodb: Any, sqs: Any, clock: Clock, log: RecordingLog
) -> None:
    def die(_: MessageContext) -> None:
        raise _Died

    desk = {"callId": {"S": "DESK"}}
    dynamodb.put_item(TableName=CALLS, Item=desk)
    with pytest.raises(_Died):
        run(holding(dynamodb, sqs, clock, log, DeskHold(settings_for_tests(), die)), sqs_record("h", hold_body("h-1")))
    assert hold_item(dynamodb) == held_by("hold-h-1")
    dynamodb.delete_item(TableName=CALLS, Key=desk)
    clock.advance(LEASE_MS / 1000 + 1)

    consumer = holding(dynamodb, sqs, clock, log, DeskHold(settings_for_tests()))
    (result,) = run(consumer, sqs_record("h", hold_body("h-1"), receive_count=2))

    assert (result.outcome, result.reason) == (
        Outcome.POISON,
        f"BusinessConditionFailed: the desk is closed (condition of a ConditionCheck on {CALLS} failed:"
        f" attribute_exists(callId)); {ABANDONED_RELEASED}",
    )
    # Nothing of the message is left: neither the dead worker's claim nor the hold it took (with the guard's undo).
    assert consumer.store.get(HOLD_RECORD) is None
    assert hold_item(dynamodb) is None
