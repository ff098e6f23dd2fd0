"""Several consumers on the same keys at once, against DynamoDB Local.

Each consumer is wired exactly as the function is (``consumer.app.wire``), with its
own boto3 session, as separate Lambda containers would be. They get the same
messages under different message ids (SQS redelivery and producer resends) at the
same time; failures are redelivered until none remain, as SQS would.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import Settings
from testkit.lambda_sqs import Remaining, sqs_record
from testkit.messages import payment_body, receipt_body
from testkit.servers import LocalServers
from testkit.webhook import Answer, WebhookSink
from tests.utils import settings_for_tests

CONSUMERS = 4
BATCH_SIZE = 10
MAX_REDELIVERIES = 30


@pytest.fixture
def settings(local_servers: LocalServers, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    resources = local_servers.deploy()
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", local_servers.dynamodb_endpoint_url)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", local_servers.sqs_endpoint_url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local")
    yield settings_for_tests(
        tables=resources.tables,
        dead_letter_queue_url=resources.queues["ConsumerDeadLetterQueue"].url,
        receipt_webhook_url="",
        max_workers=4,
        lease_min_ms=1_000,
    )


def consumers(settings: Settings) -> list[BatchRunner]:
    return [wire(settings, boto3.session.Session()) for _ in range(CONSUMERS)]


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


def run_concurrently(settings: Settings, bodies: list[str]) -> Counter[str]:
    failures: Counter[str] = Counter()
    errors: list[BaseException] = []
    barrier = threading.Barrier(CONSUMERS)

    def work(index: int, consumer: BatchRunner) -> None:
        # Every consumer gets every message, in its own order and under its own ids.
        order = list(range(len(bodies)))
        random.Random(index).shuffle(order)
        records = [sqs_record(f"c{index}-m{i}", bodies[i]) for i in order]
        barrier.wait()
        try:
            deliver_until_done(consumer, records, failures)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i, c)) for i, c in enumerate(consumers(settings))]
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


def test_concurrent_consumers_credit_each_payment_exactly_once(settings: Settings, local_servers: LocalServers) -> None:
    rng = random.Random(7)
    payments = [(f"p-{i}", f"acc-{i % 4}", rng.randint(1, 10_000)) for i in range(60)]
    bodies = [payment_body(pid, account_id=acc, amount=amount) for pid, acc, amount in payments]

    run_concurrently(settings, bodies)

    dynamodb = local_servers.client("dynamodb")
    ledger = scan(dynamodb, settings.table_names["LedgerTable"])
    balances = {i["accountId"]["S"]: int(i["balanceCents"]["N"]) for i in ledger if i["entryId"]["S"] == "BALANCE"}
    expected: Counter[str] = Counter()
    for _, account, amount in payments:
        expected[account] += amount
    assert balances == dict(expected)
    entries = [i for i in ledger if i["entryId"]["S"].startswith("PAYMENT#")]
    assert sorted(i["entryId"]["S"] for i in entries) == sorted(f"PAYMENT#{pid}" for pid, _, _ in payments)
    # Each payment's record is its key's own item, completed.
    records = scan(dynamodb, settings.idempotency_table_name)
    assert sorted(i["id"]["S"] for i in records) == sorted(f"PaymentReceived#pay-{pid}" for pid, _, _ in payments)
    assert {i["status"]["S"] for i in records} == {"COMPLETED"}


def test_concurrent_consumers_post_each_receipt_once(
    settings: Settings, local_servers: LocalServers, webhook: WebhookSink
) -> None:
    settings = settings.model_copy(update={"handler_variables": {"RECEIPT_WEBHOOK_URL": webhook.receipts_url}})
    webhook.default = Answer(delay_s=0.02)  # long enough for the others to find the claim in flight
    bodies = [receipt_body(str(i)) for i in range(20)]

    failures = run_concurrently(settings, bodies)

    calls = Counter(webhook.keys())
    assert calls == Counter({f"receipt-{i}": 1 for i in range(20)})
    assert sum(failures.values()) > 0, "no consumer ever found a claim in flight: the test raced nothing"
    dynamodb = local_servers.client("dynamodb")
    receipts = [
        i for i in scan(dynamodb, settings.table_names["LedgerTable"]) if i["entryId"]["S"].startswith("RECEIPT#")
    ]
    assert len(receipts) == 20
    records = scan(dynamodb, settings.idempotency_table_name)
    assert {record["status"]["S"] for record in records} == {"COMPLETED"}
    assert all(json.loads(record["result"]["S"])["webhookStatus"] == 200 for record in records)
