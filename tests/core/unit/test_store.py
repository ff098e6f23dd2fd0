"""Every transition of the idempotency state machine, one test (or more) each."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from consumer.errors import BusinessConditionFailed, ErrorType, PoisonMessage, TransientError
from consumer.idempotency import (
    Applied,
    Claimed,
    Conflicted,
    Duplicate,
    Fenced,
    IdempotencyStore,
    InFlight,
    PayloadMismatch,
    Refused,
)
from consumer.idempotency.record import Status
from consumer.idempotency.writes import Put, Update
from tests.core.unit.conftest import IDEMPOTENCY_TABLE, TALLIES, Clock, entries, total

LEASE_MS = 10_000


def credit(tally: str, entry: str, amount: int) -> tuple[Update, Put]:
    """The test tally's two writes: its total, and an entry written once."""
    return (
        Update(TALLIES, {"tallyId": tally, "entryId": "TOTAL"}, "ADD tallied :amount", values={":amount": amount}),
        Put(TALLIES, {"tallyId": tally, "entryId": entry}, condition="attribute_not_exists(entryId)"),
    )


def taken_over(store: IdempotencyStore, clock: Clock, record_id: str) -> tuple[Claimed, Claimed]:
    """A claim whose lease ran out (the zombie) and the claim that took the key over."""
    zombie = store.claim(record_id, "hash-a", LEASE_MS)
    assert isinstance(zombie, Claimed)
    clock.advance(LEASE_MS / 1000 + 1)
    owner = store.claim(record_id, "hash-a", LEASE_MS)
    assert isinstance(owner, Claimed)
    return zombie, owner


# -- claim ---------------------------------------------------------------------------------


def test_claim_on_a_new_key_takes_it_with_a_lease(store: IdempotencyStore, clock: Clock) -> None:
    claim = store.claim("Tally#1", "hash-a", LEASE_MS)

    assert isinstance(claim, Claimed)
    assert claim.lease_expires_at_ms == int(clock.now * 1000) + LEASE_MS
    assert claim.attempts == 1
    record = store.get("Tally#1")
    assert record is not None
    assert record.status is Status.IN_PROGRESS
    assert record.owner_token == claim.owner_token
    assert record.payload_hash == "hash-a"
    assert record.expires_at == int(clock.now) + 3600


def test_claim_of_a_completed_key_is_a_duplicate_with_the_stored_result(store: IdempotencyStore) -> None:
    first = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(first, Claimed)
    store.commit(first, {"credited": 1250})

    second = store.claim("Tally#1", "hash-a", LEASE_MS)

    assert isinstance(second, Duplicate)
    assert second.record.result_value() == {"credited": 1250}
    assert second.record.status is Status.COMPLETED


def test_claim_while_another_lease_runs_is_in_flight_until_the_lease_end(store: IdempotencyStore) -> None:
    first = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(first, Claimed)

    second = store.claim("Tally#1", "hash-a", LEASE_MS)

    assert isinstance(second, InFlight)
    assert second.record.lease_expires_at_ms == first.lease_expires_at_ms


def test_claim_after_the_lease_ran_out_takes_the_key_over(store: IdempotencyStore, clock: Clock) -> None:
    first = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(first, Claimed)
    clock.advance(LEASE_MS / 1000 + 0.001)

    second = store.claim("Tally#1", "hash-a", LEASE_MS)

    assert isinstance(second, Claimed)
    assert second.owner_token != first.owner_token
    assert second.attempts == 2


def test_a_completed_record_lives_its_ttl_from_the_leases_end(store: IdempotencyStore, clock: Clock) -> None:
    first = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(first, Claimed)
    clock.advance(1)
    store.commit(first, "done")

    record = store.get("Tally#1")
    assert record is not None
    assert record.expires_at == first.lease_expires_at_ms // 1000 + 3600


def test_an_expired_record_counts_as_absent_before_ttl_deletes_it(store: IdempotencyStore, clock: Clock) -> None:
    first = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(first, Claimed)
    store.commit(first, "done")
    # Past expiresAt (the TTL counts from the lease's end); the item is still in the table, as after a lazy TTL.
    clock.advance(LEASE_MS / 1000 + 3601)

    assert store.get("Tally#1") is not None
    again = store.claim("Tally#1", "another-payload", LEASE_MS)

    assert isinstance(again, Claimed)


