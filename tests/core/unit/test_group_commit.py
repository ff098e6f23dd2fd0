"""Group commit: transitions of a batch's messages ready at the same moment share one transaction, each its own answer.

On moto (one request at a time), for the calls made and the answers given: through the batch, where each lane runs
on a thread of its own and the store's group commit sends what they have ready together; and at the store, with
``together`` (each transition on its own thread, all joined first, so what shares a transaction is the test's to
say). The same refusals on DynamoDB Local behind the conflict emulation are in tests/core/integration/.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any, cast

import boto3
import pytest
from botocore.exceptions import ClientError, ConnectionClosedError

from consumer.idempotency import Applied, Claimed, Committed, Duplicate, IdempotencyStore, InFlight, Refused
from consumer.idempotency.answers import ApplyRequest, ClaimRequest
from consumer.idempotency.apply import Apply
from consumer.idempotency.claim import Claim
from consumer.idempotency.commit import Commit
from consumer.idempotency.group_commit import GroupCommit
from consumer.idempotency.observer import FallBack, Tally
from consumer.idempotency.packing import Own, Settled, Shared
from consumer.idempotency.transition import Transition
from consumer.idempotency.writes import ConditionCheck, Put
from consumer.outcome import Outcome
from testkit.lambda_sqs import FIFO_QUEUE_ARN, REGION, sqs_record
from tests.core.handlers import REFUSALS, refusals, tally_body
from tests.core.unit.conftest import TALLIES, Clock, Consumer, entries, make_consumer, total
from tests.utils import IDEMPOTENCY_TABLE, together

# Long enough that every thread of a test reaches the group commit however loaded the machine (so which messages
# share a transaction is the test's to say), with a lease ten times that.
WAIT_MS = 1_000
GROUPED: dict[str, Any] = {"max_workers": 10, "group_commit_wait_ms": WAIT_MS, "lease_min_ms": 10 * WAIT_MS}


def _counting(calls: Counter[str]) -> boto3.session.Session:
    session = boto3.session.Session(region_name=REGION)

    def count(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    session.events.register("before-call.dynamodb", count)
    return session


def _grouped(dynamodb: Any, sqs: Any, clock: Clock, calls: Counter[str], *, on: bool = True) -> Consumer:
    return make_consumer(dynamodb, sqs, clock, session=_counting(calls), group_commit=on, **GROUPED)


def _outcomes(consumer: Consumer, records: list[dict[str, Any]]) -> dict[str, Outcome]:
    return {result.message_id: result.outcome for result in consumer.batch.process(records, consumer.remaining).results}


def test_new_messages_on_distinct_items_are_committed_in_one_transaction(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    calls: Counter[str] = Counter()
    consumer = _grouped(dynamodb, sqs, clock, calls)
    records = [sqs_record(f"m-{n}", tally_body(f"e-{n}", tally_id=f"t-{n}", amount=n)) for n in range(1, 11)]
    assert set(_outcomes(consumer, records).values()) == {Outcome.APPLIED}
    assert calls == Counter({"TransactWriteItems": 1})
    assert [total(dynamodb, f"t-{n}") for n in range(1, 11)] == list(range(1, 11))


def test_the_lanes_later_messages_share_a_transaction_as_they_become_ready(
    dynamodb: Any, sqs: Any, clock: Clock
) -> None:
    # Three payments on each of four tallies: a tally's messages share its item, so each tally is a lane run in
    # order on its own thread; the lanes' first messages are one transaction, their second ones the next, their
    # third the last.
    calls: Counter[str] = Counter()
    consumer = _grouped(dynamodb, sqs, clock, calls)
    bodies = [tally_body(f"e-{t}-{n}", tally_id=f"t-{t}", amount=10**n * t) for n in range(3) for t in range(1, 5)]
    records = [sqs_record(f"m-{i}", body) for i, body in enumerate(bodies)]
    assert set(_outcomes(consumer, records).values()) == {Outcome.APPLIED}
    assert calls == Counter({"TransactWriteItems": 3})
    assert [total(dynamodb, f"t-{t}") for t in range(1, 5)] == [111 * t for t in range(1, 5)]


def test_a_lane_busy_elsewhere_holds_back_no_other_lanes_transaction_for_long(
    dynamodb: Any, sqs: Any, clock: Clock
) -> None:
    # Two FIFO groups, each a lane on its own thread: their first messages are one transaction. B's second is not
    # an envelope: its dead letter is no transition, and A's second waits for B's third (no longer than the bound)
    # to share one; A's third has no partner left, B being done, and goes at once.
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
    assert calls == Counter({"TransactWriteItems": 3})
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


def test_the_batch_tells_its_transactions_messages_per_transaction_and_fall_backs(
    dynamodb: Any, sqs: Any, clock: Clock
) -> None:
    consumer = _grouped(dynamodb, sqs, clock, Counter())
    before, batch = refusals()
    consumer.batch.process(before, consumer.remaining)
    grouping = consumer.batch.process(batch, consumer.remaining).grouping
    # Five in one transaction, cancelled on three records' and writes' conditions; the two new ones again together.
    assert (grouping.transactions, grouping.messages, grouping.fell_back) == (2, 7, {})
    alone = consumer.batch.process([sqs_record("m-9", tally_body("e-9", tally_id="t-9"))], consumer.remaining)
    assert (alone.grouping.transactions, alone.grouping.messages_per_transaction) == (1, 1.0)


def _store(client: Any, clock: Clock, observer: Tally | None = None) -> IdempotencyStore:
    return IdempotencyStore(
        client, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock, group_commit_wait_ms=WAIT_MS, observer=observer
    )


def _applied(store: IdempotencyStore, requests: Sequence[ApplyRequest]) -> list[object]:
    return together(store, [Apply(request, str(uuid.uuid4())) for request in requests])


def _claimed(store: IdempotencyStore, requests: Sequence[ClaimRequest]) -> list[object]:
    return together(store, [Claim(request, str(uuid.uuid4())) for request in requests])


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
    store = _store(cast("Any", _LostAnswers(dynamodb, times=1, retried=retried)), clock)
    answers = _applied(store, [_tally_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in answers] == [Applied] * 3
    for n, answer in enumerate(answers, start=1):
        record = store.get(f"TallyAdded#k-{n}")
        assert record is not None and isinstance(answer, Applied) and record.owner_token == answer.owner_token
    # And a delivery after it is a duplicate: applied once.
    again = _applied(store, [_tally_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in again] == [Duplicate] * 3


def _claim_request(n: int) -> ClaimRequest:
    return ClaimRequest(f"CallRequested#k-{n}", f"hash-{n}", 30_000)


@pytest.mark.parametrize("retried", [False, True], ids=["answer-lost", "retried-after-applied"])
def test_a_group_claim_and_commit_whose_answers_were_lost_are_each_messages_own(
    dynamodb: Any, clock: Clock, retried: bool
) -> None:
    def store(times: int) -> IdempotencyStore:
        client = cast("Any", _LostAnswers(dynamodb, times=times, retried=retried, clock=clock))
        return _store(client, clock)

    claims = _claimed(store(times=1), [_claim_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in claims] == [Claimed] * 3
    for answer in claims:
        record = store(0).get(cast("Claimed", answer).record_id)
        # Its own claim (not another's in flight), until the lease end the record carries.
        assert record is not None and isinstance(answer, Claimed)
        assert (record.owner_token, record.lease_expires_at_ms) == (answer.owner_token, answer.lease_expires_at_ms)
    commits = [
        Commit(cast("Claimed", claim), {"n": n}, _tally_request(n).writes) for n, claim in enumerate(claims, start=1)
    ]
    assert [type(answer) for answer in together(store(times=1), commits)] == [Committed] * 3
    assert [entries(dynamodb, f"t-{n}") for n in range(1, 4)] == [[f"ENTRY#e-{n}"] for n in range(1, 4)]
    # And a claim after it finds each one done.
    assert [type(answer) for answer in _claimed(store(0), [_claim_request(n) for n in range(1, 4)])] == [Duplicate] * 3


def test_a_group_claim_beside_a_claim_in_flight_claims_the_others(dynamodb: Any, clock: Clock) -> None:
    seen = _sizes(dynamodb)
    store = _store(dynamodb, clock)
    assert isinstance(store.claim("CallRequested#k-2", "hash-2", 30_000), Claimed)
    answers = _claimed(store, [_claim_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in answers] == [Claimed, InFlight, Claimed]
    # The three in one transaction, cancelled on the second's record; the other two again, together.
    assert seen == [3, 2]


def test_a_claim_with_a_lease_not_positive_is_the_callers_bug() -> None:
    with pytest.raises(ValueError, match="lease must be positive"):
        Claim(ClaimRequest("CallRequested#k-2", "h", 0), "token")


def _sizes(client: Any) -> list[int]:
    """The number of items of each TransactWriteItems the client sends, as it sends them."""
    seen: list[int] = []
    event = "before-parameter-build.dynamodb.TransactWriteItems"
    client.meta.events.register(event, lambda params, **_: seen.append(len(params["TransactItems"])))
    return seen


def test_messages_that_share_an_item_are_never_in_one_transaction(dynamodb: Any, clock: Clock) -> None:
    seen = _sizes(dynamodb)
    store = _store(dynamodb, clock)
    check = ConditionCheck(TALLIES, {"tallyId": "t-1", "entryId": "ENTRY#e-1"}, "attribute_not_exists(entryId)")
    shared = [ApplyRequest(f"TallyAdded#k-{n}", "h", None, (check,)) for n in range(1, 3)]
    answers = _applied(store, [*shared, _tally_request(3)])
    assert [type(answer) for answer in answers] == [Applied] * 3
    # The first two meet on one item: the first goes with the third, the second alone.
    assert seen == [4, 2]


def test_a_message_whose_items_cannot_be_built_fails_alone_and_the_others_are_grouped(
    dynamodb: Any, clock: Clock
) -> None:
    # A handler's write holding a value DynamoDB has no type for: the message's own error, as apply_once raises it;
    # the two around it are still one transaction.
    seen = _sizes(dynamodb)
    store = _store(dynamodb, clock)
    broken = ApplyRequest("TallyAdded#k-bad", "h", None, (Put(TALLIES, {"tallyId": "t-9", "entryId": object()}),))
    answers = _applied(store, [_tally_request(1), broken, _tally_request(3)])
    assert [type(answer) for answer in answers] == [Applied, TypeError, Applied]
    assert seen == [4]
    assert store.get("TallyAdded#k-bad") is None


def test_a_group_past_transact_write_items_limit_is_split(dynamodb: Any, clock: Clock) -> None:
    seen = _sizes(dynamodb)
    store = _store(dynamodb, clock)
    answers = _applied(store, [_tally_request(n) for n in range(60)])
    assert all(isinstance(answer, Applied) for answer in answers)
    assert seen == [100, 20]


def test_a_refused_business_write_in_a_group_is_that_messages_alone(dynamodb: Any, clock: Clock) -> None:
    store = _store(dynamodb, clock)
    store.apply_once("TallyAdded#k-other", "h", None, _tally_request(2).writes)
    answers = _applied(store, [_tally_request(n) for n in range(1, 4)])
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
    client, tally = _Accepting(), Tally()
    store = IdempotencyStore(
        cast("Any", client),
        IDEMPOTENCY_TABLE,
        ttl_seconds=3600,
        clock=clock,
        group_commit_wait_ms=WAIT_MS,
        observer=tally,
    )

    # Ten messages of two 210 KB items each (an item's limit is 400 KB): four megabytes hold nine of them.
    def entry(n: int, side: str) -> Put:
        return Put(TALLIES, {"tallyId": f"t-{n}", "entryId": side, "blob": "x" * 210_000})

    big = [ApplyRequest(f"k-{n}", "h", None, (entry(n, "a"), entry(n, "b"))) for n in range(10)]
    answers = _applied(store, big)
    assert all(isinstance(answer, Applied) for answer in answers)
    sizes = [len(json.dumps(items)) for items in client.sent]
    assert [len(items) for items in client.sent] == [27, 3] and max(sizes) <= 4 * 1024 * 1024
    # The tenth went alone for want of room, and the operator is told so.
    assert tally.take().fell_back == {FallBack.NO_ROOM: 1}


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
    store = _store(cast("Any", client), clock)
    answers = _applied(store, [_tally_request(n) for n in range(1, 4)])
    # Once as a group, then once each: what each would meet alone, a cancellation that settles nothing.
    assert client.calls == 4
    assert [str(answer) for answer in answers] == ["transaction cancelled: no reason given"] * 3


# -- the group commit itself: who waits for whom, and for how long ---------------------------------


class _Sends:
    """A group commit's send that records what it was given and settles each with its index in that send."""

    def __init__(self, first_waits_for: int = 0) -> None:
        self.sent: list[list[str]] = []
        self.group: GroupCommit | None = None
        self._first_waits_for = first_waits_for

    def __call__(self, transitions: Sequence[Transition[Any]]) -> list[Shared]:
        if not self.sent and self._first_waits_for and self.group is not None:
            # The first send stays in flight until that many others are waiting behind it.
            deadline = time.monotonic() + 5
            while len(self.group._waiting) < self._first_waits_for and time.monotonic() < deadline:
                time.sleep(0.001)
        self.sent.append([cast("_Named", transition).name for transition in transitions])
        return [Settled(len(self.sent)) for _ in transitions]


