"""Several consumers on the same keys at once, against DynamoDB Local (the rig: tests/core/concurrency/racing.py).

They get the same messages under different message ids (SQS redelivery and producer resends) at the same time, or each
its own share as SQS deals them out; failures are redelivered until none remain, as SQS would.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from chaos.invariants import scan
from consumer.config import Settings
from testkit.servers import LocalServers
from testkit.webhook import Answer, WebhookSink
from tests.core.concurrency.racing import hot_item, racing_settings, run_concurrently
from tests.core.handlers import CALL_TABLE, TALLY_EVENT, TALLY_TABLE, call_body, tally_body


@pytest.fixture
def settings(local_aws: LocalServers) -> Settings:
    return racing_settings(local_aws)


def test_concurrent_consumers_add_each_entry_exactly_once(settings: Settings, local_servers: LocalServers) -> None:
    rng = random.Random(7)
    adds = [(f"e-{i}", f"t-{i % 4}", rng.randint(1, 10_000)) for i in range(60)]
    bodies = [tally_body(eid, tally_id=tally, amount=amount) for eid, tally, amount in adds]

    run_concurrently(settings, bodies)

    dynamodb = local_servers.client("dynamodb")
    tallies = scan(dynamodb, settings.table_names[TALLY_TABLE])
    totals = {i["tallyId"]: int(i["tallied"]) for i in tallies if i["entryId"] == "TOTAL"}
    expected: Counter[str] = Counter()
    for _, tally, amount in adds:
        expected[tally] += amount
    assert totals == dict(expected)
    entries = [i for i in tallies if i["entryId"].startswith("ENTRY#")]
    assert sorted(i["entryId"] for i in entries) == sorted(f"ENTRY#{eid}" for eid, _, _ in adds)
    # Each entry's record is its key's own item, completed.
    records = scan(dynamodb, settings.idempotency_table_name)
    assert sorted(i["id"] for i in records) == sorted(f"{TALLY_EVENT}#add-{eid}" for eid, _, _ in adds)
    assert {i["status"] for i in records} == {"COMPLETED"}


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
    assert sorted(i["callId"] for i in recorded) == sorted(str(i) for i in range(20))
    records = scan(dynamodb, settings.idempotency_table_name)
    assert {record["status"] for record in records} == {"COMPLETED"}
    assert all(json.loads(record["result"])["status"] == 200 for record in records)


def test_a_hot_item_under_four_consumers_applies_each_message_once_in_its_first_delivery(
    local_servers: LocalServers,
) -> None:
    # 200 payments on one account, each consumer given its own quarter as SQS hands messages out: every transaction
    # meets the others on the account's item. Conflicts are retried while the invocation has time, and here it always
    # has: so none is handed back, and none is lost, applied twice or dead-lettered.
    hot = hot_item(local_servers)
    assert hot.failed_checks() == []
    assert hot.returned == 0