def test_claim_with_another_payload_of_a_completed_key_is_a_mismatch(store: IdempotencyStore) -> None:
    first = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(first, Claimed)
    store.commit(first, None)

    result = store.claim("Tally#1", "hash-b", LEASE_MS)

    assert isinstance(result, PayloadMismatch)
    assert result.record.payload_hash == "hash-a"


@pytest.mark.parametrize("lease", ["running", "ended"])
def test_claim_with_another_payload_of_a_claimed_key_waits_for_that_claim_to_settle(
    store: IdempotencyStore, clock: Clock, lease: str
) -> None:
    # The other content's claim may yet be released (its message refused, or a poison): the key is then this
    # content's. Told reused now, this message would be in the DLQ while another delivery of it applies it. An
    # abandoned claim is still no licence to take the key over for another payload: its own message comes back to it.
    first = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(first, Claimed)
    if lease == "ended":
        clock.advance(LEASE_MS / 1000 + 1)

    result = store.claim("Tally#1", "hash-b", LEASE_MS)

    assert isinstance(result, InFlight) and result.of_another_content
    assert result.record.payload_hash == "hash-a"
    assert store.release(first) is True
    assert isinstance(store.claim("Tally#1", "hash-b", LEASE_MS), Claimed)


def test_a_retried_claim_that_finds_its_own_token_is_ours(dynamodb: Any, clock: Clock) -> None:
    # The retry of a claim whose first attempt was applied sends the same token: it
    # fails its condition and must recognise the item as its own, not as in flight.
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock, new_token=lambda: "token-1")
    first = store.claim("Tally#1", "hash-a", LEASE_MS)
    retried = store.claim("Tally#1", "hash-a", LEASE_MS)

    assert isinstance(first, Claimed)
    assert isinstance(retried, Claimed)
    assert retried.owner_token == "token-1"
    assert retried.lease_expires_at_ms == first.lease_expires_at_ms


def test_a_claim_needs_a_positive_lease(store: IdempotencyStore) -> None:
    with pytest.raises(ValueError, match="lease must be positive"):
        store.claim("Tally#1", "hash-a", 0)


# -- commit --------------------------------------------------------------------------------


def test_commit_without_writes_completes_the_record(store: IdempotencyStore, dynamodb: Any) -> None:
    claim = store.claim("Receipt#1", "hash-a", LEASE_MS)
    assert isinstance(claim, Claimed)

    store.commit(claim, {"status": 200})

    record = store.get("Receipt#1")
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.lease_expires_at_ms is None
    assert record.result_value() == {"status": 200}


def test_commit_applies_the_business_writes_with_the_record(store: IdempotencyStore, dynamodb: Any) -> None:
    claim = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(claim, Claimed)

    store.commit(claim, "ok", credit("t-1", "ENTRY#1", 500))

    assert total(dynamodb, "t-1") == 500
    assert entries(dynamodb, "t-1") == ["ENTRY#1", "TOTAL"]
    record = store.get("Tally#1")
    assert record is not None
    assert record.status is Status.COMPLETED


def test_a_zombie_cannot_commit_over_the_owner_that_took_over(
    store: IdempotencyStore, dynamodb: Any, clock: Clock
) -> None:
    zombie, owner = taken_over(store, clock, "Tally#1")
    store.commit(owner, "owner's result", credit("t-1", "ENTRY#1", 500))

    assert isinstance(store.commit(zombie, "zombie's result", credit("t-1", "ENTRY#zombie", 500)), Fenced)

    record = store.get("Tally#1")
    assert record is not None
    assert record.owner_token == owner.owner_token
    assert record.result_value() == "owner's result"
    assert total(dynamodb, "t-1") == 500
    assert entries(dynamodb, "t-1") == ["ENTRY#1", "TOTAL"]


def test_a_zombie_cannot_commit_while_the_new_owner_is_still_running(store: IdempotencyStore, clock: Clock) -> None:
    zombie, owner = taken_over(store, clock, "Tally#1")

    lost = store.commit(zombie, "late")

    assert isinstance(lost, Fenced)
    assert lost.current is not None
    assert lost.current.owner_token == owner.owner_token
    record = store.get("Tally#1")
    assert record is not None
    assert record.status is Status.IN_PROGRESS