class _Named(Transition[object]):
    """A transition that is only its name: what the group commit is given, never sent anywhere."""

    def __init__(self, name: str) -> None:
        self.name = name

    def items(self, table: Any, now_ms: int) -> list[dict[str, Any]]:
        raise AssertionError("a group commit never builds items itself")

    writes = landed = read = alone = items  # type: ignore[assignment]


def _submit_on_threads(group: GroupCommit, names: Sequence[str]) -> dict[str, object]:
    """Each name submitted from a thread of its own (which leaves the group commit when done); the answers."""
    answers: dict[str, object] = {}

    def submit(name: str) -> None:
        try:
            answers[name] = group.submit(_Named(name))
        finally:
            group.leave()

    threads = [threading.Thread(target=submit, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_transitions_of_every_thread_taking_part_are_sent_together() -> None:
    sends = _Sends()
    group = GroupCommit(sends, wait_ms=10_000)
    group.join(3)
    answers = _submit_on_threads(group, ["a", "b", "c"])
    assert [sorted(sent) for sent in sends.sent] == [["a", "b", "c"]]
    assert set(answers.values()) == {Settled(1)}


def test_a_transition_waits_for_a_thread_busy_elsewhere_no_longer_than_the_bound() -> None:
    sends = _Sends()
    group = GroupCommit(sends, wait_ms=200)
    group.join(2)  # the second thread takes part, and never submits
    started = time.monotonic()
    _submit_on_threads(group, ["a"])
    waited = time.monotonic() - started
    assert sends.sent == [["a"]]
    assert 0.2 <= waited < 5


def test_lock_messages_whose_handlers_end_together_commit_together() -> None:
    # Three lock messages' handlers end at one moment: each thread, back from its handler, submits its commit, and
    # the first waits for the other two (every thread taking part is then waiting): one transaction.
    sends = _Sends()
    group = GroupCommit(sends, wait_ms=10_000)
    group.join(3)
    handlers_end = threading.Barrier(3, timeout=5)

    def handler_then_commit(name: str) -> None:
        handlers_end.wait()
        _submit_on_threads(group, [name])

    threads = [threading.Thread(target=handler_then_commit, args=(name,)) for name in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [sorted(sent) for sent in sends.sent] == [["a", "b", "c"]]


def test_what_arrives_while_a_send_is_in_flight_goes_in_the_next_one() -> None:
    # A commit alone leaves at once (nothing else takes part); two that arrive while it is in flight share the next.
    sends = _Sends(first_waits_for=2)
    group = GroupCommit(sends, wait_ms=10_000)
    sends.group = group
    group.join(1)
    first = threading.Thread(target=_submit_on_threads, args=(group, ["first"]))
    first.start()
    deadline = time.monotonic() + 5
    while not group._sending and time.monotonic() < deadline:
        time.sleep(0.001)
    group.join(2)
    _submit_on_threads(group, ["second", "third"])
    first.join()
    assert [sorted(sent) for sent in sends.sent] == [["first"], ["second", "third"]]


def test_a_send_that_raises_leaves_each_transition_to_its_own_write() -> None:
    def fails(transitions: Sequence[Transition[Any]]) -> list[Shared]:
        raise RuntimeError("lost")

    group = GroupCommit(fails, wait_ms=10_000)
    group.join(2)
    answers = _submit_on_threads(group, ["a", "b"])
    assert answers == {"a": Own(FallBack.UNNAMED), "b": Own(FallBack.UNNAMED)}


def test_a_record_this_version_cannot_read_fails_only_its_own_message_in_a_shared_transaction(
    dynamodb: Any, clock: Clock
) -> None:
    # A record whose status this version does not know (a hand edit, a newer version's during a rolling deploy):
    # reading it raises, and that is its message's outcome alone; the others sharing the transaction are applied.
    dynamodb.put_item(
        TableName=IDEMPOTENCY_TABLE,
        Item={"id": {"S": "TallyAdded#k-2"}, "status": {"S": "ARCHIVED"}, "expiresAt": {"N": str(2**40)}},
    )
    answers = _applied(_store(dynamodb, clock), [_tally_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in answers] == [Applied, ValueError, Applied]
    assert [entries(dynamodb, f"t-{n}") for n in (1, 3)] == [["ENTRY#e-1"], ["ENTRY#e-3"]]


def test_the_store_tells_its_observer_each_transaction_and_each_fall_back(dynamodb: Any, clock: Clock) -> None:
    tally = Tally()
    store = _store(dynamodb, clock, tally)
    check = ConditionCheck(TALLIES, {"tallyId": "t-1", "entryId": "ENTRY#e-1"}, "attribute_not_exists(entryId)")
    shared = [ApplyRequest(f"TallyAdded#k-{n}", "h", None, (check,)) for n in range(1, 3)]
    _applied(store, [*shared, _tally_request(3)])
    grouping = tally.take()
    # One shared transaction of two messages; the third met one of them on an item and went alone.
    assert (grouping.transactions, grouping.messages, grouping.fell_back) == (2, 3, {FallBack.SHARES_AN_ITEM: 1})
    assert tally.take().transactions == 0
