"""The conflict proxy in front of DynamoDB Local: conflicts where DynamoDB raises them, nothing else changed.

Both halves are proven on the same DynamoDB Local: a hot-item load that it serialises
(no conflict when reached directly) yields conflicts through the proxy; ordinary traffic
gets the same answers either way. botocore retries neither conflict error (asserted), so
every conflict the proxy raises is visible to the caller.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import ClientError

from testkit.aws import client
from testkit.conflict_emulation import ConflictEmulation, ConflictProxy
from testkit.conflict_proxy import main as proxy_main
from testkit.conflict_rules import CONFLICT_MESSAGE
from testkit.dynamodb_local import DynamoDBLocal
from testkit.processes import LOOPBACK
from tests.conftest import TableFactory
from tests.core.handlers import TALLY_TABLE, create_test_tables

THREADS = 8
TRANSACTIONS_PER_THREAD = 60
# Long enough that the test's own requests surely land while the transaction is held.
SLOW_HOLD_MS = 600.0
HOT = {"id": {"S": "hot"}}


@pytest.fixture(scope="module")
def table(id_table: TableFactory) -> str:
    return id_table("conflicts")


@pytest.fixture(scope="module")
def tallies(dynamodb_local: DynamoDBLocal) -> Iterator[str]:
    """The test tally's table (partition and sort key), so puts' keys come from the key schema."""
    name = f"tally-{uuid.uuid4().hex[:8]}"
    create_test_tables(dynamodb_local.client(), {TALLY_TABLE: name})
    yield name
    dynamodb_local.client().delete_table(TableName=name)


@pytest.fixture(scope="module")
def slow_proxy(dynamodb_local: DynamoDBLocal) -> Iterator[ConflictProxy]:
    """A second proxy on the same DynamoDB Local whose transactions stay in flight for a long time."""
    with ConflictProxy(dynamodb_local.direct_endpoint_url, ConflictEmulation(hold_ms=SLOW_HOLD_MS)) as proxy:
        yield proxy


def _credit(table: str, entry: str) -> list[dict[str, Any]]:
    """A tally entry's shape: a new entry and the hot total, the total at index 1."""
    return [
        {"Put": {"TableName": table, "Item": {"id": {"S": entry}}}},
        {
            "Update": {
                "TableName": table,
                "Key": HOT,
                "UpdateExpression": "ADD balance :one",
                "ExpressionAttributeValues": {":one": {"N": "1"}},
            }
        },
    ]


def _hot_load(dynamodb: Any, table: str, run: str) -> Counter[str]:
    """THREADS x TRANSACTIONS_PER_THREAD credits on one item; outcomes by error code (``applied`` on success)."""
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def worker(thread: int) -> None:
        barrier.wait()
        for index in range(TRANSACTIONS_PER_THREAD):
            try:
                dynamodb.transact_write_items(TransactItems=_credit(table, f"{run}-{thread}-{index}"))
                outcome = "applied"
            except ClientError as error:
                outcome = error.response["Error"]["Code"]
                if outcome == "TransactionCanceledException":
                    assert error.response["CancellationReasons"] == [
                        {"Code": "None"},
                        {"Code": "TransactionConflict", "Message": CONFLICT_MESSAGE},
                    ]
                    assert error.response["ResponseMetadata"]["RetryAttempts"] == 0
            with lock:
                outcomes[outcome] += 1

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(worker, range(THREADS)))
    return outcomes


def _balance(dynamodb: Any, table: str) -> int:
    item = dynamodb.get_item(TableName=table, Key=HOT, ConsistentRead=True).get("Item")
    return int(item["balance"]["N"]) if item else 0


def test_dynamodb_local_alone_never_conflicts_on_a_hot_item(dynamodb_local: DynamoDBLocal, table: str) -> None:
    direct = dynamodb_local.client(direct=True, max_pool_connections=THREADS)
    before = _balance(direct, table)
    outcomes = _hot_load(direct, table, "direct")
    assert outcomes == Counter({"applied": THREADS * TRANSACTIONS_PER_THREAD})
    assert _balance(direct, table) - before == THREADS * TRANSACTIONS_PER_THREAD