def test_a_zombie_commit_with_writes_after_the_new_owner_released_is_lease_lost(
    store: IdempotencyStore, dynamodb: Any, clock: Clock
) -> None:
    zombie, owner = taken_over(store, clock, "Tally#1")
    assert store.release(owner)

    assert isinstance(store.commit(zombie, None, credit("t-1", "ENTRY#1", 500)), Fenced)
    assert total(dynamodb, "t-1") == 0


def test_commit_after_the_record_was_released_is_lease_lost(store: IdempotencyStore) -> None:
    claim = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(claim, Claimed)
    assert store.release(claim)

    assert isinstance(store.commit(claim, None), Fenced)
    assert store.get("Tally#1") is None


def test_a_retried_commit_that_finds_its_own_completion_succeeds(store: IdempotencyStore) -> None:
    claim = store.claim("Receipt#1", "hash-a", LEASE_MS)
    assert isinstance(claim, Claimed)
    store.commit(claim, "first")

    store.commit(claim, "first")  # the retry of a commit whose answer was lost

    record = store.get("Receipt#1")
    assert record is not None
    assert record.status is Status.COMPLETED


def test_a_retried_transactional_commit_applies_the_writes_once(store: IdempotencyStore, dynamodb: Any) -> None:
    claim = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(claim, Claimed)
    writes = credit("t-1", "ENTRY#1", 700)
    store.commit(claim, None, writes)

    store.commit(claim, None, writes)

    assert total(dynamodb, "t-1") == 700


def test_a_failed_business_condition_cancels_the_commit(store: IdempotencyStore, dynamodb: Any) -> None:
    dynamodb.put_item(TableName=TALLIES, Item={"tallyId": {"S": "t-1"}, "entryId": {"S": "ENTRY#1"}})
    claim = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(claim, Claimed)

    refused = store.commit(claim, None, credit("t-1", "ENTRY#1", 700))
    assert isinstance(refused, Refused)
    assert "attribute_not_exists" in str(BusinessConditionFailed(refused.write))

    assert total(dynamodb, "t-1") == 0
    record = store.get("Tally#1")
    assert record is not None
    assert record.status is Status.IN_PROGRESS  # still ours, to release


def test_a_result_too_large_for_the_item_is_stored_as_a_digest(dynamodb: Any, clock: Clock) -> None:
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, result_max_bytes=1024, clock=clock)
    claim = store.claim("Report#1", "hash-a", LEASE_MS)
    assert isinstance(claim, Claimed)
    big = {"rows": ["x" * 100] * 50}

    store.commit(claim, big)

    record = store.get("Report#1")
    assert record is not None
    assert record.status is Status.COMPLETED
    stored = record.result_value()
    assert stored["resultDigest"].startswith("sha256:")
    assert stored["resultBytes"] == len(json.dumps(big, separators=(",", ":"), sort_keys=True))


# -- release -------------------------------------------------------------------------------


def test_release_frees_the_key_for_an_immediate_retry(store: IdempotencyStore) -> None:
    claim = store.claim("Receipt#1", "hash-a", LEASE_MS)
    assert isinstance(claim, Claimed)

    assert store.release(claim) is True

    assert store.get("Receipt#1") is None
    assert isinstance(store.claim("Receipt#1", "hash-a", LEASE_MS), Claimed)


def test_a_zombie_cannot_release_the_new_owners_claim(store: IdempotencyStore, clock: Clock) -> None:
    zombie, owner = taken_over(store, clock, "Receipt#1")

    assert store.release(zombie) is False

    record = store.get("Receipt#1")
    assert record is not None
    assert record.owner_token == owner.owner_token


@pytest.mark.parametrize("undo", [False, True])
def test_a_release_that_finds_no_record_standing_says_so_and_one_that_finds_another_owners_does_not(
    store: IdempotencyStore, dynamodb: Any, clock: Clock, undo: bool
) -> None:
    # The processor dead-letters a refused message only when nothing of the key stands: gone (an earlier release of
    # its own, its answer lost, or the newer owner's) is True; a newer owner's record is False, its outcome to give.
    writes = credit("t-1", "ENTRY#1", 500) if undo else ()
    zombie, owner = taken_over(store, clock, "Receipt#1")
    assert store.release(zombie, writes) is False
    assert store.release(owner) is True

    assert store.release(owner, writes) is True
    assert store.release(zombie, writes) is True
    assert store.get("Receipt#1") is None
    assert total(dynamodb, "t-1") == 0


