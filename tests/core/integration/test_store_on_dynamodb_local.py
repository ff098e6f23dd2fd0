"""The store's transactions on DynamoDB Local, where a ClientRequestToken is held to its request.

moto accepts a reused token with other parameters; DynamoDB (and DynamoDB Local) refuse it as an
idempotent-parameter mismatch for ten minutes. So each transition's token must belong to that
claim alone, and a repeated transition must send the very same request.
"""

from __future__ import annotations

import pytest

from consumer.idempotency import Claimed, IdempotencyStore
from consumer.idempotency.record import Status
from consumer.idempotency.writes import Put, Update
from testkit.dynamodb_local import DynamoDBLocal
from tests.conftest import TableFactory

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tables(id_table: TableFactory) -> tuple[str, str]:
    return id_table("records"), id_table("business")


@pytest.fixture
def store(dynamodb_local: DynamoDBLocal, tables: tuple[str, str]) -> IdempotencyStore:
    return IdempotencyStore(dynamodb_local.client(), tables[0], ttl_seconds=3600)


def put(table: str, item_id: str) -> Put:
    return Put(table=table, item={"id": item_id}, condition="attribute_not_exists(id)")


def business_ids(dynamodb_local: DynamoDBLocal, table: str) -> set[str]:
    items = dynamodb_local.client().scan(TableName=table, ConsistentRead=True)["Items"]
    return {item["id"]["S"] for item in items}


def claim(store: IdempotencyStore, record_id: str) -> Claimed:
    claimed = store.claim(record_id, "hash", lease_ms=30_000)
    assert isinstance(claimed, Claimed)
    return claimed


def test_commits_of_two_claims_are_two_transactions(
    store: IdempotencyStore, dynamodb_local: DynamoDBLocal, tables: tuple[str, str]
) -> None:
    first, second = claim(store, "commit-1"), claim(store, "commit-2")

    store.commit(first, {"n": 1}, writes=[put(tables[1], "commit-1")])
    store.commit(second, {"n": 2}, writes=[put(tables[1], "commit-2")])

    assert {"commit-1", "commit-2"} <= business_ids(dynamodb_local, tables[1])
    for claimed, n in ((first, 1), (second, 2)):
        record = store.get(claimed.record_id)
        assert record is not None
        assert (record.status, record.owner_token, record.result_value()) == (
            Status.COMPLETED,
            claimed.owner_token,
            {"n": n},
        )


def test_a_repeated_commit_sends_the_same_transaction(
    store: IdempotencyStore, dynamodb_local: DynamoDBLocal, tables: tuple[str, str]
) -> None:
    claimed = claim(store, "commit-again")
    writes = [Update(table=tables[1], key={"id": "counter"}, expression="ADD n :one", values={":one": 1})]

    store.commit(claimed, "done", writes=writes)
    store.commit(claimed, "done", writes=writes)  # an answer lost, the call repeated

    counter = dynamodb_local.client().get_item(TableName=tables[1], Key={"id": {"S": "counter"}}, ConsistentRead=True)
    assert counter["Item"]["n"] == {"N": "1"}


def test_releases_of_two_claims_are_two_transactions(
    store: IdempotencyStore, dynamodb_local: DynamoDBLocal, tables: tuple[str, str]
) -> None:
    first, second = claim(store, "release-1"), claim(store, "release-2")

    assert store.release(first, undo=[put(tables[1], "undone-1")])
    assert store.release(second, undo=[put(tables[1], "undone-2")])

    assert {"undone-1", "undone-2"} <= business_ids(dynamodb_local, tables[1])
    assert store.get("release-1") is None
    assert store.get("release-2") is None


def test_guarded_claims_and_applies_are_transactions_of_their_own(
    store: IdempotencyStore, dynamodb_local: DynamoDBLocal, tables: tuple[str, str]
) -> None:
    for index in (1, 2):
        claimed = store.claim(f"guarded-{index}", "hash", lease_ms=30_000, guard=[put(tables[1], f"guard-{index}")])
        assert isinstance(claimed, Claimed)
        store.apply_once(f"applied-{index}", "hash", "ok", writes=[put(tables[1], f"apply-{index}")])

    assert {"guard-1", "guard-2", "apply-1", "apply-2"} <= business_ids(dynamodb_local, tables[1])