def test_the_proxy_cancels_overlapping_transactions_on_a_hot_item(dynamodb_local: DynamoDBLocal, table: str) -> None:
    dynamodb = dynamodb_local.client(max_pool_connections=THREADS)
    assert dynamodb_local.proxy is not None
    seen_before = dynamodb_local.proxy.stats()
    before = _balance(dynamodb, table)
    outcomes = _hot_load(dynamodb, table, "proxied")
    seen = dynamodb_local.proxy.stats()
    assert seen["transactions"] - seen_before.get("transactions", 0) == THREADS * TRANSACTIONS_PER_THREAD
    cancelled = seen["transactions_cancelled"] - seen_before.get("transactions_cancelled", 0)
    assert cancelled == outcomes["TransactionCanceledException"]
    assert set(outcomes) == {"applied", "TransactionCanceledException"}
    assert outcomes["TransactionCanceledException"] > 0
    assert sum(outcomes.values()) == THREADS * TRANSACTIONS_PER_THREAD
    # A cancelled transaction applied nothing; every applied one was applied once.
    assert _balance(dynamodb, table) - before == outcomes["applied"]


@pytest.fixture
def in_flight(slow_proxy: ConflictProxy, tallies: str) -> Iterator[dict[str, Any]]:
    """A transaction on a tally's total, held by ``slow_proxy`` for the duration of the test body."""
    dynamodb = client("dynamodb", slow_proxy.endpoint_url, timeout_s=30.0)
    tally = f"t-{uuid.uuid4().hex[:6]}"
    total = {"tallyId": {"S": tally}, "entryId": {"S": "TOTAL"}}
    started = threading.Event()

    def transaction() -> None:
        started.set()
        dynamodb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": tallies, "Item": {**total, "tallied": {"N": "100"}}}},
                {"Put": {"TableName": tallies, "Item": {"tallyId": {"S": tally}, "entryId": {"S": "ENTRY#1"}}}},
            ]
        )

    worker = threading.Thread(target=transaction)
    worker.start()
    started.wait()
    time.sleep(SLOW_HOLD_MS / 1000 / 4)
    yield {"client": dynamodb, "table": tallies, "total": total, "tally": tally, "proxy": slow_proxy}
    worker.join()


def test_single_item_writes_on_a_held_item_fail_with_transaction_conflict(in_flight: dict[str, Any]) -> None:
    dynamodb, table, total = in_flight["client"], in_flight["table"], in_flight["total"]
    update = {"UpdateExpression": "SET touched = :t", "ExpressionAttributeValues": {":t": {"S": "x"}}}
    calls = [
        lambda: dynamodb.update_item(TableName=table, Key=total, **update),
        # The put's key comes from its Item through the table's key schema.
        lambda: dynamodb.put_item(TableName=table, Item={**total, "other": {"S": "y"}}),
        lambda: dynamodb.delete_item(TableName=table, Key=total),
    ]
    refused_before = in_flight["proxy"].stats().get("writes_refused", 0)
    for call in calls:
        with pytest.raises(ClientError) as failed:
            call()
        assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert failed.value.response["Error"] == {"Code": "TransactionConflictException", "Message": CONFLICT_MESSAGE}
        assert failed.value.response["ResponseMetadata"]["RetryAttempts"] == 0
    assert in_flight["proxy"].stats()["writes_refused"] - refused_before == len(calls)


def test_an_overlapping_transaction_is_cancelled_at_the_held_index_only(in_flight: dict[str, Any]) -> None:
    dynamodb, table, total = in_flight["client"], in_flight["table"], in_flight["total"]
    other = {"tallyId": {"S": in_flight["tally"]}, "entryId": {"S": "ENTRY#2"}}
    with pytest.raises(ClientError) as failed:
        dynamodb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": table, "Item": other}},
                {
                    "ConditionCheck": {
                        "TableName": table,
                        "Key": total,
                        "ConditionExpression": "attribute_exists(tallyId)",
                    }
                },
            ]
        )
    assert failed.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert failed.value.response["Error"]["Message"] == (
        "Transaction cancelled, please refer cancellation reasons for specific reasons [None, TransactionConflict]"
    )
    assert failed.value.response["CancellationReasons"] == [
        {"Code": "None"},
        {"Code": "TransactionConflict", "Message": CONFLICT_MESSAGE},
    ]
    assert "Item" not in dynamodb.get_item(TableName=table, Key=other, ConsistentRead=True)


