"""The payment example's own checks on the local stack (moved here from the core's integration tests, which run on
whatever is registered): the ledger's balance is the sum of distinct payments, whatever the delivery did."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from local import fifo, state
from local.event_files import load_event
from local.session import describe
from local.stack import DeployedStack
from testkit import messages
from testkit.webhook import WebhookSink
from tests.app.payment_received_checks import not_first_copies, payment
from tests.deployment.test_events import dead_letter_types, invoke
from tests.tooling.test_end_to_end import _aws_cli_send, _queue_empty, _wait_until

EVENTS = Path(__file__).resolve().parents[2] / "events"


def _ledger(stack: DeployedStack) -> dict[tuple[str, str], dict]:
    items = stack.servers.client("dynamodb").scan(TableName=stack.table_name("LedgerTable"))["Items"]
    return {(item["accountId"]["S"], item["entryId"]["S"]): item for item in items}


def _balances(stack: DeployedStack) -> dict[str, int]:
    return {
        account: int(item["balanceCents"]["N"])
        for (account, entry), item in _ledger(stack).items()
        if entry == "BALANCE"
    }


def test_the_same_payment_sent_twice_by_the_aws_cli_credits_once(stack: DeployedStack) -> None:
    body = payment("pay-cli-1", "p-cli-1", "acc-cli", 2500).body
    first, second = _aws_cli_send(stack, body), _aws_cli_send(stack, body)

    with stack.pollers(2):
        _wait_until(lambda: stack.stats.deleted == 2 and _queue_empty(stack))

    assert _balances(stack) == {"acc-cli": 2500}
    assert _ledger(stack)[("acc-cli", "PAYMENT#p-cli-1")]["messageId"]["S"] in {first, second}


def _single(stack: DeployedStack) -> None:
    assert _balances(stack) == {"acc-1": 1250}
    assert dead_letter_types(stack) == []


def _fifo(stack: DeployedStack) -> None:
    assert _balances(stack) == {"acc-4": 400, "acc-5": 600}


def _batch_with_duplicates(stack: DeployedStack) -> None:
    # Two keys each sent twice (one in the body, one as the IdempotencyKey attribute): credited once each.
    assert _balances(stack) == {"acc-1": 4000, "acc-2": 1000}
    assert sum(entry.startswith("PAYMENT#") for _, entry in _ledger(stack)) == 3


def _key_reuse(stack: DeployedStack) -> None:
    assert _balances(stack) == {"acc-3": 700}
    assert dead_letter_types(stack) == ["IdempotencyKeyReused"]


def _schema_violation(stack: DeployedStack) -> None:
    assert dead_letter_types(stack) == ["SchemaViolation"]
    assert _balances(stack) == {}


EXPECTED: dict[str, Callable[[DeployedStack], None]] = {
    "payment-single.json": _single,
    "payment-batch-with-duplicates.json": _batch_with_duplicates,
    "poison-key-reuse.json": _key_reuse,
    "poison-schema-violation.json": _schema_violation,
    "fifo-batch.json": _fifo,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_payment_sample_does_what_its_name_says(name: str, stack: DeployedStack) -> None:
    invoke(stack, name)
    EXPECTED[name](stack)


def test_a_payment_applied_then_its_duplicate_in_the_same_warm_environment_credits_once(stack: DeployedStack) -> None:
    first = stack.runtime.invoke(load_event(EVENTS / "payment-single.json"))
    again = stack.runtime.invoke(load_event(EVENTS / "payment-single.json"))

    assert first.response == again.response == {"batchItemFailures": []}
    assert _balances(stack) == {"acc-1": 1250}


def test_on_a_fifo_stack_each_payment_is_applied_by_its_first_copy(make_stack: Callable[..., DeployedStack]) -> None:
    from tests.tooling.test_fifo import FIFO, consume  # noqa: PLC0415

    stack = make_stack(parameter_overrides=FIFO)
    payments = [
        payment(f"fifo-{account}-{n}", f"p-{account}-{n}", f"acc-{account}", 100 + n)
        for n in range(6)
        for account in range(3)
    ]
    # Producer resends, later in their group than the original: the original must be the one applied.
    sent = messages.send_all(stack.servers.client("sqs"), stack.queue.url, [*payments, payments[0], payments[4]])
    log, _, _ = consume(stack, sent, pollers=2)
    assert fifo.out_of_order(sent, log.positions()) == []
    applied_by = {
        entry.removeprefix("PAYMENT#"): item["messageId"]["S"]
        for (_, entry), item in _ledger(stack).items()
        if entry.startswith("PAYMENT#") and "messageId" in item
    }
    assert not_first_copies(sent, applied_by) == []


def test_send_file_keeps_the_fifo_samples_message_groups(
    make_stack: Callable[..., DeployedStack], webhook_sink: WebhookSink, tmp_path: Path
) -> None:
    from tests.tooling.test_fifo import FIFO, _drain, _send  # noqa: PLC0415

    stack = make_stack(parameter_overrides=FIFO)
    state.write(describe(stack), tmp_path / "state.json")
    _send(tmp_path, "--file", "events/fifo-batch.json")
    from_file = _drain(stack.servers.client("sqs"), stack.queue.url)
    assert sorted(m["Attributes"]["MessageGroupId"] for m in from_file) == ["acc-4", "acc-4", "acc-5", "acc-5"]


def test_a_payment_asking_for_a_receipt_reaches_the_receipt_service_once_through_the_outbox_and_the_relay(
    stack: DeployedStack, webhook_sink: WebhookSink
) -> None:
    body = payment("pay-chain-1", "p-chain-1", "acc-chain", 900).body
    with_email = json.loads(body)
    with_email["payload"]["receiptEmail"] = "ana@example.com"
    sqs = stack.servers.client("sqs")
    for _ in range(2):  # the producer resends: one credit, one receipt request
        sqs.send_message(QueueUrl=stack.queue.url, MessageBody=json.dumps(with_email))

    with stack.pollers(1):
        _wait_until(lambda: stack.stats.deleted == 2 and _queue_empty(stack))
        # The relay sends the receipt request, then its environment dies before the checkpoint: the stream gives the
        # record again to the next relay, which sends it again, with the same key.
        stack.relay_poller().drain()
        stack.relay_poller().drain()
        _wait_until(lambda: stack.stats.deleted == 4 and _queue_empty(stack))

    (call,) = webhook_sink.received()
    assert call.idempotency_key == "PaymentReceived#pay-chain-1#0"
    assert call.json()["receiptId"] == "p-chain-1"
    assert _balances(stack) == {"acc-chain": 900}
    assert ("acc-chain", "RECEIPT#p-chain-1") in _ledger(stack)
    assert stack.relay_stats.checkpointed == 2
