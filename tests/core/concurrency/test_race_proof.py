"""DynamoDB Local serializes each item's conditional writes, as DynamoDB does.

Every concurrency claim of this project rests on that, so it is proven here first:
many threads race on one key; a naive read-then-write lets several of them "win",
the conditional claim lets exactly one. moto in process fails this proof (it does
not serialize), which is why no concurrency test runs on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from consumer.idempotency import Claimed, IdempotencyStore
from testkit.dynamodb_local import DynamoDBLocal
from tests.conftest import TableFactory

THREADS = 12
ROUNDS = 15
# The think time between the read and the write of the naive version: any real
# handler has at least this much, and it makes the race window visible.
THINK_S = 0.005


@pytest.fixture(scope="module")
def race_table(id_table: TableFactory) -> str:
    return id_table("race")


def race(attempt: Callable[[Any, str, int], bool], clients: list[Any], key: str) -> int:
    """All threads attempt ``key`` at the same instant; returns how many believed they won."""
    barrier = threading.Barrier(THREADS)

    def one(worker: int) -> bool:
        barrier.wait()
        return attempt(clients[worker], key, worker)

    with ThreadPoolExecutor(THREADS) as pool:
        return sum(pool.map(one, range(THREADS)))


def naive_claim(table: str) -> Callable[[Any, str, int], bool]:
    def attempt(client: Any, key: str, worker: int) -> bool:
        found = client.get_item(TableName=table, Key={"id": {"S": key}}, ConsistentRead=True).get("Item")
        if found:
            return False
        time.sleep(THINK_S)
        client.put_item(TableName=table, Item={"id": {"S": key}, "owner": {"S": str(worker)}})
        return True

    return attempt


def conditional_claim(table: str) -> Callable[[Any, str, int], bool]:
    def attempt(client: Any, key: str, worker: int) -> bool:
        time.sleep(THINK_S)  # the same think time: it must not matter here
        store = IdempotencyStore(client, table, ttl_seconds=3600)
        return isinstance(store.claim(key, "same-payload", 60_000), Claimed)

    return attempt


@pytest.fixture(scope="module")
def clients(dynamodb_local: DynamoDBLocal) -> list[Any]:
    # One client per thread, as separate Lambda containers would have.
    return [dynamodb_local.client() for _ in range(THREADS)]


def test_a_naive_read_then_write_lets_several_workers_win_the_same_key(race_table: str, clients: list[Any]) -> None:
    winners = [race(naive_claim(race_table), clients, f"naive-{round_}") for round_ in range(ROUNDS)]

    assert all(count >= 1 for count in winners)
    assert max(winners) > 1, f"no double winner in {ROUNDS} rounds: the race proof proves nothing ({winners})"


def test_the_conditional_claim_has_exactly_one_winner_every_time(race_table: str, clients: list[Any]) -> None:
    winners = [race(conditional_claim(race_table), clients, f"claim-{round_}") for round_ in range(ROUNDS)]

    assert winners == [1] * ROUNDS


def test_concurrent_atomic_adds_lose_no_update(race_table: str, clients: list[Any]) -> None:
    def add(client: Any, key: str, worker: int) -> bool:
        for _ in range(10):
            client.update_item(
                TableName=race_table,
                Key={"id": {"S": key}},
                UpdateExpression="ADD hits :one",
                ExpressionAttributeValues={":one": {"N": "1"}},
            )
        return True

    race(add, clients, "counter")

    item = clients[0].get_item(TableName=race_table, Key={"id": {"S": "counter"}}, ConsistentRead=True)["Item"]
    assert int(item["hits"]["N"]) == THREADS * 10
