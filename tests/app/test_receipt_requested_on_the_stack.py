"""The receipt example's own checks on the local stack (moved here from the core's integration tests, which run on
whatever is registered): its webhook gets the message's idempotency key, and a 5xx is retried."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from local import fifo
from local.event_files import load_event
from local.stack import DeployedStack
from testkit import messages
from testkit.webhook import Answer, WebhookSink
from tests.app.payment_received_checks import payment, receipt
from tests.deployment.test_events import invoke
from tests.tooling.test_end_to_end import _queue_empty, _wait_until
from tests.tooling.test_fifo import FIFO, consume

EVENTS = Path(__file__).resolve().parents[2] / "events"


def _ledger_item(stack: DeployedStack, account: str, entry: str) -> dict | None:
    key = {"accountId": {"S": account}, "entryId": {"S": entry}}
    return stack.servers.client("dynamodb").get_item(TableName=stack.table_name("LedgerTable"), Key=key).get("Item")


def test_a_receipt_reaches_the_webhook_with_its_idempotency_key_and_survives_a_5xx(
    stack: DeployedStack, webhook_sink: WebhookSink
) -> None:
    message = receipt("rcpt-e2e-1", "r-e2e-1", "acc-r", "p-e2e-1", 800)
    webhook_sink.answer_next(Answer(503), key="rcpt-e2e-1")
    stack.servers.client("sqs").send_message(QueueUrl=stack.queue.url, MessageBody=message.body)

    with stack.pollers(1):
        # The 503 is transient: the record is retried after its backoff and then accepted.
        _wait_until(lambda: _queue_empty(stack) and stack.stats.deleted == 1, timeout_s=60)

    calls = webhook_sink.received()
    assert [call.status for call in calls] == [503, 200]
    assert {call.idempotency_key for call in calls} == {"rcpt-e2e-1"}
    assert {call.path for call in calls} == {"/ReceiptWebhookUrl"}
    # Signed by the function with the secret the local stack put in Secrets Manager, every try.
    assert all(call.verified for call in calls)
    assert calls[-1].json()["receiptId"] == "r-e2e-1"
    recorded = _ledger_item(stack, "acc-r", "RECEIPT#r-e2e-1")
    assert recorded is not None
    assert recorded["webhookStatus"] == {"N": "200"}


def test_the_receipt_sample_posts_once_with_its_key(stack: DeployedStack, webhook_sink: WebhookSink) -> None:
    invoke(stack, "receipt-requested.json")
    (request,) = webhook_sink.received()
    assert request.idempotency_key == "rcpt-2024-000017"
    assert request.json()["receiptId"] == "rcpt-17"
    assert _ledger_item(stack, "acc-1", "RECEIPT#rcpt-17") is not None


def test_a_webhook_5xx_fails_the_message_for_a_retry(stack: DeployedStack, webhook_sink: WebhookSink) -> None:
    event = load_event(EVENTS / "receipt-requested.json")
    webhook_sink.answer_next(Answer(503))

    invocation = stack.runtime.invoke(event)

    assert invocation.response == {"batchItemFailures": [{"itemIdentifier": event["Records"][0]["messageId"]}]}


def test_a_webhook_failure_holds_its_fifo_group_back_and_the_rest_is_applied_after_it(
    make_stack: Callable[..., DeployedStack], webhook_sink: WebhookSink
) -> None:
    fifo_stack = make_stack(parameter_overrides=FIFO)
    first = payment("held-1", "p-held-1", "acc-held", 100)
    flaky = receipt("held-receipt", "r-held", "acc-held", "p-held-1", 100)
    later = [payment(f"held-{n}", f"p-held-{n}", "acc-held", 100 * n) for n in (2, 3)]
    other = [payment(f"free-{n}", f"p-free-{n}", "acc-free", 10) for n in (1, 2)]
    webhook_sink.answer_next(Answer(503), key=flaky.key)
    sent = messages.send_all(fifo_stack.servers.client("sqs"), fifo_stack.queue.url, [first, flaky, *later, *other])
    ids = {message.key: message_id for message_id, message in sent.items()}

    log, reports, _ = consume(fifo_stack, sent, pollers=1)

    assert set(reports[0].failed_ids) == {ids["held-receipt"], ids["held-2"], ids["held-3"]}
    assert set(reports[0].completed_ids) == {ids["held-1"], ids["free-1"], ids["free-2"]}
    assert fifo.out_of_order(sent, log.positions()) == []
    entries = {
        item["entryId"]["S"]: item["messageId"]["S"]
        for item in fifo_stack.servers.client("dynamodb").scan(TableName=fifo_stack.table_name("LedgerTable"))["Items"]
        if "messageId" in item
    }
    assert {entries[f"PAYMENT#p-held-{n}"] for n in (2, 3)} == {ids["held-2"], ids["held-3"]}
    assert [r.idempotency_key for r in webhook_sink.received()] == ["held-receipt", "held-receipt"]