def test_other_items_do_not_wait_for_an_in_flight_transaction(in_flight: dict[str, Any]) -> None:
    dynamodb, table = in_flight["client"], in_flight["table"]
    elsewhere = {"tallyId": {"S": in_flight["tally"]}, "entryId": {"S": "ENTRY#3"}}
    update = {"UpdateExpression": "SET n = :n", "ExpressionAttributeValues": {":n": {"N": "1"}}}
    # The first call of an operation loads botocore's model: not what is measured.
    dynamodb.update_item(TableName=table, Key={**elsewhere, "entryId": {"S": "WARM-UP"}}, **update)
    started = time.monotonic()
    dynamodb.update_item(TableName=table, Key=elsewhere, **update)
    assert time.monotonic() - started < SLOW_HOLD_MS / 1000 / 2
    started = time.monotonic()
    dynamodb.transact_write_items(TransactItems=[{"Delete": {"TableName": table, "Key": elsewhere}}])
    # Its own hold, not also the remainder of the one in flight.
    assert time.monotonic() - started < SLOW_HOLD_MS / 1000 * 1.5


def test_the_item_is_free_once_the_transaction_ends(slow_proxy: ConflictProxy, tallies: str) -> None:
    dynamodb = client("dynamodb", slow_proxy.endpoint_url, timeout_s=30.0)
    key = {"tallyId": {"S": f"t-{uuid.uuid4().hex[:6]}"}, "entryId": {"S": "TOTAL"}}
    dynamodb.transact_write_items(TransactItems=[{"Put": {"TableName": tallies, "Item": key}}])
    dynamodb.update_item(
        TableName=tallies, Key=key, UpdateExpression="SET n = :n", ExpressionAttributeValues={":n": {"N": "1"}}
    )
    assert dynamodb.get_item(TableName=tallies, Key=key, ConsistentRead=True)["Item"]["n"] == {"N": "1"}


def _both(dynamodb_local: DynamoDBLocal) -> tuple[Any, Any]:
    return dynamodb_local.client(), dynamodb_local.client(direct=True)


