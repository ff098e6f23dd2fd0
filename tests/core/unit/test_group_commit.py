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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import boto3
import pytest
from botocore.exceptions import ClientError, ConnectionClosedError

from consumer.errors import BusinessConditionFailed, TransientError
from consumer.idempotency import Applied, Claimed, Committed, Duplicate, IdempotencyStore, InFlight, Refused
from consumer.idempotency.answers import ApplyRequest, ClaimRequest, RecordRefused
from consumer.idempotency.apply import Apply
from consumer.idempotency.calls import Table
from consumer.idempotency.claim import Claim
from consumer.idempotency.commit import Commit
from consumer.idempotency.group_commit import GroupCommit, _Waiting
from consumer.idempotency.observer import FallBack, Tally
from consumer.idempotency.packing import MAX_TRANSACTION_BYTES, Own, Packed, Settled, Shared, size_of
from consumer.idempotency.record import IdempotencyRecord, Status
from consumer.idempotency.release import Release
from consumer.idempotency.transition import Transition
from consumer.idempotency.writes import ConditionCheck, Delete, Put, Update
from consumer.outcome import Outcome
from testkit.lambda_sqs import FIFO_QUEUE_ARN, REGION, sqs_record
from tests.core.handlers import REFUSALS, refusals, tally_body
from tests.core.unit.conftest import TALLIES, Clock, Consumer, entries, make_consumer, total
from tests.utils import IDEMPOTENCY_TABLE, lines_run, together

# Long enough that every thread of a test reaches the group commit however loaded the machine (so which messages
# share a transaction is the test's to say), with a lease ten times that.
WAIT_MS = 1_000
GROUPED: dict[str, Any] = {"max_workers": 10, "group_commit_wait_ms": WAIT_MS, "lease_min_ms": 10 * WAIT_MS}


def _send_shared(table: Table, transitions: Sequence[Transition[Any]]) -> list[Shared]:
    """Each transition's outcome from its group's packing, its shared transactions sent one after another."""
    packed = Packed(table, transitions)
    outcomes = dict(packed.alone)
    for pack in packed.packs:
        packed.send(pack, outcomes.update)
    return [outcomes[index] for index in range(len(transitions))]


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
    # Alone because nothing else was ready: no fall-back from a shared transaction.
    assert (alone.grouping.transactions, alone.grouping.messages_per_transaction, alone.grouping.fell_back) == (
        1,
        1.0,
        {},
    )


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


