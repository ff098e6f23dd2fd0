"""The store's promises that `make mutation` found untested in the fast tests."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, cast

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.stub import Stubber

from consumer.conflicts import ConflictRetry
from consumer.errors import BusinessConditionFailed, ErrorType, PoisonMessage, TransactionConflict, TransientError
from consumer.idempotency import Applied, Claimed, Committed, Duplicate, Fenced, IdempotencyStore, InFlight, Refused
from consumer.idempotency.observer import Tally
from consumer.idempotency.record import IdempotencyRecord, Status, reservation_token
from consumer.idempotency.writes import MAX_BUSINESS_WRITES, ConditionCheck, Delete, Put, Update
from tests.core.unit.conftest import IDEMPOTENCY_TABLE, TALLIES, Clock
from tests.utils import offline_dynamodb


def test_a_read_is_strongly_consistent() -> None:
    # An eventually consistent read may miss a commit made a moment ago: get() promises the latest write.
    client = offline_dynamodb()
    with Stubber(client) as stubber:
        stubber.add_response(
            "get_item", {}, {"TableName": "records", "Key": {"id": {"S": "Ev#k-1"}}, "ConsistentRead": True}
        )
        assert IdempotencyStore(client, "records", ttl_seconds=60).get("Ev#k-1") is None
        stubber.assert_no_pending_responses()


def test_a_commit_stores_the_result_a_duplicate_reads_back(store: IdempotencyStore) -> None:
    claimed = store.claim("Ev#k-1", "hash", lease_ms=30_000)
    assert isinstance(claimed, Claimed)

    store.commit(claimed, {"receipt": "r-1", "amount": 1250})

    record = store.get("Ev#k-1")
    assert record is not None
    assert (record.status, record.result_value()) == (Status.COMPLETED, {"receipt": "r-1", "amount": 1250})


def test_a_lost_lease_names_the_record_and_who_holds_it(store: IdempotencyStore, clock: Clock) -> None:
    zombie = store.claim("Ev#k-1", "hash", lease_ms=1_000)
    assert isinstance(zombie, Claimed)
    clock.advance(2)
    assert isinstance(store.claim("Ev#k-1", "hash", lease_ms=30_000), Claimed)

    fenced = store.commit(zombie, "late")
    assert isinstance(fenced, Fenced)
    assert fenced.reason.startswith("lease on Ev#k-1 lost before commit; record is now held IN_PROGRESS by")


@pytest.mark.parametrize("transition", ["claim", "apply_once"])
def test_a_failed_condition_without_the_item_says_so(store: IdempotencyStore, dynamodb: Any, transition: str) -> None:
    with Stubber(dynamodb) as stub:
        stub.add_client_error("update_item", service_error_code="ConditionalCheckFailedException")
        with pytest.raises(TransientError, match=r"^conditional write failed but DynamoDB returned no item$"):
            if transition == "claim":
                store.claim("Ev#k-1", "hash", lease_ms=30_000)
            else:
                store.apply_once("Ev#k-1", "hash")


def test_a_refused_undo_says_which_write_and_releases_nothing(store: IdempotencyStore) -> None:
    claimed = store.claim("Ev#k-1", "hash", lease_ms=30_000)
    assert isinstance(claimed, Claimed)
    undo = Update(
        TALLIES, {"tallyId": "t-1", "entryId": "TOTAL"}, "SET n = :one", "attribute_exists(tallyId)", values={":one": 1}
    )

    with pytest.raises(BusinessConditionFailed, match=f"condition of a Update on {TALLIES} failed: attribute_exists"):
        store.release(claimed, undo=[undo])

    record = store.get("Ev#k-1")
    assert record is not None
    assert record.owner_token == claimed.owner_token


def test_an_empty_item_with_a_failed_commit_is_no_record(store: IdempotencyStore, dynamodb: Any) -> None:
    claimed = Claimed("Ev#k-1", "t-1", 1_800_000_030_000, 1)
    with Stubber(dynamodb) as stub:
        stub.add_client_error(
            "update_item", service_error_code="ConditionalCheckFailedException", modeled_fields={"Item": {}}
        )
        fenced = store.commit(claimed, "late")
    assert isinstance(fenced, Fenced)
    assert fenced.reason.endswith("record is now held nobody")


def test_the_shortest_lease_is_one_millisecond(store: IdempotencyStore, clock: Clock) -> None:
    claimed = store.claim("Ev#k-1", "hash", lease_ms=1)

    assert isinstance(claimed, Claimed)
    assert claimed.lease_expires_at_ms == int(clock.now * 1000) + 1
    with pytest.raises(ValueError, match="lease must be positive, got 0 ms"):
        store.claim("Ev#k-2", "hash", lease_ms=0)


def test_an_optimistic_apply_stores_the_result_a_duplicate_reads_back(store: IdempotencyStore) -> None:
    assert isinstance(store.apply_once("Ev#k-1", "hash", {"receipt": "r-1"}), Applied)

    record = store.get("Ev#k-1")
    assert record is not None
    assert (record.status, record.result_value()) == (Status.COMPLETED, {"receipt": "r-1"})


def test_a_retried_claim_that_finds_its_own_record_is_that_claim() -> None:
    # botocore retried a claim whose first answer was lost: the item carries this claim's token.
    client = offline_dynamodb()
    mine = {
        "id": {"S": "Ev#k-1"},
        "status": {"S": "IN_PROGRESS"},
        "leaseExpiresAt": {"N": "1800000030000"},
        "ownerToken": {"S": "t-1"},
        "payloadHash": {"S": "hash"},
        "attempts": {"N": "3"},
    }
    with Stubber(client) as stubber:
        stubber.add_client_error(
            "update_item", service_error_code="ConditionalCheckFailedException", modeled_fields={"Item": mine}
        )
        store = IdempotencyStore(
            client, "records", ttl_seconds=60, clock=lambda: 1_800_000_000.0, new_token=lambda: "t-1"
        )
        assert store.claim("Ev#k-1", "hash", lease_ms=30_000) == Claimed("Ev#k-1", "t-1", 1_800_000_030_000, 3)


# -- transactions, as DynamoDB answers them (botocore's Stubber checks each request against the API) -------------

_HELD = {
    "id": {"S": "Ev#k-1"},
    "status": {"S": "IN_PROGRESS"},
    "leaseExpiresAt": {"N": "1800000060000"},
    "ownerToken": {"S": "other"},
    "payloadHash": {"S": "hash"},
    "attempts": {"N": "1"},
}
_GUARD = (ConditionCheck(TALLIES, {"tallyId": "t-1", "entryId": "TOTAL"}, "attribute_exists(tallyId)"),)
_WRITE = (Put(TALLIES, {"tallyId": "t-1", "entryId": "e-1"}),)


@pytest.fixture
def stubbed() -> Iterator[tuple[IdempotencyStore, Stubber]]:
    client = offline_dynamodb()
    tokens = (f"t-{n}" for n in itertools.count(1))
    with Stubber(client) as stubber:
        yield (
            IdempotencyStore(
                client, "records", ttl_seconds=60, clock=lambda: 1_800_000_000.0, new_token=lambda: next(tokens)
            ),
            stubber,
        )
        stubber.assert_no_pending_responses()


def _cancelled(stubber: Stubber, *reasons: dict[str, Any]) -> None:
    fields = {"CancellationReasons": list(reasons)} if reasons else {}
    stubber.add_client_error(
        "transact_write_items", service_error_code="TransactionCanceledException", modeled_fields=fields
    )


@pytest.mark.parametrize(
    ("status", "answer"), [("IN_PROGRESS", InFlight), ("COMPLETED", Duplicate)], ids=["held", "completed"]
)
def test_a_guarded_claim_on_a_taken_key_reads_the_record_before_its_guard(
    stubbed: tuple[IdempotencyStore, Stubber], status: str, answer: type
) -> None:
    store, stubber = stubbed
    taken = {**_HELD, "status": {"S": status}}
    _cancelled(stubber, {"Code": "ConditionalCheckFailed", "Item": taken}, {"Code": "ConditionalCheckFailed"})

    assert store.claim("Ev#k-1", "hash", 30_000, _GUARD) == answer(IdempotencyRecord.from_item(taken))


@pytest.mark.parametrize("transition", ["claim", "apply_once"])
def test_a_refused_transaction_without_the_record_says_so(
    stubbed: tuple[IdempotencyStore, Stubber], transition: str
) -> None:
    store, stubber = stubbed
    _cancelled(stubber, {"Code": "ConditionalCheckFailed"}, {"Code": "None"})

    if transition == "claim":
        with pytest.raises(TransientError, match=r"^claim of Ev#k-1 failed and no item came back$"):
            store.claim("Ev#k-1", "hash", 30_000, _GUARD)
    else:
        with pytest.raises(TransientError, match=r"^condition on Ev#k-1 failed and no item came back$"):
            store.apply_once("Ev#k-1", "hash", writes=_WRITE)


def test_an_optimistic_apply_names_its_record_and_token(stubbed: tuple[IdempotencyStore, Stubber]) -> None:
    store, stubber = stubbed
    stubber.add_response("transact_write_items", {})

    assert store.apply_once("Ev#k-1", "hash", writes=_WRITE) == Applied("Ev#k-1", "t-1")


@pytest.mark.parametrize("writes", [(), _WRITE], ids=["alone", "with-writes"])
def test_a_commit_that_finds_itself_completed_is_committed_and_one_that_finds_nobody_is_fenced(
    stubbed: tuple[IdempotencyStore, Stubber], writes: tuple[Put, ...]
) -> None:
    store, stubber = stubbed
    claim = Claimed("Ev#k-1", "other", 1_800_000_060_000, 1)
    for item in ({**_HELD, "status": {"S": "COMPLETED"}}, {}):
        if writes:
            _cancelled(stubber, {"Code": "ConditionalCheckFailed", "Item": item}, {"Code": "None"})
        else:
            stubber.add_client_error(
                "update_item", service_error_code="ConditionalCheckFailedException", modeled_fields={"Item": item}
            )

    assert store.commit(claim, writes=writes) == Committed()  # its own answer was lost, and its retry found it done
    assert store.commit(claim, writes=writes) == Fenced("Ev#k-1", None)


@pytest.mark.parametrize("transition", ["commit", "release"])
def test_a_transactions_token_is_its_claims_own(stubbed: tuple[IdempotencyStore, Stubber], transition: str) -> None:
    """The same for a retry of one claim's commit or release (DynamoDB applies it once), another for another claim's
    (DynamoDB refuses a token reused with other parameters)."""
    store, stubber = stubbed
    tokens: list[str] = []
    stubber.client.meta.events.register(
        "provide-client-params.dynamodb.TransactWriteItems",
        lambda params, **_: tokens.append(params["ClientRequestToken"]),
    )
    for owner in ("t-1", "t-1", "t-2"):
        stubber.add_response("transact_write_items", {})
        claim = Claimed(f"Ev#{owner}", owner, 1_800_000_060_000, 1)
        if transition == "commit":
            assert store.commit(claim, writes=_WRITE) == Committed()
        else:
            assert store.release(claim, _WRITE) is True

    assert tokens[0] == tokens[1] != tokens[2]
    assert "t-1" not in tokens and "t-2" not in tokens


@pytest.mark.parametrize(
    ("codes", "error", "said"),
    [
        ([], TransientError, "transaction cancelled: no reason given"),
        (["None", "ValidationError"], TransientError, "transaction cancelled: ValidationError"),
        (
            ["ValidationError", "ThrottlingError"],
            TransientError,
            "transaction cancelled: ThrottlingError, ValidationError",
        ),
        (
            ["None", "TransactionConflict", "ThrottlingError"],
            TransactionConflict,
            "transaction cancelled: ThrottlingError, TransactionConflict",
        ),
    ],
    ids=["no-reasons", "other-code", "other-codes", "conflict"],
)
def test_a_cancelled_transaction_says_every_code_it_met(
    stubbed: tuple[IdempotencyStore, Stubber], codes: list[str], error: type[Exception], said: str
) -> None:
    store, stubber = stubbed
    _cancelled(stubber, *({"Code": code} for code in codes))
    claim = Claimed("Ev#k-1", "t-1", 1_800_000_060_000, 1)

    with pytest.raises(error) as raised:
        store.release(claim, _WRITE)  # a release raises what commit and apply_once answer as Conflicted
    assert str(raised.value) == said


def test_a_transaction_takes_as_many_business_writes_as_dynamodb_allows_and_no_more(
    stubbed: tuple[IdempotencyStore, Stubber],
) -> None:
    store, stubber = stubbed
    most = tuple(Put(TALLIES, {"tallyId": "t-1", "entryId": f"e-{i}"}) for i in range(MAX_BUSINESS_WRITES))
    stubber.add_response("transact_write_items", {})

    assert store.apply_once("Ev#k-1", "hash", writes=most) == Applied("Ev#k-1", "t-1")
    with pytest.raises(
        PoisonMessage, match=f"^InvalidHandlerTransaction: at most {MAX_BUSINESS_WRITES} business .* got 100$"
    ):
        store.apply_once("Ev#k-2", "hash", writes=(*most, _WRITE[0]))


def test_a_record_lives_through_its_expiry_second(store: IdempotencyStore, clock: Clock) -> None:
    # Expiry compares whole seconds, as TTL does: within the second expiresAt names the record still holds its key.
    first = store.claim("Ev#k-1", "hash", lease_ms=30_000)
    assert isinstance(first, Claimed)
    store.commit(first, "done")
    record = store.get("Ev#k-1")
    assert record is not None and record.expires_at is not None

    clock.now = record.expires_at + 0.999
    assert isinstance(store.claim("Ev#k-1", "hash", lease_ms=30_000), Duplicate)
    clock.now = record.expires_at + 1
    assert isinstance(store.claim("Ev#k-1", "hash", lease_ms=30_000), Claimed)


@pytest.mark.parametrize(
    ("code", "status", "said"),
    [
        ("", 500, "DynamoDB 500: "),  # a server error without a code of its own: its status says what it was
        ("SomethingNew", 503, "DynamoDB SomethingNew: "),
        ("ThrottlingException", 400, "DynamoDB ThrottlingException: "),
    ],
)
def test_any_server_error_is_transient_and_named(
    store: IdempotencyStore, dynamodb: Any, code: str, status: int, said: str
) -> None:
    with Stubber(dynamodb) as stub:
        stub.add_client_error("get_item", service_error_code=code, http_status_code=status)
        with pytest.raises(TransientError) as error:
            store.get("Ev#k-1")
    assert str(error.value).startswith(said)


def test_a_client_error_below_500_without_a_transient_code_is_raised_as_it_is(
    store: IdempotencyStore, dynamodb: Any
) -> None:
    with Stubber(dynamodb) as stub:
        stub.add_client_error("get_item", service_error_code="", http_status_code=499)
        with pytest.raises(ClientError) as error:
            store.get("Ev#k-1")
    assert not isinstance(error.value, TransientError)


def test_an_unreachable_dynamodb_is_transient_and_says_so(
    store: IdempotencyStore, dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(**_: Any) -> None:
        raise EndpointConnectionError(endpoint_url="https://dynamodb.example")

    monkeypatch.setattr(dynamodb, "get_item", unreachable)
    with pytest.raises(TransientError, match=r"^DynamoDB unreachable: Could not connect to the endpoint URL"):
        store.get("Ev#k-1")


# -- a takeover refused by its guard, and the abandoned claim it meets (moto) -------------------------------------

_OPEN = ConditionCheck(TALLIES, {"tallyId": "t-1", "entryId": "OPEN"}, "attribute_exists(tallyId)", reason="closed")
_HOLD = {"tallyId": "t-1", "entryId": "HOLD"}
# The guard: the tally open, and held for this message; the undo takes the hold back if it is still this message's.
_HOLDING = (
    _OPEN,
    Put(
        TALLIES,
        {**_HOLD, "holdToken": "mine"},
        condition="attribute_not_exists(tallyId) OR holdToken = :token",
        values={":token": "mine"},
    ),
)
_UNHOLD = (Delete(TALLIES, _HOLD, condition="holdToken = :token", values={":token": "mine"}),)


def _hold(dynamodb: Any) -> dict[str, Any] | None:
    key = {name: {"S": value} for name, value in _HOLD.items()}
    return cast("dict[str, Any] | None", dynamodb.get_item(TableName=TALLIES, Key=key).get("Item"))


def _abandoned(store: IdempotencyStore, dynamodb: Any, clock: Clock) -> Claimed:
    """A claim that took its hold and whose worker died: its lease (1 s) over, the hold standing, the tally closed."""
    dynamodb.put_item(TableName=TALLIES, Item={"tallyId": {"S": "t-1"}, "entryId": {"S": "OPEN"}})
    dead = store.claim("Ev#k-1", "hash", 1_000, _HOLDING, undo=_UNHOLD)
    assert isinstance(dead, Claimed)
    dynamodb.delete_item(TableName=TALLIES, Key={"tallyId": {"S": "t-1"}, "entryId": {"S": "OPEN"}})
    clock.advance(2)
    return dead


@pytest.mark.parametrize("hold", ["standing", "already-gone"])
def test_a_refused_takeover_releases_the_abandoned_claim_of_its_message_and_its_hold(
    store: IdempotencyStore, dynamodb: Any, clock: Clock, hold: str
) -> None:
    _abandoned(store, dynamodb, clock)
    if hold == "already-gone":
        dynamodb.delete_item(TableName=TALLIES, Key={name: {"S": value} for name, value in _HOLD.items()})
    assert (_hold(dynamodb) is None) == (hold == "already-gone")

    refused = store.claim("Ev#k-1", "hash", 30_000, _HOLDING, undo=_UNHOLD)

    # Refused, and nothing of the message left behind: neither the dead worker's claim nor its hold.
    assert refused == Refused(_OPEN, abandoned_released=True)
    assert store.get("Ev#k-1") is None
    assert _hold(dynamodb) is None


@pytest.mark.parametrize(
    ("payload", "lease_ms"),
    [("another payload's", 1_000), ("its lease still running", 60_000), ("its lease ending this millisecond", 2_000)],
    ids=["another-payload", "lease-running", "lease-ends-now"],
)
def test_a_refused_claim_leaves_alone_an_expired_record_that_is_no_abandoned_claim_of_its_message(
    dynamodb: Any, clock: Clock, payload: str, lease_ms: int
) -> None:
    # A record past its TTL is free to take, so the guard decides; the record is released only if it is this
    # message's claim whose lease is over (another payload's claim, or a lease that still runs, is left alone).
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=1, clock=clock)
    other = store.claim("Ev#k-1", "other" if payload == "another payload's" else "hash", lease_ms)
    assert isinstance(other, Claimed)
    clock.advance(2)

    refused = store.claim("Ev#k-1", "hash", 30_000, (_OPEN,))

    assert refused == Refused(_OPEN)
    record = store.get("Ev#k-1")
    assert record is not None and record.owner_token == other.owner_token


# A claim of the same message whose worker died: its lease ended a second before the stubbed clock's now.
_DEAD = {**_HELD, "leaseExpiresAt": {"N": "1799999999000"}}
_UNDO = (Delete(TALLIES, {"tallyId": "t-1", "entryId": "HOLD"}, condition="attribute_exists(tallyId)"),)


def _refused_meeting_the_dead_claim(stubber: Stubber) -> None:
    """The takeover's transaction refused by its guard, then its read of the record: the dead worker's claim."""
    _cancelled(stubber, {"Code": "None"}, {"Code": "ConditionalCheckFailed"})
    stubber.add_response("get_item", {"Item": _DEAD})


def test_a_refused_takeover_whose_release_stays_in_conflict_raises_naming_the_claim(
    stubbed: tuple[IdempotencyStore, Stubber],
) -> None:
    store, stubber = stubbed
    _refused_meeting_the_dead_claim(stubber)
    _cancelled(stubber, {"Code": "TransactionConflict"}, {"Code": "ConditionalCheckFailed"})

    # A conflict on the record settles nothing, whatever the undo's condition met beside it: the message comes back
    # (the release is tried again then) rather than be dead-lettered with the dead worker's hold standing.
    with pytest.raises(TransactionConflict) as raised:
        store.claim("Ev#k-1", "hash", 30_000, _GUARD, undo=_UNDO)
    assert str(raised.value) == (
        "the abandoned claim of Ev#k-1 could not be released: transaction cancelled: TransactionConflict on the record"
    )


def test_a_refused_takeovers_release_absorbs_its_conflicts_as_any_transition_does() -> None:
    client = offline_dynamodb()
    conflicts = ConflictRetry(base_ms=1, max_ms=1, margin_ms=0, sleep=lambda _: None, jitter=lambda: 0.0)
    store = IdempotencyStore(
        client, "records", ttl_seconds=60, clock=lambda: 1_800_000_000.0, new_token=lambda: "t-1", conflicts=conflicts
    )
    with Stubber(client) as stubber:
        _refused_meeting_the_dead_claim(stubber)
        _cancelled(stubber, {"Code": "TransactionConflict"}, {"Code": "None"})
        stubber.add_response("transact_write_items", {})

        refused = store.claim("Ev#k-1", "hash", 30_000, _GUARD, undo=_UNDO, remaining_ms=lambda: 30_000)

        stubber.assert_no_pending_responses()
    assert refused == Refused(_GUARD[0], abandoned_released=True)


def test_a_guard_write_that_fails_on_an_item_this_message_holds_is_refused_not_busy(
    stubbed: tuple[IdempotencyStore, Stubber],
) -> None:
    # Held by this very message (its reservation token): the write failed on its own terms, so waiting cannot help.
    store, stubber = stubbed
    held = Update(
        TALLIES,
        {"tallyId": "t-1", "entryId": "HOLD"},
        "SET holdToken = :token",
        condition="attribute_not_exists(tallyId) OR (holdToken = :token AND attribute_not_exists(cancelled))",
        values={":token": reservation_token("Ev#k-1", "hash")},
        held_by="holdToken",
    )
    mine = {"tallyId": {"S": "t-1"}, "entryId": {"S": "HOLD"}, "holdToken": {"S": reservation_token("Ev#k-1", "hash")}}
    _cancelled(stubber, {"Code": "None"}, {"Code": "ConditionalCheckFailed", "Item": mine})
    stubber.add_response("get_item", {})

    assert store.claim("Ev#k-1", "hash", 30_000, (held,)) == Refused(held)


def test_a_messages_own_single_item_write_is_told_as_a_transaction_of_one_message(dynamodb: Any, clock: Clock) -> None:
    tally = Tally()
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock, observer=tally)

    assert isinstance(store.apply_once("Ev#k-1", "hash"), Applied)
    claimed = store.claim("Ev#k-2", "hash", 30_000)
    assert isinstance(claimed, Claimed)
    assert store.release(claimed) is True

    grouping = tally.take()
    assert (grouping.transactions, grouping.messages, grouping.fell_back) == (3, 3, {})


def test_two_writes_on_one_item_are_the_handlers_error_and_nothing_is_written(store: IdempotencyStore) -> None:
    # DynamoDB refuses a transaction with two actions on one item: the handler's writes, the same on every delivery.
    entry = {"tallyId": "t-1", "entryId": "e-1"}
    twice = (Put(TALLIES, entry), Update(TALLIES, entry, "SET n = :one", values={":one": 1}))

    with pytest.raises(PoisonMessage) as refused:
        store.apply_once("Ev#k-1", "hash", None, twice)

    assert refused.value.error_type is ErrorType.INVALID_HANDLER_TRANSACTION
    assert refused.value.message.startswith("the handler's writes put two actions on one item in a transaction: ")
    assert "multiple operations on one item" in refused.value.message
    assert store.get("Ev#k-1") is None


def test_another_rejection_of_a_transaction_is_raised_as_it_is(stubbed: tuple[IdempotencyStore, Stubber]) -> None:
    # Not the handler's writes on one item: a request DynamoDB refuses may be the core's, and is retried (the redrive
    # policy bounds it), never dead-lettered as the handler's.
    store, stubber = stubbed
    stubber.add_client_error(
        "transact_write_items",
        service_error_code="ValidationException",
        service_message="One or more parameter values were invalid",
    )

    with pytest.raises(ClientError) as raised:
        store.apply_once("Ev#k-1", "hash", writes=_WRITE)
    assert not isinstance(raised.value, PoisonMessage)
    assert raised.value.response["Error"]["Code"] == "ValidationException"


@pytest.mark.parametrize("transition", ["apply_once", "commit", "release"])
def test_each_of_the_stores_transitions_runs_within_the_deadline_it_is_given(
    store: IdempotencyStore, monkeypatch: pytest.MonkeyPatch, transition: str
) -> None:
    # The deadline bounds how long a transition absorbs conflicts: each way in hands it to the one path, run_all.
    def deadline() -> int:
        return 1_000

    given: list[object] = []
    run_all = IdempotencyStore.run_all

    def spy(self: IdempotencyStore, transitions: Any, remaining_ms: Any = None) -> list[object]:
        given.append(remaining_ms)
        return run_all(self, transitions, remaining_ms)

    monkeypatch.setattr(IdempotencyStore, "run_all", spy)
    if transition == "apply_once":
        store.apply_once("TallyAdded#k-1", "hash", remaining_ms=deadline)
    else:
        claim = store.claim("TallyAdded#k-1", "hash", 60_000)
        assert isinstance(claim, Claimed)
        given.clear()
        getattr(store, transition)(claim, remaining_ms=deadline)
    assert given == [deadline]
