"""Several consumers on the same keys at once, against DynamoDB Local behind the conflict emulation.

Each consumer is wired as the function is (``consumer.app.wire``), on the core's test handlers (tests/core/handlers.py),
with its own boto3 session, as separate Lambda containers would be; failures are redelivered until none remain, as SQS
would. The concurrency tests assert on what they come to; ``make bench`` reads the hot item's returned share from them.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any
from unittest import mock

import boto3

from chaos.invariants import scan
from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import Settings
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.lambda_sqs import sqs_record
from testkit.messages import queue_counts
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


@dataclass(frozen=True)
class HotItem:
    """What ``HOT_MESSAGES`` additions to one tally came to, each consumer given its own share as SQS deals them."""

    returned: int  # distinct messages handed back at least once (a conflict's cancellation, a lane's follower)
    total: int  # the tally's total: exact when each message was applied once
    entries: int  # one per applied message
    dead_lettered: int

    def failed_checks(self) -> list[str]:
        """What none may lose, apply twice or dead-letter shows here: the test asserts none, make bench prints them."""
        expected = sum(range(1, HOT_MESSAGES + 1))
        checks = {
            f"the total {self.total}, not {expected}": self.total == expected,
            f"{self.entries} entries, not {HOT_MESSAGES}": self.entries == HOT_MESSAGES,
            f"{self.dead_lettered} dead-lettered": self.dead_lettered == 0,
        }
        return [text for text, passed in checks.items() if not passed]


def hot_item(servers: LocalServers) -> HotItem:
    """Every transaction meets the others on the tally's TOTAL item: a hot account, on the core's own optimistic
    handler, whose invariant (its total is the sum of its entries) makes "applied once" checkable. The consumers'
    clients reach ``servers`` as the function's do, through boto3's endpoint variables."""
    settings = racing_settings(servers)
    bodies = [tally_body(f"hot-{i}", tally_id="hot", amount=i + 1) for i in range(HOT_MESSAGES)]
    endpoints = {
        "AWS_ENDPOINT_URL_DYNAMODB": servers.dynamodb_endpoint_url,
        "AWS_ENDPOINT_URL_SQS": servers.sqs_endpoint_url,
    }
    with mock.patch.dict(os.environ, {**DUMMY_CREDENTIALS_ENV, **endpoints}):
        returned = run_concurrently(settings, bodies, dealt=True)
    tallies = scan(servers.client("dynamodb"), settings.table_names[TALLY_TABLE])
    return HotItem(
        returned=len(returned),
        total=sum(int(i["tallied"]) for i in tallies if i["entryId"] == TOTAL),
        entries=sum(1 for i in tallies if i["entryId"].startswith("ENTRY#")),
        dead_lettered=sum(queue_counts(servers.client("sqs"), settings.dead_letter_queue_url)),
    )