def test_release_never_deletes_a_completed_record(store: IdempotencyStore) -> None:
    claim = store.claim("Receipt#1", "hash-a", LEASE_MS)
    assert isinstance(claim, Claimed)
    store.commit(claim, "done")

    assert store.release(claim) is False
    assert isinstance(store.claim("Receipt#1", "hash-a", LEASE_MS), Duplicate)


# -- apply_once (optimistic) ---------------------------------------------------------------


def test_apply_once_writes_record_and_effect_together(store: IdempotencyStore, dynamodb: Any) -> None:
    result = store.apply_once("Tally#1", "hash-a", {"credited": 500}, credit("t-1", "ENTRY#1", 500))

    assert isinstance(result, Applied)
    assert total(dynamodb, "t-1") == 500
    record = store.get("Tally#1")
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.attempts == 1


def test_apply_once_of_a_duplicate_applies_nothing(store: IdempotencyStore, dynamodb: Any) -> None:
    store.apply_once("Tally#1", "hash-a", None, credit("t-1", "ENTRY#1", 500))

    again = store.apply_once("Tally#1", "hash-a", None, credit("t-1", "ENTRY#1", 500))

    assert isinstance(again, Duplicate)
    assert total(dynamodb, "t-1") == 500


def test_apply_once_while_a_lock_claim_runs_is_in_flight(store: IdempotencyStore, dynamodb: Any) -> None:
    assert isinstance(store.claim("Tally#1", "hash-a", LEASE_MS), Claimed)

    result = store.apply_once("Tally#1", "hash-a", None, credit("t-1", "ENTRY#1", 500))

    assert isinstance(result, InFlight)
    assert total(dynamodb, "t-1") == 0


def test_apply_once_takes_over_an_abandoned_claim(store: IdempotencyStore, dynamodb: Any, clock: Clock) -> None:
    assert isinstance(store.claim("Tally#1", "hash-a", LEASE_MS), Claimed)
    clock.advance(LEASE_MS / 1000 + 1)

    result = store.apply_once("Tally#1", "hash-a", None, credit("t-1", "ENTRY#1", 500))

    assert isinstance(result, Applied)
    assert total(dynamodb, "t-1") == 500


def test_apply_once_with_another_payload_is_a_mismatch(store: IdempotencyStore, dynamodb: Any) -> None:
    store.apply_once("Tally#1", "hash-a", None, credit("t-1", "ENTRY#1", 500))

    result = store.apply_once("Tally#1", "hash-b", None, credit("t-1", "ENTRY#2", 900))

    assert isinstance(result, PayloadMismatch)
    assert total(dynamodb, "t-1") == 500


def test_apply_once_on_an_expired_record_applies_again(store: IdempotencyStore, dynamodb: Any, clock: Clock) -> None:
    store.apply_once("Tally#1", "hash-a", None, credit("t-1", "ENTRY#1", 500))
    clock.advance(3601)

    result = store.apply_once("Tally#1", "hash-a", None, credit("t-1", "ENTRY#2", 300))

    assert isinstance(result, Applied)
    assert total(dynamodb, "t-1") == 800


def test_a_retried_apply_once_that_finds_its_own_token_is_applied_once(dynamodb: Any, clock: Clock) -> None:
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock, new_token=lambda: "token-1")
    writes = credit("t-1", "ENTRY#1", 500)

    first = store.apply_once("Tally#1", "hash-a", None, writes)
    retried = store.apply_once("Tally#1", "hash-a", None, writes)

    assert isinstance(first, Applied)
    assert isinstance(retried, Applied)
    assert total(dynamodb, "t-1") == 500


def test_apply_once_without_writes_uses_a_single_update(store: IdempotencyStore) -> None:
    assert isinstance(store.apply_once("Ping#1", "hash-a", "pong"), Applied)
    assert isinstance(store.apply_once("Ping#1", "hash-a", "pong"), Duplicate)


def test_apply_once_refuses_more_writes_than_a_transaction_holds(store: IdempotencyStore) -> None:
    writes = [Put(TALLIES, {"tallyId": "a", "entryId": str(i)}) for i in range(100)]
    with pytest.raises(PoisonMessage, match="at most 99 business writes") as refused:
        store.apply_once("Bulk#1", "hash-a", None, writes)
    assert refused.value.error_type is ErrorType.INVALID_HANDLER_TRANSACTION


