"""Group commit: a batch's new optimistic messages on disjoint items in one transaction, each its own outcome.

On moto, for the calls made and the outcomes given; the same refusals on DynamoDB Local behind the conflict
emulation are in tests/core/integration/test_group_commit.py.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any, cast

import boto3
import pytest
from botocore.exceptions import ClientError, ConnectionClosedError

from consumer.idempotency import Applied, Claimed, Committed, Duplicate, IdempotencyStore, InFlight, Refused
from consumer.idempotency.answers import ApplyRequest, ClaimRequest
from consumer.idempotency.store import CommitRequest
from consumer.idempotency.writes import ConditionCheck, Put
from consumer.outcome import Outcome
from testkit.lambda_sqs import FIFO_QUEUE_ARN, REGION, sqs_record
from testkit.webhook import WebhookSink
from tests.core.handlers import REFUSALS, call_body, refusals, tally_body
from tests.core.unit.conftest import TALLIES, Clock, Consumer, entries, make_consumer, total
from tests.utils import IDEMPOTENCY_TABLE


def _counting(calls: Counter[str]) -> boto3.session.Session:
    session = boto3.session.Session(region_name=REGION)

    def count(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    session.events.register("before-call.dynamodb", count)
    return session


def _grouped(dynamodb: Any, sqs: Any, clock: Clock, calls: Counter[str], *, on: bool = True) -> Consumer:
    return make_consumer(dynamodb, sqs, clock, session=_counting(calls), group_commit=on)


def _outcomes(consumer: Consumer, records: list[dict[str, Any]]) -> dict[str, Outcome]:
    return {result.message_id: result.outcome for result in consumer.batch.process(records, consumer.remaining).results}


def test_new_messages_on_distinct_items_are_committed_in_one_transaction(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    calls: Counter[str] = Counter()
    consumer = _grouped(dynamodb, sqs, clock, calls)
    records = [sqs_record(f"m-{n}", tally_body(f"e-{n}", tally_id=f"t-{n}", amount=n)) for n in range(1, 11)]
    assert set(_outcomes(consumer, records).values()) == {Outcome.APPLIED}
    assert calls == Counter({"TransactWriteItems": 1})
    assert [total(dynamodb, f"t-{n}") for n in range(1, 11)] == list(range(1, 11))


def test_the_lanes_later_messages_are_committed_wave_by_wave(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    # Three payments on each of four tallies: a tally's messages share its item, so each tally is a lane run in
    # order; the lanes' first messages are one transaction, their second ones the next, their third the last.
    calls: Counter[str] = Counter()
    consumer = _grouped(dynamodb, sqs, clock, calls)
    bodies = [tally_body(f"e-{t}-{n}", tally_id=f"t-{t}", amount=10**n * t) for n in range(3) for t in range(1, 5)]
    records = [sqs_record(f"m-{i}", body) for i, body in enumerate(bodies)]
    assert set(_outcomes(consumer, records).values()) == {Outcome.APPLIED}
    assert calls == Counter({"TransactWriteItems": 3})
    assert [total(dynamodb, f"t-{t}") for t in range(1, 5)] == [111 * t for t in range(1, 5)]


def test_a_lane_leaves_the_waves_at_a_message_that_cannot_be_grouped(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    # Two FIFO groups, each a lane: their first messages are one transaction. B's second is not an envelope, so B
    # leaves the waves, and A's second has no partner left: each lane runs the rest in order, alone (a dead letter
    # is handled, so B goes on after it).
    calls: Counter[str] = Counter()
    consumer = _grouped(dynamodb, sqs, clock, calls)

    def fifo(message_id: str, body: str, group: str) -> dict[str, Any]:
        return sqs_record(message_id, body, group_id=group, queue_arn=FIFO_QUEUE_ARN)

    records = [
        fifo("a-1", tally_body("a-1", tally_id="t-1", amount=1), "A"),
        fifo("b-1", tally_body("b-1", tally_id="t-2", amount=10), "B"),
        fifo("a-2", tally_body("a-2", tally_id="t-1", amount=100), "A"),
        fifo("b-poison", "not json", "B"),
        fifo("a-3", tally_body("a-3", tally_id="t-1", amount=1000), "A"),
        fifo("b-3", tally_body("b-3", tally_id="t-2", amount=10000), "B"),
    ]
    assert _outcomes(consumer, records) == {
        "a-1": Outcome.APPLIED,
        "b-1": Outcome.APPLIED,
        "a-2": Outcome.APPLIED,
        "b-poison": Outcome.POISON,
        "a-3": Outcome.APPLIED,
        "b-3": Outcome.APPLIED,
    }
    assert calls == Counter({"TransactWriteItems": 4})
    assert (total(dynamodb, "t-1"), total(dynamodb, "t-2")) == (1101, 10010)


def test_with_group_commit_off_each_message_is_its_own_transaction(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    calls: Counter[str] = Counter()
    consumer = _grouped(dynamodb, sqs, clock, calls, on=False)
    records = [sqs_record(f"m-{n}", tally_body(f"e-{n}", tally_id=f"t-{n}")) for n in range(1, 4)]
    assert set(_outcomes(consumer, records).values()) == {Outcome.APPLIED}
    assert calls == Counter({"TransactWriteItems": 3})


@pytest.mark.parametrize("on", [False, True], ids=["alone", "grouped"])
def test_one_refused_message_in_a_group_leaves_the_others_outcomes_unchanged(
    dynamodb: Any, sqs: Any, clock: Clock, on: bool
) -> None:
    calls: Counter[str] = Counter()
    consumer = _grouped(dynamodb, sqs, clock, calls, on=on)
    before, batch = refusals()
    consumer.process(before)
    calls.clear()
    assert _outcomes(consumer, batch) == REFUSALS
    assert sorted(letter.original_message_id for letter in consumer.dead_letters()) == ["condition", "key-reused"]
    assert [total(dynamodb, f"t-{n}") for n in range(1, 6)] == [1250] * 5
    assert entries(dynamodb, "t-4") == ["ENTRY#e-4", "TOTAL"]
    # Grouped: the five in one call, refused, then the two new ones again without the three it named.
    assert calls["TransactWriteItems"] == (2 if on else 5)


class _LostAnswers:
    """A client whose transact_write_items is applied, then its answer lost, ``times`` times; each one retried
    as botocore retries it (``retried``), the same request once more, or not at all."""

    def __init__(self, client: Any, *, times: int, retried: bool, clock: Clock | None = None) -> None:
        self._client, self._times, self._retried, self._clock = client, times, retried, clock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def transact_write_items(self, **request: Any) -> Any:
        if self._times == 0:
            return self._client.transact_write_items(**request)
        self._times -= 1
        self._client.transact_write_items(**request)
        if self._clock is not None:
            self._clock.advance(2)  # the answer took its time: what is sent next is built at a later time
        if self._retried:
            # moto keeps no request token: the retry meets the records its first attempt wrote.
            return self._client.transact_write_items(**request)
        raise ConnectionClosedError(endpoint_url="https://dynamodb")


def _tally_request(n: int) -> ApplyRequest:
    entry = Put(TALLIES, {"tallyId": f"t-{n}", "entryId": f"ENTRY#e-{n}"}, condition="attribute_not_exists(entryId)")
    return ApplyRequest(f"TallyAdded#k-{n}", f"hash-{n}", {"n": n}, (entry,))


@pytest.mark.parametrize("retried", [False, True], ids=["answer-lost", "retried-after-applied"])
def test_a_group_whose_answer_was_lost_is_each_messages_own_and_applied_once(
    dynamodb: Any, clock: Clock, retried: bool
) -> None:
    store = IdempotencyStore(
        cast("Any", _LostAnswers(dynamodb, times=1, retried=retried)), IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock
    )
    answers = store.apply_group([_tally_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in answers] == [Applied] * 3
    for n, answer in enumerate(answers, start=1):
        record = store.get(f"TallyAdded#k-{n}")
        assert record is not None and isinstance(answer, Applied) and record.owner_token == answer.owner_token
    # And a delivery after it is a duplicate: applied once.
    again = store.apply_group([_tally_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in again] == [Duplicate] * 3


def _claim_request(n: int) -> ClaimRequest:
    return ClaimRequest(f"CallRequested#k-{n}", f"hash-{n}", 30_000)


@pytest.mark.parametrize("retried", [False, True], ids=["answer-lost", "retried-after-applied"])
def test_a_group_claim_and_commit_whose_answers_were_lost_are_each_messages_own(
    dynamodb: Any, clock: Clock, retried: bool
) -> None:
    def store(times: int) -> IdempotencyStore:
        client = cast("Any", _LostAnswers(dynamodb, times=times, retried=retried, clock=clock))
        return IdempotencyStore(client, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)

    claims = store(times=1).claim_group([_claim_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in claims] == [Claimed] * 3
    for answer in claims:
        record = store(0).get(cast("Claimed", answer).record_id)
        # Its own claim (not another's in flight), until the lease end the record carries.
        assert record is not None and isinstance(answer, Claimed)
        assert (record.owner_token, record.lease_expires_at_ms) == (answer.owner_token, answer.lease_expires_at_ms)
    requests = [
        CommitRequest(cast("Claimed", claim), {"n": n}, _tally_request(n).writes)
        for n, claim in enumerate(claims, start=1)
    ]
    assert [type(answer) for answer in store(times=1).commit_group(requests)] == [Committed] * 3
    assert [entries(dynamodb, f"t-{n}") for n in range(1, 4)] == [[f"ENTRY#e-{n}"] for n in range(1, 4)]
    # And a claim after it finds each one done.
    assert [type(answer) for answer in store(0).claim_group([_claim_request(n) for n in range(1, 4)])] == [
        Duplicate
    ] * 3


def test_a_group_commit_that_raises_releases_each_claim_and_retries_each_message(
    dynamodb: Any, sqs: Any, clock: Clock, webhook: WebhookSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever fails the group's commit as a whole, each claim is still its message's to release: none may stand
    # until its lease ends, holding the key from the redelivery.
    consumer = make_consumer(dynamodb, sqs, clock, webhook_url=f"{webhook.url}/calls")

    def fails(*_: Any, **__: Any) -> None:
        raise RuntimeError("the group's commit failed")

    monkeypatch.setattr(IdempotencyStore, "commit_group", fails)
    outcomes = _outcomes(consumer, [sqs_record(f"c-{n}", call_body(str(n), tally_id=f"t-{n}")) for n in range(1, 3)])
    assert outcomes == {"c-1": Outcome.RETRIED, "c-2": Outcome.RETRIED}
    assert [consumer.store.get(f"CallRequested#call-{n}") for n in range(1, 3)] == [None, None]


def test_a_group_claim_beside_a_claim_in_flight_claims_the_others(dynamodb: Any, clock: Clock) -> None:
    seen = _sizes(dynamodb)
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)
    assert isinstance(store.claim("CallRequested#k-2", "hash-2", 30_000), Claimed)
    answers = store.claim_group([_claim_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in answers] == [Claimed, InFlight, Claimed]
    # The three in one transaction, cancelled on the second's record; the other two again, together.
    assert seen == [3, 2]


def test_a_group_claim_with_a_lease_not_positive_is_the_callers_bug(dynamodb: Any, clock: Clock) -> None:
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)
    with pytest.raises(ValueError, match="lease must be positive"):
        store.claim_group([_claim_request(1), ClaimRequest("CallRequested#k-2", "h", 0)])
    assert store.get("CallRequested#k-1") is None


def _sizes(client: Any) -> list[int]:
    """The number of items of each TransactWriteItems the client sends, as it sends them."""
    seen: list[int] = []
    event = "before-parameter-build.dynamodb.TransactWriteItems"
    client.meta.events.register(event, lambda params, **_: seen.append(len(params["TransactItems"])))
    return seen


def test_messages_that_share_an_item_are_never_in_one_transaction(dynamodb: Any, clock: Clock) -> None:
    seen = _sizes(dynamodb)
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)
    check = ConditionCheck(TALLIES, {"tallyId": "t-1", "entryId": "ENTRY#e-1"}, "attribute_not_exists(entryId)")
    shared = [ApplyRequest(f"TallyAdded#k-{n}", "h", None, (check,)) for n in range(1, 3)]
    answers = store.apply_group([*shared, _tally_request(3)])
    assert [type(answer) for answer in answers] == [Applied] * 3
    # The first two meet on one item: the first goes with the third, the second alone.
    assert seen == [4, 2]


def test_a_message_whose_items_cannot_be_built_fails_alone_and_the_others_are_grouped(
    dynamodb: Any, clock: Clock
) -> None:
    # A handler's write holding a value DynamoDB has no type for: the message's own error, as apply_once raises it;
    # the two around it are still one transaction.
    seen = _sizes(dynamodb)
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)
    broken = ApplyRequest("TallyAdded#k-bad", "h", None, (Put(TALLIES, {"tallyId": "t-9", "entryId": object()}),))
    answers = store.apply_group([_tally_request(1), broken, _tally_request(3)])
    assert [type(answer) for answer in answers] == [Applied, TypeError, Applied]
    assert seen == [4]
    assert store.get("TallyAdded#k-bad") is None


def test_a_group_past_transact_write_items_limit_is_split(dynamodb: Any, clock: Clock) -> None:
    seen = _sizes(dynamodb)
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)
    answers = store.apply_group([_tally_request(n) for n in range(60)])
    assert all(isinstance(answer, Applied) for answer in answers)
    assert seen == [100, 20]


def test_a_refused_business_write_in_a_group_is_that_messages_alone(dynamodb: Any, clock: Clock) -> None:
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)
    store.apply_once("TallyAdded#k-other", "h", None, _tally_request(2).writes)
    answers = store.apply_group([_tally_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in answers] == [Applied, Refused, Applied]
    assert store.get("TallyAdded#k-2") is None


class _Accepting:
    """A DynamoDB client that applies every transaction it is given and keeps each one's items."""

    def __init__(self) -> None:
        self.sent: list[list[dict[str, Any]]] = []

    def transact_write_items(self, TransactItems: list[dict[str, Any]], **_: Any) -> dict[str, Any]:  # noqa: N803
        self.sent.append(TransactItems)
        return {}


