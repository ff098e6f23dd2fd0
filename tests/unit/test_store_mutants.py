"""The store's promises that `make mutation` found untested in the fast tests."""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from consumer.errors import BusinessConditionFailed, TransientError
from consumer.idempotency.record import Status
from consumer.idempotency.store import Applied, Claimed, Fenced, IdempotencyStore
from consumer.idempotency.writes import Update
from tests.unit.conftest import TALLIES, Clock


def test_a_read_is_strongly_consistent() -> None:
    # An eventually consistent read may miss a commit made a moment ago: get() promises the latest write.
    client = boto3.client("dynamodb", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
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
    client = boto3.client("dynamodb", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
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
