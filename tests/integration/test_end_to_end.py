"""End to end over real HTTP: a producer, the queue, the pollers, the function, DynamoDB, the webhook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from local.stack import DeployedStack
from testkit import dead_letters, messages
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.template import REPO_ROOT
from testkit.webhook import Answer, WebhookSink
from tests.integration.template_copies import function_properties, template_copy

AWS_CLI = Path(sys.executable).parent / "aws"


def _wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _queue_empty(stack: DeployedStack) -> bool:
    attributes = stack.servers.client("sqs").get_queue_attributes(
        QueueUrl=stack.queue.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return attributes["ApproximateNumberOfMessages"] == attributes["ApproximateNumberOfMessagesNotVisible"] == "0"


def _ledger_item(stack: DeployedStack, account: str, entry: str) -> dict | None:
    key = {"accountId": {"S": account}, "entryId": {"S": entry}}
    return stack.servers.client("dynamodb").get_item(TableName=stack.table_name("LedgerTable"), Key=key).get("Item")


def _aws_cli_send(stack: DeployedStack, body: str) -> str:
    answer = subprocess.run(
        [
            str(AWS_CLI),
            "sqs",
            "send-message",
            "--endpoint-url",
            stack.servers.sqs_endpoint_url,
            "--queue-url",
            stack.queue.url,
            "--message-body",
            body,
            "--output",
            "json",
        ],
        env={**os.environ, **DUMMY_CREDENTIALS_ENV},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(answer.stdout)["MessageId"]


def test_the_same_message_sent_twice_by_the_aws_cli_is_applied_once(stack: DeployedStack) -> None:
    body = messages.payment("pay-cli-1", "p-cli-1", "acc-cli", 2500).body
    first, second = _aws_cli_send(stack, body), _aws_cli_send(stack, body)
    assert first != second  # SQS sees two messages

    with stack.pollers(2):
        _wait_until(lambda: stack.stats.deleted == 2 and _queue_empty(stack))

    balance = _ledger_item(stack, "acc-cli", "BALANCE")
    assert balance is not None
    assert balance["balanceCents"] == {"N": "2500"}
    entry = _ledger_item(stack, "acc-cli", "PAYMENT#p-cli-1")
    assert entry is not None
    assert entry["messageId"]["S"] in {first, second}


def test_poison_lands_in_the_dead_letter_queue_with_its_reason(stack: DeployedStack) -> None:
    sqs = stack.servers.client("sqs")
    sqs.send_message(QueueUrl=stack.queue.url, MessageBody="{not json")
    sqs.send_message(
        QueueUrl=stack.queue.url,
        MessageBody=messages.envelope("LoyaltyPointsAwarded", "points-9", {"awardId": "pts-9", "points": 10}),
    )

    with stack.pollers(1):
        _wait_until(lambda: stack.stats.deleted == 2)

    parked = {letter.error_type: letter for letter in dead_letters.peek(sqs, stack.dead_letter_queue.url)}
    assert set(parked) == {"InvalidJson", "UnknownEventType"}
    assert parked["InvalidJson"].body == "{not json"
    assert "LoyaltyPointsAwarded" in (parked["UnknownEventType"].error_message or "")
    assert _queue_empty(stack)


def test_a_receipt_reaches_the_webhook_with_its_idempotency_key_and_survives_a_5xx(
    stack: DeployedStack, webhook_sink: WebhookSink
) -> None:
    message = messages.receipt("rcpt-e2e-1", "r-e2e-1", "acc-r", "p-e2e-1", 800)
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


def test_every_webhook_url_parameter_points_at_the_sink_and_the_stack_signs_with_the_sinks_secret(
    make_stack: Callable[..., DeployedStack], webhook_sink: WebhookSink, tmp_path: Path
) -> None:
    def add_a_handlers_webhook(document: dict[str, Any]) -> None:
        document["Parameters"]["MyWebhookUrl"] = {"Type": "String", "Default": ""}
        document["Parameters"]["OtherWebhookUrl"] = {"Type": "String", "Default": ""}
        function_properties(document)["CodeUri"] = str(REPO_ROOT / "src")
        variables = function_properties(document)["Environment"]["Variables"]
        variables |= {"MY_WEBHOOK_URL": {"Ref": "MyWebhookUrl"}, "OTHER_WEBHOOK_URL": {"Ref": "OtherWebhookUrl"}}

    stack = make_stack(
        template_path=template_copy(tmp_path, add_a_handlers_webhook),
        parameter_overrides={"OtherWebhookUrl": "https://receiver.example/hook"},
    )

    environment = stack.function_environment
    assert environment["MY_WEBHOOK_URL"] == f"{webhook_sink.url}/MyWebhookUrl"
    assert environment["RECEIPT_WEBHOOK_URL"] == webhook_sink.receipts_url
    assert environment["OTHER_WEBHOOK_URL"] == "https://receiver.example/hook"  # a given value wins
    secret = stack.servers.client("secretsmanager").get_secret_value(SecretId=environment["WEBHOOK_SECRET_ARN"])
    assert secret["SecretString"] == webhook_sink.secret
