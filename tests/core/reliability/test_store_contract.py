"""Contract cases of the idempotency store found by the state machine, pinned one by one on DynamoDB Local."""

from __future__ import annotations

import time
import uuid

import pytest

from consumer.idempotency import Claimed, Fenced, IdempotencyStore
from consumer.idempotency.writes import Update
from testkit.dynamodb_local import DynamoDBLocal
from tests.conftest import TableFactory


class Clock:
    def __init__(self) -> None:
        self.now_s = time.time()

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture(scope="module")
def table(id_table: TableFactory) -> str:
    return id_table("contract")


def test_a_zombie_commit_with_writes_after_its_successor_released_is_lease_lost(
    dynamodb_local: DynamoDBLocal, table: str
) -> None:
    clock = Clock()
    store = IdempotencyStore(dynamodb_local.client(), table, ttl_seconds=3600, clock=clock)
    record_id = f"zombie-{uuid.uuid4().hex[:8]}"
    zombie = store.claim(record_id, "hash", lease_ms=300)
    assert isinstance(zombie, Claimed)
    clock.now_s += 1  # the zombie's lease runs out
    successor = store.claim(record_id, "hash", lease_ms=300)
    assert isinstance(successor, Claimed)
    assert store.release(successor)  # the successor failed and let the key go
    effect = Update(table=table, key={"id": f"{record_id}-effect"}, expression="ADD applied :one", values={":one": 1})

    # Without writes the same zombie is Fenced; with writes it must be too.
    assert isinstance(store.commit(zombie, {"by": "zombie"}, (effect,)), Fenced)
    assert store.get(record_id) is None
