"""make hot on a small workload: its figures add up against the queue, the proxy and the ledger."""

from __future__ import annotations

import argparse
from pathlib import Path

from local.hot import measure
from testkit.dynamodb_local import DynamoDBLocal
from testkit.servers import LocalServers
from testkit.webhook import WebhookSink

MESSAGES = 20


def test_a_small_spread_run_adds_up(
    local_servers: LocalServers, dynamodb_local: DynamoDBLocal, webhook_sink: WebhookSink, tmp_path: Path
) -> None:
    arguments = argparse.Namespace(
        seed=3, batch_size=10, serial=10, messages=MESSAGES, receipts=0.2, pollers=2, timeout=90.0
    )
    said: list[str] = []
    log = tmp_path / "function.log"
    figures = measure(local_servers, dynamodb_local, webhook_sink, arguments, 100, said.append, log)
    # Every delivery ended applied or went back, and each message was applied once.
    settled = (figures.messages, figures.not_done, figures.wrong_balances, figures.dead_lettered)
    assert (*settled, figures.deliveries - figures.returned) == (MESSAGES, 0, 0, 0, MESSAGES), figures
    assert figures.serial_per_s > 0
    assert figures.ceiling_per_s > 0
    assert figures.throughput_per_s > 0
    assert 0 < figures.p50_s <= figures.p99_s
    # Every payment is one transaction at least; receipts are the webhook's.
    assert figures.proxy["transactions"] >= MESSAGES - round(MESSAGES * 0.2)
    assert len({request.idempotency_key for request in webhook_sink.received()}) == round(MESSAGES * 0.2)
    assert any("pipeline" in line for line in said)
