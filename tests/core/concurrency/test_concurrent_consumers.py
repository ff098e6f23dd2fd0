"""Several consumers on the same keys at once, against DynamoDB Local.

Each consumer is wired as the function is (``consumer.app.wire``), on the core's test
handlers (tests/core/handlers.py), with its own boto3 session, as separate Lambda containers would be. They get the same
messages under different message ids (SQS redelivery and producer resends) at the
same time; failures are redelivered until none remain, as SQS would.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from typing import Any

import boto3
import pytest

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import Settings
from testkit.lambda_sqs import sqs_record
from testkit.servers import LocalServers
from testkit.webhook import Answer, WebhookSink
from tests.core.handlers import CALL_TABLE, TALLY_EVENT, TALLY_TABLE, call_body, handlers_for_tests, tally_body
from tests.kit import Remaining
from tests.utils import settings_on_local_servers

CONSUMERS = 4
BATCH_SIZE = 10
MAX_REDELIVERIES = 30


@pytest.fixture
def settings(local_aws: LocalServers) -> Settings:
    return settings_on_local_servers(local_aws, max_workers=4, lease_min_ms=1_000)


def consumers(settings: Settings, webhook_url: str) -> list[BatchRunner]:
    return [
        wire(settings, boto3.session.Session(), handlers=handlers_for_tests(settings, webhook_url))
        for _ in range(CONSUMERS)
    ]


def deliver_until_done(consumer: BatchRunner, records: list[dict[str, Any]], failures: Counter[str]) -> None:
    """Process in batches; redeliver what was reported failed, as SQS would."""
    pending = records
    for delivery in range(MAX_REDELIVERIES):
        retry: list[dict[str, Any]] = []
        for start in range(0, len(pending), BATCH_SIZE):
            batch = pending[start : start + BATCH_SIZE]
            failed = [f["itemIdentifier"] for f in consumer.process(batch, Remaining()).response()["batchItemFailures"]]
            ids = {record["messageId"] for record in batch}
            assert set(failed) <= ids, "batchItemFailures named an id outside its batch"
            failures.update(failed)
            retry.extend(record for record in batch if record["messageId"] in failed)
        if not retry:
            return
        # SQS hands a failed record back only after its visibility timeout: wait a little,
        # or a slow owner on a busy machine is found in flight on every redelivery.
        time.sleep(min(0.5, 0.02 * 2**delivery))
        pending = [
            {**record, "attributes": {**record["attributes"], "ApproximateReceiveCount": str(delivery + 2)}}
            for record in retry
        ]
    raise AssertionError(f"{len(pending)} records still failing after {MAX_REDELIVERIES} deliveries")


def run_concurrently(
    settings: Settings, bodies: list[str], webhook_url: str = "", *, dealt: bool = False
) -> Counter[str]:
    """Every consumer gets every message, in its own order and under its own ids (redeliveries and resends racing);
    ``dealt``: each takes its own share instead, as SQS hands a queue's messages out."""
    failures: Counter[str] = Counter()
    errors: list[BaseException] = []
    barrier = threading.Barrier(CONSUMERS)

    def work(index: int, consumer: BatchRunner) -> None:
        if dealt:
            records = [sqs_record(f"m{i}", bodies[i]) for i in range(index, len(bodies), CONSUMERS)]
        else:
            order = list(range(len(bodies)))
            random.Random(index).shuffle(order)
            records = [sqs_record(f"c{index}-m{i}", bodies[i]) for i in order]
        barrier.wait()
        try:
            deliver_until_done(consumer, records, failures)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i, c)) for i, c in enumerate(consumers(settings, webhook_url))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    return failures


def scan(client: Any, table: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = client.scan(**kwargs)
        items.extend(page["Items"])
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def test_concurrent_consumers_add_each_entry_exactly_once(settings: Settings, local_servers: LocalServers) -> None:
    rng = random.Random(7)
    adds = [(f"e-{i}", f"t-{i % 4}", rng.randint(1, 10_000)) for i in range(60)]
    bodies = [tally_body(eid, tally_id=tally, amount=amount) for eid, tally, amount in adds]

    run_concurrently(settings, bodies)

    dynamodb = local_servers.client("dynamodb")
    tallies = scan(dynamodb, settings.table_names[TALLY_TABLE])
    totals = {i["tallyId"]["S"]: int(i["tallied"]["N"]) for i in tallies if i["entryId"]["S"] == "TOTAL"}
    expected: Counter[str] = Counter()
    for _, tally, amount in adds:
        expected[tally] += amount
    assert totals == dict(expected)
    entries = [i for i in tallies if i["entryId"]["S"].startswith("ENTRY#")]
    assert sorted(i["entryId"]["S"] for i in entries) == sorted(f"ENTRY#{eid}" for eid, _, _ in adds)
    # Each entry's record is its key's own item, completed.
    records = scan(dynamodb, settings.idempotency_table_name)
    assert sorted(i["id"]["S"] for i in records) == sorted(f"{TALLY_EVENT}#add-{eid}" for eid, _, _ in adds)
    assert {i["status"]["S"] for i in records} == {"COMPLETED"}


def test_concurrent_consumers_post_each_call_once(
    settings: Settings, local_servers: LocalServers, webhook: WebhookSink
) -> None:
    webhook.default = Answer(delay_s=0.02)  # long enough for the others to find the claim in flight
    bodies = [call_body(str(i)) for i in range(20)]

    failures = run_concurrently(settings, bodies, f"{webhook.url}/calls")

    calls = Counter(webhook.keys())
    assert calls == Counter({f"call-{i}": 1 for i in range(20)})
    assert sum(failures.values()) > 0, "no consumer ever found a claim in flight: the test raced nothing"
    dynamodb = local_servers.client("dynamodb")
    recorded = scan(dynamodb, settings.table_names[CALL_TABLE])
    assert sorted(i["callId"]["S"] for i in recorded) == sorted(str(i) for i in range(20))
    records = scan(dynamodb, settings.idempotency_table_name)
    assert {record["status"]["S"] for record in records} == {"COMPLETED"}
    assert all(json.loads(record["result"]["S"])["status"] == 200 for record in records)


def test_a_hot_item_under_four_consumers_applies_each_message_once_in_its_first_delivery(
    settings: Settings, local_servers: LocalServers
) -> None:
    # 200 payments on one account, each consumer given its own quarter as SQS hands messages out: every transaction
    # meets the others on the account's item. Conflicts are retried while the invocation has time, and here it always
    # has: so none is handed back, and none is lost, applied twice or dead-lettered, which the exact total proves.
    bodies = [tally_body(f"hot-{i}", tally_id="hot", amount=i + 1) for i in range(200)]

    assert run_concurrently(settings, bodies, dealt=True) == Counter()

    tallies = scan(local_servers.client("dynamodb"), settings.table_names[TALLY_TABLE])
    (total,) = [int(i["tallied"]["N"]) for i in tallies if i["entryId"]["S"] == "TOTAL"]
    assert total == sum(range(1, 201))
    assert sum(1 for i in tallies if i["entryId"]["S"].startswith("ENTRY#")) == 200