@pytest.mark.parametrize(
    ("retried", "fell_back"),
    [(False, {FallBack.UNNAMED: 3}), (True, {})],
    ids=["answer-lost", "retried-after-applied"],
)
def test_a_group_whose_answer_was_lost_is_each_messages_own_and_applied_once(
    dynamodb: Any, clock: Clock, retried: bool, fell_back: dict[str, int]
) -> None:
    tally = Tally()
    store = _store(cast("Any", _LostAnswers(dynamodb, times=1, retried=retried)), clock, tally)
    answers = _applied(store, [_tally_request(n) for n in range(1, 4)])
    for n, answer in enumerate(answers, start=1):
        record = store.get(f"TallyAdded#k-{n}")
        assert record is not None and answer == Applied(f"TallyAdded#k-{n}", record.owner_token)
    # Lost: each message goes alone, and the operator is told why; retried: the retry's cancellation, each message
    # finding its own record, settles every one.
    assert tally.take().fell_back == fell_back
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
    calls = _calls(dynamodb)
    answers = _claimed(store, [_claim_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in answers] == [Claimed, InFlight, Claimed]
    # The three in one transaction, cancelled on the second's record; the other two again, together. The second's
    # answer is read from the cancellation: no write of its own follows.
    assert seen == [3, 2]
    assert calls == Counter({"TransactWriteItems": 2})


def test_a_claim_with_a_lease_not_positive_is_the_callers_bug() -> None:
    with pytest.raises(ValueError, match="lease must be positive"):
        Claim(ClaimRequest("CallRequested#k-2", "h", 0), "token")


def _calls(client: Any) -> Counter[str]:
    """Every call the client makes, by operation, from now on."""
    calls: Counter[str] = Counter()
    client.meta.events.register("before-call.dynamodb", lambda model, **_: calls.update([model.name]))
    return calls


def _sizes(client: Any) -> list[int]:
    """The number of items of each TransactWriteItems the client sends, as it sends them."""
    seen: list[int] = []
    event = "before-parameter-build.dynamodb.TransactWriteItems"
    client.meta.events.register(event, lambda params, **_: seen.append(len(params["TransactItems"])))
    return seen


def _two_meeting_and_one_free() -> list[ApplyRequest]:
    """Three applies: the first two check one item (they never share a transaction), the third is on its own."""
    check = ConditionCheck(TALLIES, {"tallyId": "t-1", "entryId": "ENTRY#e-1"}, "attribute_not_exists(entryId)")
    return [*(ApplyRequest(f"TallyAdded#k-{n}", "h", None, (check,)) for n in range(1, 3)), _tally_request(3)]


def test_messages_that_share_an_item_are_never_in_one_transaction(dynamodb: Any, clock: Clock) -> None:
    seen = _sizes(dynamodb)
    answers = _applied(_store(dynamodb, clock), _two_meeting_and_one_free())
    assert [type(answer) for answer in answers] == [Applied] * 3
    # The first two meet on one item: the first goes with the third, the second alone (each from its own thread).
    assert sorted(seen) == [2, 4]


class _SharedWaitsForAlone:
    """A client on which a shared transaction (four items) is sent only once a transition's own write (two) has
    landed, or after five seconds: whether it found that write landed, in ``saw_alone``."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._alone_landed = threading.Event()
        self.saw_alone: list[bool] = []

    def transact_write_items(self, **params: Any) -> Any:
        if len(params["TransactItems"]) > 2:
            self.saw_alone.append(self._alone_landed.wait(5))
            return self._client.transact_write_items(**params)
        answer = self._client.transact_write_items(**params)
        self._alone_landed.set()
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_a_message_packed_alone_goes_to_its_own_write_at_once_not_after_the_shared_transaction(
    dynamodb: Any, clock: Clock
) -> None:
    # Its items meet another's: it was handed back only once the group's shared transaction had been sent, so a lock
    # commit packed alone waited for a send not its own (a stalled one, past its lease).
    client = _SharedWaitsForAlone(dynamodb)
    answers = _applied(_store(client, clock), _two_meeting_and_one_free())
    assert [type(answer) for answer in answers] == [Applied] * 3
    assert client.saw_alone == [True]


class _ConflictThenSharedWaitsForAlone(_SharedWaitsForAlone):
    """The first shared transaction cancelled by a conflict on its second message's record; then as its parent."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._cancelled = False

    def transact_write_items(self, **params: Any) -> Any:
        if not self._cancelled:
            self._cancelled = True
            reasons = [{"Code": "None"}] * len(params["TransactItems"])
            reasons[2] = {"Code": "TransactionConflict"}
            raise _cancellation(reasons)
        return super().transact_write_items(**params)


def test_a_message_a_cancellation_names_goes_to_its_own_write_before_the_rest_are_sent_again(
    dynamodb: Any, clock: Clock
) -> None:
    client = _ConflictThenSharedWaitsForAlone(dynamodb)
    store = _store(client, clock)
    answers = _applied(store, [_tally_request(n) for n in range(1, 4)])
    assert [type(answer) for answer in answers] == [Applied] * 3
    assert client.saw_alone == [True]


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
    # Two shared transactions, each sent from a thread of its own: in either order.
    assert sorted(seen) == [20, 100]


class _TwoItems(Transition[object]):
    """A transition of two items of its own (a record and a business write), landed as its name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def items(self, table: Any, now_ms: int) -> list[dict[str, Any]]:
        return [{"Put": {"TableName": table_name, "Item": {"pk": {"S": self.name}}}} for table_name in ("a", "b")]

    def landed(self, items: list[dict[str, Any]]) -> object:
        return self.name

    writes = read = alone = items  # type: ignore[assignment]


class _Accepts:
    """A table whose every transaction lands; the items' keys of each, in order."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    def now_ms(self) -> int:
        return 0

    def new_token(self) -> str:
        return "token"

    def transact(self, items: list[dict[str, Any]], token: str, messages: int) -> None:
        assert len(items) <= 100
        self.sent.append([item["Put"]["Item"]["pk"]["S"] for item in items])


class _Meets(_TwoItems):
    """Its second item is one every _Meets names: no two of them share a transaction."""

    def items(self, table: Any, now_ms: int) -> list[dict[str, Any]]:
        own, shared = ({"Put": {"TableName": "a", "Item": {"pk": {"S": pk}}}} for pk in (self.name, "hot"))
        return [own, shared]


def test_a_transition_is_tried_against_the_four_packs_opened_last_oldest_first() -> None:
    # Ten transitions meet on one item, so each opens a pack; the next is tried against the four opened last only
    # (its work bounded whatever the batch), and joins the oldest of them that fits.
    table = _Accepts()
    transitions: list[Transition[object]] = [_Meets(f"m{i}") for i in range(10)]
    _send_shared(cast("Table", table), [*transitions, _TwoItems("free")])
    assert ["m6", "hot", "free", "free"] in table.sent


def test_packing_a_batchs_transitions_is_linear_work_in_their_number() -> None:
    # A batch of 10,000 new messages hands 10,000 applies to one send: tried against every pack (first fit), each
    # was tried against every full pack again, quadratic in the batch. Lines run, counted, are the work.
    def work_for(count: int) -> int:
        transitions = [_TwoItems(f"m{i}") for i in range(count)]
        outcomes: list[Shared] = []
        lines = lines_run(lambda: outcomes.extend(_send_shared(cast("Table", _Accepts()), transitions)))
        assert outcomes == [Settled(f"m{i}") for i in range(count)]
        return lines

    assert work_for(4_000) < 2.2 * work_for(2_000)


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
    assert sorted(len(items) for items in client.sent) == [3, 27] and max(sizes) <= 4 * 1024 * 1024
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
    client, tally = _CancelledWithoutReason(), Tally()
    store = _store(cast("Any", client), clock, tally)
    answers = _applied(store, [_tally_request(n) for n in range(1, 4)])
    # Once as a group, then once each: what each would meet alone, a cancellation that settles nothing.
    assert client.calls == 4
    assert [str(answer) for answer in answers] == ["transaction cancelled: no reason given"] * 3
    assert tally.take().fell_back == {FallBack.UNNAMED: 3}


# -- the group commit itself: who waits for whom, and for how long ---------------------------------


class _Sends:
    """A group commit's send that records what it was given and settles each with its index in that send."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    def __call__(self, transitions: Sequence[Transition[Any]]) -> list[Shared]:
        self.sent.append([cast("_Named", transition).name for transition in transitions])
        return [Settled(len(self.sent)) for _ in transitions]


class _InOnePack:
    """A group's packing into one transaction of all its transitions, which ``send`` settles."""

    def __init__(self, send: Callable[[Sequence[Transition[Any]]], list[Shared]], transitions: Sequence[Any]) -> None:
        self._send = send
        self._transitions = transitions
        self.alone: dict[int, Shared] = {}
        self.packs = [list(range(len(transitions)))]

    def send(self, indexes: Sequence[int], settle: Callable[[dict[int, Shared]], None]) -> None:
        settle(dict(zip(indexes, self._send([self._transitions[index] for index in indexes]), strict=True)))


def _in_one_pack(send: Callable[[Sequence[Transition[Any]]], list[Shared]]) -> Callable[[Sequence[Any]], _InOnePack]:
    return lambda transitions: _InOnePack(send, transitions)


class _Named(Transition[object]):
    """A transition that is only its name: what the group commit is given, never sent anywhere."""

    def __init__(self, name: str) -> None:
        self.name = name

    def items(self, table: Any, now_ms: int) -> list[dict[str, Any]]:
        raise AssertionError("a group commit never builds items itself")

    writes = landed = read = alone = items  # type: ignore[assignment]


def _submit_on_threads(group: GroupCommit, names: Sequence[str]) -> dict[str, object]:
    """Each name submitted from a thread of its own (which leaves the group commit when done, and is named after
    what it submits), or names joined by "+" together from one thread; the answers, by name."""
    answers: dict[str, object] = {}

    def submit(names: str) -> None:
        try:
            outcomes = group.submit([_Named(name) for name in names.split("+")])
            answers.update(zip(names.split("+"), outcomes, strict=True))
        finally:
            group.leave()

    threads = [threading.Thread(target=submit, args=(name,), name=name) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers


def test_transitions_of_every_thread_taking_part_are_sent_together() -> None:
    sends = _Sends()
    group = GroupCommit(_in_one_pack(sends), wait_ms=10_000)
    group.join(3)
    answers = _submit_on_threads(group, ["a", "b", "c"])
    assert [sorted(sent) for sent in sends.sent] == [["a", "b", "c"]]
    assert set(answers.values()) == {Settled(1)}


def test_a_thread_that_submits_several_transitions_is_one_of_those_waited_for() -> None:
    # The thread that interleaves optimistic lanes hands in each lane's transition at once: it is one thread waiting,
    # so the send goes when the other thread taking part is waiting too, with all four transitions.
    sends = _Sends()
    group = GroupCommit(_in_one_pack(sends), wait_ms=10_000)
    group.join(2)
    answers = _submit_on_threads(group, ["a+b+c", "d"])
    assert [sorted(sent) for sent in sends.sent] == [["a", "b", "c", "d"]]
    assert answers == dict.fromkeys("abcd", Settled(1))


def test_a_thread_with_nothing_to_submit_waits_for_nothing() -> None:
    sends = _Sends()
    group = GroupCommit(_in_one_pack(sends), wait_ms=10_000)
    group.join(2)
    assert group.submit([]) == []
    assert sends.sent == []


def test_a_thread_that_leaves_without_submitting_is_no_longer_waited_for() -> None:
    # Three threads take part and one leaves at once (its lanes ended before any transition): the other two are sent
    # together as soon as both wait, not at the bound, and not one by one.
    sends = _Sends()
    group = GroupCommit(_in_one_pack(sends), wait_ms=10_000)
    group.join(3)
    group.leave()
    started = time.monotonic()
    answers = _submit_on_threads(group, ["a", "b"])
    assert [sorted(sent) for sent in sends.sent] == [["a", "b"]]
    assert answers == dict.fromkeys("ab", Settled(1))
    assert time.monotonic() - started < 5


def _submitted_alone(group: GroupCommit, name: str) -> threading.Event:
    """Submitted from a thread of its own, while the test's thread watches; set once its submit returns."""
    sent = threading.Event()

    def submit() -> None:
        group.submit([_Named(name)])
        sent.set()

    threading.Thread(target=submit, daemon=True).start()
    return sent


def test_a_bound_of_nothing_sends_at_once_though_the_clock_stands_still() -> None:
    # The bound is reached when the time left is nothing, not only below it: with a clock that does not move, a send
    # that waited for the time left to go negative would never go.
    sends = _Sends()
    group = GroupCommit(_in_one_pack(sends), wait_ms=0, clock=lambda: 100.0)
    group.join(2)  # the other thread never submits
    sent = _submitted_alone(group, "a")
    assert sent.wait(5)
    assert sends.sent == [["a"]]


def test_the_bound_is_wait_ms_to_the_millisecond_on_the_group_commits_clock() -> None:
    # 19.999 ms after it arrived the leader still waits for the thread taking part; at 20 ms it sends alone.
    now, arrived = [100.0], threading.Event()

    def clock() -> float:
        reading = now[0]
        arrived.set()  # the first reading is the submit's arrival: the clock moves only after it
        return reading

    sends = _Sends()
    group = GroupCommit(_in_one_pack(sends), wait_ms=20, clock=clock)
    group.join(2)  # the other thread never submits
    sent = _submitted_alone(group, "a")

    assert arrived.wait(5)
    now[0] = 100.019999
    assert not sent.wait(0.2)
    now[0] = 100.020
    assert sent.wait(5)
    assert sends.sent == [["a"]]


def test_threads_joined_add_up() -> None:
    # Joined one thread, a lone submit is all that is waited for: it goes at once, not at the bound. Joined one and
    # one more, the next send waits for both.
    sends = _Sends()
    group = GroupCommit(_in_one_pack(sends), wait_ms=10_000)
    group.join(1)
    started = time.monotonic()
    assert _submit_on_threads(group, ["a"]) == {"a": Settled(1)}
    assert time.monotonic() - started < 5
    group.join(1)
    group.join(1)
    answers = _submit_on_threads(group, ["b", "c"])
    assert [sorted(sent) for sent in sends.sent] == [["a"], ["b", "c"]]
    assert answers == dict.fromkeys("bc", Settled(2))


def test_a_waiting_thread_takes_each_wake_once() -> None:
    # A wake releases its sleeper once until the sleeper has slept through it: a second wake before the sleep is the
    # same wake, a sleep with no wake pending lasts its timeout, and a wake after a sleep ends the next sleep at once.
    lock = threading.Lock()
    waiting = _Waiting([], since=0.0)
    waiting.wake()
    waiting.wake()
    started = time.monotonic()
    waiting.sleep(lock, timeout=5)
    assert time.monotonic() - started < 1
    started = time.monotonic()
    waiting.sleep(lock, timeout=0.2)
    assert time.monotonic() - started >= 0.2
    waiting.wake()
    started = time.monotonic()
    waiting.sleep(lock, timeout=5)
    assert time.monotonic() - started < 1


def test_a_transition_waits_for_a_thread_busy_elsewhere_no_longer_than_the_bound() -> None:
    sends = _Sends()
    group = GroupCommit(_in_one_pack(sends), wait_ms=200)
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
    group = GroupCommit(_in_one_pack(sends), wait_ms=10_000)
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


def test_a_transition_never_waits_for_another_send_in_flight() -> None:
    # A send that stalls (an SDK timeout, a dropped connection) holds back only its own transitions: one that
    # arrives meanwhile is sent beside it, within the bound, while the stalled one is still in flight.
    quick_went = threading.Event()
    sent: list[list[str]] = []
    stalled_saw_quick_go: list[bool] = []

    def send(transitions: Sequence[Transition[Any]]) -> list[Shared]:
        names = [cast("_Named", transition).name for transition in transitions]
        sent.append(names)
        if names == ["stalled"]:
            stalled_saw_quick_go.append(quick_went.wait(5))
        else:
            quick_went.set()
        return [Settled(names) for _ in transitions]

    group = GroupCommit(_in_one_pack(send), wait_ms=200)
    group.join(1)
    stalled = threading.Thread(target=_submit_on_threads, args=(group, ["stalled"]))
    stalled.start()
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        time.sleep(0.001)
    answers = _submit_on_threads(group, ["quick"])
    stalled.join()
    assert answers == {"quick": Settled(["quick"])}
    assert sent == [["stalled"], ["quick"]]
    assert stalled_saw_quick_go == [True]


class _ByLetter:
    """A group's packing by the first letter of each name: "x" and "y" transactions, a name of "a" alone."""

    def __init__(self, transitions: Sequence[Any], send: Callable[[list[str]], None]) -> None:
        self._names = [cast("_Named", transition).name for transition in transitions]
        self._send = send
        self.alone: dict[int, Shared] = {
            i: Own(FallBack.SHARES_AN_ITEM) for i, n in enumerate(self._names) if n[0] == "a"
        }
        self.packs = [[i for i, n in enumerate(self._names) if n[0] == letter] for letter in "xy"]

    def send(self, indexes: Sequence[int], settle: Callable[[dict[int, Shared]], None]) -> None:
        names = [self._names[index] for index in indexes]
        self._send(names)
        settle(dict.fromkeys(indexes, Settled(sorted(names))))


def test_each_shared_transaction_is_sent_by_a_thread_it_carries_and_none_waits_for_another() -> None:
    # Five threads, one transition each: "x" stalls in its send until "y" has been sent and "a" (alone) answered.
    # Sent by the leader one after another, "y" waited for "x" and "a" for both.
    y_sent, a_answered = threading.Event(), threading.Event()
    senders: dict[str, str] = {}
    stalled_saw: list[bool] = []

    def send(names: list[str]) -> None:
        senders[names[0][0]] = threading.current_thread().name
        if names[0][0] == "x":
            stalled_saw.append(y_sent.wait(5) and a_answered.wait(5))
        else:
            y_sent.set()

    group = GroupCommit(lambda transitions: _ByLetter(transitions, send), wait_ms=10_000)
    group.join(5)
    answers: dict[str, object] = {}

    def submit(name: str) -> None:
        try:
            (answers[name],) = group.submit([_Named(name)])
            if name == "a":
                a_answered.set()
        finally:
            group.leave()

    threads = [threading.Thread(target=submit, args=(name,), name=name) for name in ("a", "x1", "x2", "y1", "y2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stalled_saw == [True]
    assert senders["x"] in ("x1", "x2") and senders["y"] in ("y1", "y2")
    assert answers == {
        "a": Own(FallBack.SHARES_AN_ITEM),
        **dict.fromkeys(("x1", "x2"), Settled(["x1", "x2"])),
        **dict.fromkeys(("y1", "y2"), Settled(["y1", "y2"])),
    }


def test_a_transaction_never_waits_for_another_though_a_thread_carries_a_transition_of_each() -> None:
    # The thread that interleaves lanes carries "x1" and "y1"; "x2" and "y2" run on threads of their own. Each shared
    # transaction is sent by its thread of one transition: sent both by the interleaving thread, "y" waited for "x".
    y_sent = threading.Event()
    senders: dict[str, str] = {}
    stalled_saw: list[bool] = []

    def send(names: list[str]) -> None:
        senders[names[0][0]] = threading.current_thread().name
        if names[0][0] == "x":
            stalled_saw.append(y_sent.wait(5))
        else:
            y_sent.set()

    group = GroupCommit(lambda transitions: _ByLetter(transitions, send), wait_ms=10_000)
    group.join(3)
    _submit_on_threads(group, ["x1+y1", "x2", "y2"])
    assert stalled_saw == [True]
    assert senders == {"x": "x2", "y": "y2"}


def test_a_packing_that_raises_leaves_each_transition_to_its_own_write() -> None:
    def fails(transitions: Sequence[Transition[Any]]) -> Any:
        raise RuntimeError("a packing's bug")

    group = GroupCommit(fails, wait_ms=10_000)
    group.join(2)
    answers = _submit_on_threads(group, ["a+b", "c"])
    assert answers == dict.fromkeys("abc", Own(FallBack.UNNAMED))


def test_a_send_that_raises_leaves_each_transition_to_its_own_write() -> None:
    def fails(transitions: Sequence[Transition[Any]]) -> list[Shared]:
        raise RuntimeError("lost")

    group = GroupCommit(_in_one_pack(fails), wait_ms=10_000)
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


def test_with_group_commit_off_each_transition_goes_alone_and_no_fall_back_is_told(dynamodb: Any, clock: Clock) -> None:
    # Alone is how every transition goes without group commit, not a fall-back: the observer hears of no reason.
    tally = Tally()
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock, observer=tally)
    answers = _applied(store, [_tally_request(n) for n in range(1, 3)])
    assert [type(answer) for answer in answers] == [Applied, Applied]
    grouping = tally.take()
    assert (grouping.transactions, grouping.fell_back) == (2, {})


# -- each transition's part of a shared transaction: what it reads, what is sent again, what goes alone ----------


def test_applies_ready_together_land_in_one_transaction_each_answered_as_its_own(dynamodb: Any, clock: Clock) -> None:
    calls = _calls(dynamodb)
    store = _store(dynamodb, clock)

    answers = together(store, [Apply(_tally_request(n), f"token-{n}") for n in range(1, 4)])

    assert answers == [Applied(f"TallyAdded#k-{n}", f"token-{n}") for n in range(1, 4)]
    assert calls == Counter({"TransactWriteItems": 1})
    records = [store.get(f"TallyAdded#k-{n}") for n in range(1, 4)]
    assert [record.owner_token for record in records if record is not None] == [f"token-{n}" for n in range(1, 4)]


def test_claims_ready_together_land_in_one_transaction_each_with_its_own_lease(dynamodb: Any, clock: Clock) -> None:
    calls = _calls(dynamodb)
    store = _store(dynamodb, clock)
    answers = _claimed(store, [_claim_request(n) for n in range(1, 4)])
    # One transaction and nothing after it: each claim's answer is read from what it sent.
    assert calls == Counter({"TransactWriteItems": 1})
    lease_end = int(clock.now * 1000) + 30_000
    for n, answer in enumerate(answers, start=1):
        record = store.get(f"CallRequested#k-{n}")
        assert record is not None and record.lease_expires_at_ms == lease_end
        # A transaction returns no attributes: the attempts are not known.
        assert answer == Claimed(f"CallRequested#k-{n}", record.owner_token, lease_end, None)


def test_commits_and_releases_ready_together_land_in_one_transaction(dynamodb: Any, clock: Clock) -> None:
    store = _store(dynamodb, clock)
    claims = [cast("Claimed", store.claim(f"CallRequested#k-{n}", f"hash-{n}", 30_000)) for n in range(1, 5)]
    calls = _calls(dynamodb)
    transitions: list[Transition[Any]] = [
        Commit(claims[0], {"n": 1}, _tally_request(1).writes),
        Commit(claims[1], {"n": 2}),
        Release(claims[2]),
        Release(claims[3]),
    ]
    assert together(store, transitions) == [Committed(), Committed(), True, True]
    assert calls == Counter({"TransactWriteItems": 1})
    done = [store.get(f"CallRequested#k-{n}") for n in (1, 2)]
    assert [(record.status, record.result_value()) for record in done if record is not None] == [
        (Status.COMPLETED, {"n": 1}),
        (Status.COMPLETED, {"n": 2}),
    ]
    assert entries(dynamodb, "t-1") == ["ENTRY#e-1"]
    assert (store.get("CallRequested#k-3"), store.get("CallRequested#k-4")) == (None, None)


def test_releases_in_a_group_each_answer_as_alone(dynamodb: Any, clock: Clock) -> None:
    # A release whose claim was taken over answers False and leaves the new owner's record; one whose undo is refused
    # raises, as alone, and releases nothing; one whose record is gone already answers True; the others are released.
    tally = Tally()
    store = _store(dynamodb, clock, tally)
    zombie = cast("Claimed", store.claim("CallRequested#k-2", "hash-2", 1_000))
    clock.advance(2)
    owner = cast("Claimed", store.claim("CallRequested#k-2", "hash-2", 30_000))
    mine = {n: cast("Claimed", store.claim(f"CallRequested#k-{n}", f"hash-{n}", 30_000)) for n in (1, 3, 4, 5)}
    assert store.release(mine[5])  # released before: its answer lost, say
    gone = Delete(TALLIES, {"tallyId": "t-4", "entryId": "HOLD"}, condition="attribute_exists(tallyId)")
    tally.take()
    calls = _calls(dynamodb)

    answers = together(
        store, [Release(mine[1]), Release(zombie), Release(mine[3]), Release(mine[4], (gone,)), Release(mine[5])]
    )

    assert [answers[n] for n in (0, 1, 2, 4)] == [True, False, True, True]
    assert isinstance(answers[3], BusinessConditionFailed) and answers[3].write == gone
    # The four in one transaction, cancelled on the zombie's record and on the undo; the two others again, together;
    # the refused undo alone, which says it in its own words.
    assert calls == Counter({"TransactWriteItems": 3})
    assert tally.take().fell_back == {FallBack.NAMED: 1}
    taken = store.get("CallRequested#k-2")
    assert taken is not None and taken.owner_token == owner.owner_token
    kept = store.get("CallRequested#k-4")
    assert kept is not None and kept.owner_token == mine[4].owner_token
    assert (store.get("CallRequested#k-1"), store.get("CallRequested#k-3")) == (None, None)


def test_a_guard_refused_in_a_group_claim_is_that_messages_alone(dynamodb: Any, clock: Clock) -> None:
    tally = Tally()
    store = _store(dynamodb, clock, tally)
    missing = ConditionCheck(TALLIES, {"tallyId": "t-9", "entryId": "TOTAL"}, "attribute_exists(tallyId)")
    requests = [_claim_request(1), replace(_claim_request(2), guard=(missing,)), _claim_request(3)]

    answers = _claimed(store, requests)

    assert [type(answer) for answer in answers] == [Claimed, Refused, Claimed]
    assert answers[1] == Refused(missing)
    assert store.get("CallRequested#k-2") is None
    # The refusal goes alone, which looks for an abandoned claim of its own that a shared transaction cannot see.
    assert tally.take().fell_back == {FallBack.NAMED: 1}


def _key_id(transact_item: dict[str, Any]) -> str | None:
    """The record id an item of a transaction names (None for a business item, whose key has no ``id``)."""
    action = next(iter(transact_item.values()))
    return cast("str | None", action.get("Key", {}).get("id", {}).get("S"))


def _cancellation(reasons: list[dict[str, Any]] | None) -> ClientError:
    """DynamoDB's TransactionCanceledException, with these reasons (None: none given at all)."""
    response: dict[str, Any] = {
        "Error": {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"},
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }
    if reasons is not None:
        response["CancellationReasons"] = reasons
    return ClientError(cast("Any", response), "TransactWriteItems")


class _CancelledOnce:
    """A client whose first TransactWriteItems is cancelled with ``reasons`` (of its items); the rest reach moto."""

    def __init__(self, client: Any, reasons: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> None:
        self._client, self._reasons, self._cancelled = client, reasons, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def transact_write_items(self, **request: Any) -> Any:
        if self._cancelled:
            return self._client.transact_write_items(**request)
        self._cancelled = True
        raise _cancellation(self._reasons(request["TransactItems"]))


def test_a_conflict_on_one_messages_record_in_a_group_sends_it_alone_and_the_others_again(
    dynamodb: Any, clock: Clock
) -> None:
    def conflict_on_the_second(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"Code": "TransactionConflict" if _key_id(item) == "TallyAdded#k-2" else "None"} for item in items]

    tally = Tally()
    store = _store(cast("Any", _CancelledOnce(dynamodb, conflict_on_the_second)), clock, tally)

    answers = _applied(store, [_tally_request(n) for n in range(1, 4)])

    assert [type(answer) for answer in answers] == [Applied] * 3
    assert [entries(dynamodb, f"t-{n}") for n in range(1, 4)] == [[f"ENTRY#e-{n}"] for n in range(1, 4)]
    grouping = tally.take()
    # The three (cancelled), the first and third again together, the second alone: it was named, not settled.
    assert (grouping.transactions, grouping.messages, grouping.fell_back) == (3, 6, {FallBack.NAMED: 1})


def test_the_one_message_a_group_leaves_unsettled_goes_alone_as_a_message_alone_does(
    dynamodb: Any, clock: Clock
) -> None:
    tally = Tally()
    store = _store(dynamodb, clock, tally)
    for n in (1, 2):
        assert isinstance(store.apply_once(f"TallyAdded#k-{n}", f"hash-{n}"), Applied)
    tally.take()
    calls = _calls(dynamodb)

    answers = _applied(store, [ApplyRequest(f"TallyAdded#k-{n}", f"hash-{n}") for n in (1, 2, 3)])

    assert [type(answer) for answer in answers] == [Duplicate, Duplicate, Applied]
    # The three in one transaction, cancelled on the first two's records: the third is left, as if it had been alone
    # from the start (its own single write, and no fall-back to report).
    assert calls == Counter({"TransactWriteItems": 1, "UpdateItem": 1})
    grouping = tally.take()
    assert (grouping.transactions, grouping.messages, grouping.fell_back) == (2, 4, {})


# A record of k-1 another delivery completed: what a cancellation names when k-1 is a duplicate.
_DONE = {
    "id": {"S": "TallyAdded#k-1"},
    "status": {"S": "COMPLETED"},
    "expiresAt": {"N": str(2**40)},
    "ownerToken": {"S": "another"},
    "payloadHash": {"S": "hash-1"},
    "result": {"S": "null"},
}


def _first_is_done(items: list[dict[str, Any]]) -> Any:
    raise _cancellation(
        [
            {"Code": "ConditionalCheckFailed", "Item": _DONE} if _key_id(item) == _DONE["id"]["S"] else {"Code": "None"}
            for item in items
        ]
    )


def _nothing_named(items: list[dict[str, Any]]) -> Any:
    raise _cancellation([{"Code": "None"}] * len(items))


def _no_reasons(items: list[dict[str, Any]]) -> Any:
    raise _cancellation(None)


def _connection_lost(items: list[dict[str, Any]]) -> Any:
    raise ConnectionClosedError(endpoint_url="https://dynamodb")


def _accepted(items: list[dict[str, Any]]) -> Any:
    return {}


class _Scripted:
    """A DynamoDB client that answers each TransactWriteItems with the next answer of a script (the last one for
    every call after it) and keeps each one's items."""

    def __init__(self, *script: Callable[[list[dict[str, Any]]], Any]) -> None:
        self._script = list(script)
        self.sent: list[list[dict[str, Any]]] = []

    def transact_write_items(self, TransactItems: list[dict[str, Any]], **_: Any) -> Any:  # noqa: N803
        self.sent.append(TransactItems)
        answer = self._script.pop(0) if len(self._script) > 1 else self._script[0]
        return answer(TransactItems)


@pytest.mark.parametrize(
    "then", [_nothing_named, _no_reasons, _connection_lost], ids=["nothing-named", "no-reasons", "connection-lost"]
)
def test_a_message_settled_in_one_send_of_a_group_keeps_its_answer_when_the_next_send_fails(
    clock: Clock, then: Callable[[list[dict[str, Any]]], Any]
) -> None:
    client, tally = _Scripted(_first_is_done, then), Tally()
    store = _store(cast("Any", client), clock, tally)

    answers = _applied(store, [_tally_request(n) for n in range(1, 4)])

    # The first send settles k-1 (a duplicate); the second, of the two others, fails naming nothing: each of them
    # goes alone (and fails there too), k-1 keeps its answer and is not sent again.
    assert answers[0] == Duplicate(IdempotencyRecord.from_item(_DONE))
    assert [type(answer) for answer in answers[1:]] == [TransientError] * 2
    assert [len(items) for items in client.sent] == [6, 4, 2, 2]
    assert tally.take().fell_back == {FallBack.UNNAMED: 2}


def _throttled(items: list[dict[str, Any]]) -> Any:
    error = {"Code": "ThrottlingException", "Message": "Rate exceeded"}
    raise ClientError(cast("Any", {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}), "TransactWriteItems")


@pytest.mark.parametrize(
    "answer",
    [_nothing_named, _no_reasons, _throttled, _connection_lost],
    ids=["nothing-named", "no-reasons", "throttled", "connection-lost"],
)
def test_a_shared_transaction_that_settles_nothing_hands_each_transition_to_its_own_write_itself(
    clock: Clock, answer: Callable[[list[dict[str, Any]]], Any]
) -> None:
    # The packing's own answer, not the group commit's fall-back for a send that settles nothing: each transition is
    # handed back once, for the reason, and the transaction is not sent again.
    client = _Scripted(answer)
    packed = Packed(
        Table(cast("Any", client), IDEMPOTENCY_TABLE, 3600, clock=clock),
        [Apply(_tally_request(n), str(n)) for n in range(1, 4)],
    )
    settled: list[Mapping[int, Shared]] = []
    assert (packed.alone, packed.packs) == ({}, [[0, 1, 2]])
    packed.send(packed.packs[0], settled.append)
    assert settled == [dict.fromkeys(range(3), Own(FallBack.UNNAMED))]
    assert len(client.sent) == 1


def test_a_cancellation_whose_reasons_do_not_match_the_items_one_to_one_is_read_for_no_message(clock: Clock) -> None:
    # DynamoDB gives one reason per item, in order; a list of another length cannot say which item each is about.
    def one_reason(items: list[dict[str, Any]]) -> Any:
        raise _cancellation([{"Code": "ConditionalCheckFailed", "Item": _DONE}])

    client, tally = _Scripted(one_reason, _accepted), Tally()
    store = _store(cast("Any", client), clock, tally)

    answers = _applied(store, [_tally_request(n) for n in range(1, 4)])

    assert [type(answer) for answer in answers] == [Applied] * 3
    assert [len(items) for items in client.sent] == [6, 2, 2, 2]
    assert tally.take().fell_back == {FallBack.UNNAMED: 3}


@pytest.mark.parametrize(("over", "sent"), [(0, [26]), (1, [13, 13])], ids=["at-the-limit", "a-byte-over"])
def test_a_shared_transaction_takes_up_to_four_megabytes_exactly(clock: Clock, over: int, sent: list[int]) -> None:
    # Two messages of twelve items each, whose items come to 4 MB (as the packing measures them) or a byte more.
    def request(n: int, blobs: Sequence[int]) -> ApplyRequest:
        puts = tuple(
            Put(TALLIES, {"tallyId": f"t-{n}", "entryId": f"e-{i}", "blob": "x" * size}) for i, size in enumerate(blobs)
        )
        return ApplyRequest(f"TallyAdded#k-{n}", f"hash-{n}", None, puts)

    client = _Accepting()
    table = Table(cast("Any", client), IDEMPOTENCY_TABLE, 3600, clock=clock)
    now_ms = int(clock.now * 1000)

    def size(blobs: Sequence[int]) -> int:
        return sum(size_of(Apply(request(n, blobs), str(uuid.uuid4())).items(table, now_ms)) for n in (1, 2))

    room = MAX_TRANSACTION_BYTES + over - size([0] * 12)
    blobs = [room // 24] * 12
    first, second = request(1, blobs), request(2, [*blobs[:-1], blobs[-1] + room - 24 * (room // 24)])
    assert size(blobs) + room - 24 * (room // 24) == MAX_TRANSACTION_BYTES + over

    answers = _applied(_store(cast("Any", client), clock), [first, second])

    assert [type(answer) for answer in answers] == [Applied] * 2
    assert [len(items) for items in client.sent] == sent


@dataclass(frozen=True)
class _Unreadable(Apply):
    """An apply whose reading of its part of a cancellation fails, whatever the part says."""

    def read(self, cancelled: RecordRefused | Refused) -> Any:
        raise LookupError("its part cannot be read")


def test_a_transition_that_fails_to_read_its_part_of_a_cancellation_gets_that_error_and_the_others_theirs(
    dynamodb: Any, clock: Clock
) -> None:
    store = _store(dynamodb, clock)
    assert isinstance(store.apply_once("TallyAdded#k-2", "hash-2"), Applied)  # the second's record is taken
    transitions = [
        Apply(_tally_request(1), str(uuid.uuid4())),
        _Unreadable(_tally_request(2), str(uuid.uuid4())),
        Apply(_tally_request(3), str(uuid.uuid4())),
    ]

    answers = together(store, transitions)

    assert [type(answer) for answer in answers] == [Applied, LookupError, Applied]
    assert str(answers[1]) == "its part cannot be read"


@dataclass(frozen=True)
class _Counted(Apply):
    """An apply that counts the times its items are built."""

    builds: Counter[str] = field(default_factory=Counter)

    def items(self, table: Table, now_ms: int) -> list[dict[str, Any]]:
        self.builds[self.record_id] += 1
        return super().items(table, now_ms)


def test_a_shared_transaction_builds_each_messages_items_once(dynamodb: Any, clock: Clock) -> None:
    builds: Counter[str] = Counter()
    store = _store(dynamodb, clock)

    answers = together(store, [_Counted(_tally_request(n), str(uuid.uuid4()), builds) for n in range(1, 4)])

    assert [type(answer) for answer in answers] == [Applied] * 3
    # Built once to be packed, and sent as built: building is most of a message's CPU in the store.
    assert builds == Counter({f"TallyAdded#k-{n}": 1 for n in range(1, 4)})


def _answers(outcomes: Sequence[Shared]) -> list[object]:
    """Each outcome of a shared send: the type of its settled answer, or the ``Own`` that leaves it alone."""
    return [type(outcome.answer) if isinstance(outcome, Settled) else outcome for outcome in outcomes]


def test_what_cannot_go_in_a_shared_transaction_is_left_to_its_own_write_and_the_rest_share_one(
    dynamodb: Any, clock: Clock
) -> None:
    # In the order given: a message whose own writes meet on one item, one whose items cannot be built, one of a
    # whole transaction's hundred items: each is left to its own write, for its reason; the three others share one.
    entry = {"tallyId": "t-2", "entryId": "e-2"}
    on_one_item = (Update(TALLIES, entry, "SET n = :n"), ConditionCheck(TALLIES, entry, "attribute_exists(n)"))
    twice = ApplyRequest("TallyAdded#k-2", "hash-2", None, on_one_item)
    broken = ApplyRequest("TallyAdded#k-4", "hash-4", None, (Put(TALLIES, {"tallyId": "t-4", "entryId": object()}),))
    hundred = tuple(Put(TALLIES, {"tallyId": "t-6", "entryId": f"e-{i}"}) for i in range(99))
    full = ApplyRequest("TallyAdded#k-6", "hash-6", None, hundred)
    requests = [_tally_request(1), twice, _tally_request(3), broken, _tally_request(5), full]
    seen = _sizes(dynamodb)

    outcomes = _send_shared(Table(dynamodb, IDEMPOTENCY_TABLE, 3600, clock=clock), [Apply(r, "t") for r in requests])

    unbuilt, no_room = Own(FallBack.UNBUILT), Own(FallBack.NO_ROOM)
    assert _answers(outcomes) == [Applied, unbuilt, Applied, unbuilt, Applied, no_room]
    assert seen == [6]


def test_puts_of_two_items_with_lists_share_a_transaction(dynamodb: Any, clock: Clock) -> None:
    # A put with a list is named by its JSON: two items that differ are two names, so they share.
    def marker(n: int) -> Apply:
        item = {"tallyId": "t-1", "entryId": f"MARK-{n}", "by": ["batch", {"at": n}]}
        return Apply(ApplyRequest(f"TallyAdded#k-{n}", f"hash-{n}", None, (Put(TALLIES, item),)), f"t-{n}")

    seen = _sizes(dynamodb)
    outcomes = _send_shared(Table(dynamodb, IDEMPOTENCY_TABLE, 3600, clock=clock), [marker(1), marker(2)])
    assert _answers(outcomes) == [Applied, Applied]
    assert seen == [4]


@pytest.mark.parametrize("by", ["batch", ["batch", {"at": 1}]], ids=["scalars", "a-list-of-maps"])
def test_puts_of_one_item_never_share_a_transaction_whatever_the_order_of_their_attributes(
    dynamodb: Any, clock: Clock, by: object
) -> None:
    def marker(n: int, item: dict[str, object]) -> Apply:
        return Apply(ApplyRequest(f"TallyAdded#k-{n}", f"hash-{n}", None, (Put(TALLIES, item),)), f"t-{n}")

    item = {"tallyId": "t-1", "entryId": "MARK", "by": by}
    same_item = {"by": by, "entryId": "MARK", "tallyId": "t-1"}
    seen = _sizes(dynamodb)

    outcomes = _send_shared(
        Table(dynamodb, IDEMPOTENCY_TABLE, 3600, clock=clock),
        [marker(1, item), marker(2, same_item), Apply(_tally_request(3), "t-3")],
    )

    assert _answers(outcomes) == [Applied, Own(FallBack.SHARES_AN_ITEM), Applied]
    assert seen == [4]