# -- DynamoDB errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("ProvisionedThroughputExceededException", 400),
        ("ThrottlingException", 400),
        ("InternalServerError", 500),
    ],
)
def test_throttling_and_server_errors_are_transient(
    store: IdempotencyStore, dynamodb: Any, code: str, status: int
) -> None:
    with Stubber(dynamodb) as stub:
        stub.add_client_error("update_item", service_error_code=code, http_status_code=status)
        with pytest.raises(TransientError, match=code):
            store.claim("Tally#1", "hash-a", LEASE_MS)


def test_a_single_item_transaction_conflict_is_answered_as_conflicted(store: IdempotencyStore, dynamodb: Any) -> None:
    with Stubber(dynamodb) as stub:
        stub.add_client_error("update_item", service_error_code="TransactionConflictException", http_status_code=400)
        conflicted = store.claim("Tally#1", "hash-a", LEASE_MS)
    assert isinstance(conflicted, Conflicted)
    assert "TransactionConflictException" in conflicted.reason


def test_a_cancelled_transaction_in_conflict_without_a_failed_condition_is_conflicted(
    store: IdempotencyStore, dynamodb: Any
) -> None:
    with Stubber(dynamodb) as stub:
        stub.add_client_error(
            "transact_write_items",
            service_error_code="TransactionCanceledException",
            http_status_code=400,
            modeled_fields={
                "CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict"}, {"Code": "None"}]
            },
        )
        conflicted = store.apply_once("Tally#1", "hash-a", None, credit("t-1", "ENTRY#1", 500))
    assert isinstance(conflicted, Conflicted)
    assert "TransactionConflict" in conflicted.reason


def test_a_validation_error_is_not_mistaken_for_a_transient_one(store: IdempotencyStore, dynamodb: Any) -> None:
    with Stubber(dynamodb) as stub:
        stub.add_client_error("update_item", service_error_code="ValidationException", http_status_code=400)
        with pytest.raises(ClientError) as error:
            store.claim("Tally#1", "hash-a", LEASE_MS)
    assert not isinstance(error.value, TransientError)


# -- the record's place: its own item, named by the key, whatever the business writes are ------------


def tally_item(dynamodb: Any, tally: str, entry: str) -> dict[str, Any] | None:
    key = {"tallyId": {"S": tally}, "entryId": {"S": entry}}
    item: dict[str, Any] | None = dynamodb.get_item(TableName=TALLIES, Key=key, ConsistentRead=True).get("Item")
    return item


def test_the_record_keeps_an_item_of_its_own_beside_the_business_items(store: IdempotencyStore, dynamodb: Any) -> None:
    result = store.apply_once("Tally#k", "hash-a", {"credited": 500}, credit("t-1", "ENTRY#1", 500))

    assert isinstance(result, Applied)
    record = store.get("Tally#k")
    assert record is not None and record.status is Status.COMPLETED and record.expires_at is not None
    entry = tally_item(dynamodb, "t-1", "ENTRY#1")
    assert entry is not None and "ownerToken" not in entry and "payloadHash" not in entry


def test_a_key_reused_for_another_business_item_is_a_mismatch_and_applies_nothing(
    store: IdempotencyStore, dynamodb: Any
) -> None:
    # The key first named entry 1 on t-1; reused for entry 2 on t-2, it lands on other
    # items altogether: only the record, named by the key, can see the reuse.
    store.apply_once("Tally#k", "hash-a", None, credit("t-1", "ENTRY#1", 500))

    again = store.apply_once("Tally#k", "hash-b", None, credit("t-2", "ENTRY#2", 700))

    assert isinstance(again, PayloadMismatch)
    assert (total(dynamodb, "t-1"), total(dynamodb, "t-2")) == (500, 0)
    assert tally_item(dynamodb, "t-2", "ENTRY#2") is None


def test_the_same_business_item_under_another_key_is_a_failed_business_condition(
    store: IdempotencyStore, dynamodb: Any
) -> None:
    store.apply_once("Tally#1", "hash-a", None, credit("t-1", "ENTRY#1", 500))

    assert isinstance(store.apply_once("Tally#other-key", "hash-a", None, credit("t-1", "ENTRY#1", 500)), Refused)
    assert total(dynamodb, "t-1") == 500
    assert store.get("Tally#other-key") is None
