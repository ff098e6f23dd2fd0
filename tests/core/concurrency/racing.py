"""Several consumers on the same keys at once, against DynamoDB Local behind the conflict emulation.

Each consumer is wired as the function is (``consumer.app.wire``), on the core's test handlers (tests/core/handlers.py),
with its own boto3 session, as separate Lambda containers would be; failures are redelivered until none remain, as SQS
would. The concurrency tests assert on what they come to; ``make bench`` reads the hot item's returned share from them.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import boto3

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import Settings
from testkit.lambda_sqs import sqs_record
from testkit.servers import LocalServers
from tests.core.handlers import TALLY_TABLE, TOTAL, handlers_for_tests, tally_body
from tests.kit import Remaining
from tests.utils import settings_on_local_servers

CONSUMERS = 4
BATCH_SIZE = 10
MAX_REDELIVERIES = 30
HOT_MESSAGES = 200


def racing_settings(servers: LocalServers) -> Settings:
    """Fresh tables on the local servers, each consumer with 4 workers and a lease short enough to expire in a test."""
    return settings_on_local_servers(servers, max_workers=4, lease_min_ms=1_000)


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
    ``dealt``: each takes its own share instead, as SQS hands a queue's messages out. Returns the times each message
    id was handed back."""
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


@dataclass(frozen=True)
class HotItem:
    """What ``HOT_MESSAGES`` additions to one tally came to, each consumer given its own share as SQS deals them."""

    returned: int  # distinct messages handed back at least once (a conflict's cancellation, a lane's follower)
    total: int  # the tally's total: exact when each message was applied once
    entries: int  # one per applied message
    dead_lettered: int

    EXPECTED_TOTAL = sum(range(1, HOT_MESSAGES + 1))

    @property
    def ledger_exact(self) -> bool:
        return self.total == self.EXPECTED_TOTAL and self.entries == HOT_MESSAGES


def hot_item(servers: LocalServers) -> HotItem:
    """Every transaction meets the others on the tally's TOTAL item: the hot account of the issue, on the core's own
    optimistic handler, whose invariant (its total is the sum of its entries) makes "applied once" checkable."""
    settings = racing_settings(servers)
    bodies = [tally_body(f"hot-{i}", tally_id="hot", amount=i + 1) for i in range(HOT_MESSAGES)]
    returned = run_concurrently(settings, bodies, dealt=True)
    tallies = scan(servers.client("dynamodb"), settings.table_names[TALLY_TABLE])
    left = servers.client("sqs").get_queue_attributes(
        QueueUrl=settings.dead_letter_queue_url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    return HotItem(
        returned=len(returned),
        total=sum(int(i["tallied"]["N"]) for i in tallies if i["entryId"]["S"] == TOTAL),
        entries=sum(1 for i in tallies if i["entryId"]["S"].startswith("ENTRY#")),
        dead_lettered=int(left["Attributes"]["ApproximateNumberOfMessages"]),
    )
