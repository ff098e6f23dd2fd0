"""make hot on a small workload: its figures add up against the queue, the proxy and the ledger."""

from __future__ import annotations

import argparse
from pathlib import Path

from local.dynamodb_local import DynamoDBLocal
from local.hot import measure
from local.servers import LocalServers
from testkit.webhook import WebhookSink

MESSAGES = 20


def test_a_small_spread_run_adds_up(
    local_stack: LocalServers, dynamodb_local: DynamoDBLocal, webhook_sink: WebhookSink, tmp_path: Path
) -> None:
    arguments = argparse.Namespace(
        seed=3, batch_size=10, serial=10, messages=MESSAGES, receipts=0.2, pollers=2, timeout=90.0
    )
    said: list[str] = []
    figures = measure(local_stack, dynamodb_local, webhook_sink, arguments, 100, said.append, tmp_path / "function.log")
    assert figures.messages == MESSAGES
    assert figures.not_done == 0
    assert figures.wrong_balances == 0
    assert figures.dead_lettered == 0
    # Every delivery ended applied or went back; each message was applied once.
    assert figures.deliveries == MESSAGES + figures.returned
    assert figures.serial_per_s > 0
    assert figures.ceiling_per_s > 0
    assert figures.throughput_per_s > 0
    assert 0 < figures.p50_s <= figures.p99_s
    # Every payment is one transaction at least; receipts are the webhook's.
    assert figures.proxy["transactions"] >= MESSAGES - round(MESSAGES * 0.2)
    assert len({request.idempotency_key for request in webhook_sink.received()}) == round(MESSAGES * 0.2)
    assert any("pipeline" in line for line in said)