def test_a_group_past_four_megabytes_is_split_below_it(clock: Clock) -> None:
    client = _Accepting()
    store = IdempotencyStore(cast("Any", client), IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)

    # Ten messages of two 210 KB items each (an item's limit is 400 KB): four megabytes hold nine of them.
    def entry(n: int, side: str) -> Put:
        return Put(TALLIES, {"tallyId": f"t-{n}", "entryId": side, "blob": "x" * 210_000})

    big = [ApplyRequest(f"k-{n}", "h", None, (entry(n, "a"), entry(n, "b"))) for n in range(10)]
    answers = store.apply_group(big)
    assert all(isinstance(answer, Applied) for answer in answers)
    sizes = [len(json.dumps(items)) for items in client.sent]
    assert [len(items) for items in client.sent] == [27, 3] and max(sizes) <= 4 * 1024 * 1024


class _CancelledWithoutReason:
    """A DynamoDB client whose every transaction is cancelled with no item's reason given (``None`` at each)."""

    def __init__(self) -> None:
        self.calls = 0

    def transact_write_items(self, TransactItems: list[dict[str, Any]], **_: Any) -> dict[str, Any]:  # noqa: N803
        self.calls += 1
        if self.calls > 10:
            raise RuntimeError("a group sent again and again")
        reasons = [{"Code": "None"}] * len(TransactItems)
        error = {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"}
        response = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}, "CancellationReasons": reasons}
        raise ClientError(cast("Any", response), "TransactWriteItems")


def test_a_group_cancelled_with_no_reason_is_not_sent_again_but_each_message_alone(clock: Clock) -> None:
    client = _CancelledWithoutReason()
    store = IdempotencyStore(cast("Any", client), IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)
    answers = store.apply_group([_tally_request(n) for n in range(1, 4)])
    # Once as a group, then once each: what each would meet alone, a cancellation that settles nothing.
    assert client.calls == 4
    assert [str(answer) for answer in answers] == ["transaction cancelled: no reason given"] * 3