def _error(call: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as failed:
        call()
    response = dict(failed.value.response)
    response.pop("ResponseMetadata")
    return response


def test_ordinary_answers_are_the_same_through_the_proxy(dynamodb_local: DynamoDBLocal, table: str) -> None:
    proxied, direct = _both(dynamodb_local)
    key = {"id": {"S": f"plain-{uuid.uuid4().hex[:6]}"}}
    item = {**key, "payload": {"S": "é" * 100}, "n": {"N": "7"}, "blob": {"B": b"\x00\xff" * 64}}
    proxied.put_item(TableName=table, Item=item)
    read = {"TableName": table, "Key": key, "ConsistentRead": True}
    assert proxied.get_item(**read)["Item"] == direct.get_item(**read)["Item"] == item

    updated = {
        "TableName": table,
        "Key": key,
        "UpdateExpression": "ADD n :one",
        "ExpressionAttributeValues": {":one": {"N": "1"}},
        "ReturnValues": "UPDATED_NEW",
    }
    assert proxied.update_item(**updated)["Attributes"] == {"n": {"N": "8"}}
    assert direct.update_item(**updated)["Attributes"] == {"n": {"N": "9"}}
    transact = {"TransactItems": [{"Delete": {"TableName": table, "Key": key}}]}
    assert proxied.transact_write_items(**transact)["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert "Item" not in direct.get_item(**read)


def test_failed_conditions_come_through_with_the_old_item(dynamodb_local: DynamoDBLocal, table: str) -> None:
    proxied, direct = _both(dynamodb_local)
    key = {"id": {"S": f"cond-{uuid.uuid4().hex[:6]}"}}
    direct.put_item(TableName=table, Item={**key, "owner": {"S": "first"}})
    put = {
        "TableName": table,
        "Item": {**key, "owner": {"S": "second"}},
        "ConditionExpression": "attribute_not_exists(id)",
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }
    single = _error(lambda: proxied.put_item(**put))
    assert single == _error(lambda: direct.put_item(**put))
    assert single["Error"]["Code"] == "ConditionalCheckFailedException"
    assert single["Item"] == {**key, "owner": {"S": "first"}}

    cancelled = {"TransactItems": [{"Put": {"TableName": table, "Item": {"id": {"S": "fresh"}}}}, {"Put": put}]}
    through = _error(lambda: proxied.transact_write_items(**cancelled))
    assert through == _error(lambda: direct.transact_write_items(**cancelled))
    assert through["CancellationReasons"][1]["Code"] == "ConditionalCheckFailed"
    assert through["CancellationReasons"][1]["Item"] == {**key, "owner": {"S": "first"}}


def test_errors_pass_through_unchanged(dynamodb_local: DynamoDBLocal, table: str) -> None:
    proxied, direct = _both(dynamodb_local)
    missing = {"TableName": f"missing-{uuid.uuid4().hex[:6]}", "Item": {"id": {"S": "x"}}}
    assert _error(lambda: proxied.put_item(**missing)) == _error(lambda: direct.put_item(**missing))
    # A transaction on a missing table: no key schema to read, so it is forwarded and refused there.
    transaction = {"TransactItems": [{"Put": missing}]}
    refused = _error(lambda: proxied.transact_write_items(**transaction))
    assert refused == _error(lambda: direct.transact_write_items(**transaction))
    assert refused["Error"]["Code"] == "ResourceNotFoundException"
    invalid = {"TableName": table, "Key": {"id": {"S": ""}}}
    invalid_through = _error(lambda: proxied.get_item(**invalid))
    assert invalid_through == _error(lambda: direct.get_item(**invalid))
    assert invalid_through["Error"]["Code"] == "ValidationException"


def test_the_off_switch_forwards_overlapping_transactions(dynamodb_local: DynamoDBLocal, table: str) -> None:
    with ConflictProxy(dynamodb_local.direct_endpoint_url, ConflictEmulation(conflicts=False)) as proxy:
        dynamodb = client("dynamodb", proxy.endpoint_url, max_pool_connections=THREADS)
        before = _balance(dynamodb, table)
        outcomes = _hot_load(dynamodb, table, "off")
        assert _balance(dynamodb, table) - before == THREADS * TRANSACTIONS_PER_THREAD
    assert outcomes == Counter({"applied": THREADS * TRANSACTIONS_PER_THREAD})


def test_injected_latency_delays_every_call(dynamodb_local: DynamoDBLocal) -> None:
    with ConflictProxy(dynamodb_local.direct_endpoint_url, ConflictEmulation(latency_ms=200.0)) as proxy:
        dynamodb = client("dynamodb", proxy.endpoint_url)
        started = time.monotonic()
        dynamodb.list_tables(Limit=1)
        assert time.monotonic() - started >= 0.2


def test_the_proxy_stops_with_dynamodb_local() -> None:
    server = DynamoDBLocal().start()
    assert server.proxy is not None
    proxy_pid, endpoint = server.proxy.pid, server.endpoint_url
    assert proxy_pid is not None
    assert endpoint != server.direct_endpoint_url
    assert endpoint.startswith(f"http://{LOOPBACK}:")
    server.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(proxy_pid, 0)
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.endpoint_url


@pytest.mark.parametrize(
    ("arguments", "cause"),
    [
        (["--upstream", "ftp://127.0.0.1:1", "--port", "0"], "upstream must be http://host:port"),
        (["--upstream", "http://127.0.0.1:1", "--port", "0", "--hold-ms", "-1"], "hold must be >= 0"),
        (["--upstream", "http://127.0.0.1:1", "--port", "0", "--latency-ms", "-5"], "latency must be >= 0"),
    ],
)
def test_bad_proxy_arguments_are_refused(arguments: list[str], cause: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert proxy_main(arguments) == 2
    assert cause in capsys.readouterr().err


def _median_call_ms(dynamodb: Any, table: str, calls: int = 40) -> float:
    durations = []
    for _ in range(calls):
        started = time.perf_counter()
        dynamodb.get_item(TableName=table, Key=HOT)
        durations.append((time.perf_counter() - started) * 1000)
    return statistics.median(durations)


def test_the_proxy_adds_no_delay_of_its_own(dynamodb_local: DynamoDBLocal, table: str) -> None:
    proxied, direct = _both(dynamodb_local)
    # Nagle's algorithm against the client's delayed ACK once cost ~45 ms a call here.
    assert _median_call_ms(proxied, table) - _median_call_ms(direct, table) < 15
