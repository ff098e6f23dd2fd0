"""End to end over real HTTP, for every registered handler: a producer, the queue, the pollers, the function,
DynamoDB. The examples' own end-to-end checks (the ledger's balance, the receipt's webhook) are in tests/app/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from consumer.config import URL_PATTERN
from local.stack import DeployedStack
from testkit import dead_letters, messages
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.template import REPO_ROOT
from testkit.webhook import WebhookSink
from tests.tooling import generic
from tests.tooling.template_copies import function_properties, on_the_cores_own_application, template_copy

pytestmark = pytest.mark.cores_own_application
test_on_the_cores_own_application = on_the_cores_own_application(__name__, seconds=60)

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


@pytest.mark.parametrize("handler", generic.HANDLERS, ids=generic.IDS)
def test_the_same_message_sent_twice_by_the_aws_cli_is_applied_once(
    stack: DeployedStack, handler: generic.Handler
) -> None:
    message = generic.drawn(stack, handler, f"cli-{handler.event_type}")
    with stack.pollers(2):
        first = _aws_cli_send(stack, message.body)
        _wait_until(lambda: stack.stats.deleted == 1 and _queue_empty(stack))
        found, once = generic.outcome(stack, message), generic.declared_items(stack)
        second = _aws_cli_send(stack, message.body)
        _wait_until(lambda: stack.stats.deleted == 2 and _queue_empty(stack))

    assert first != second  # SQS sees two messages
    assert found is not None, f"{handler.event_type}: neither applied nor dead-lettered"
    assert generic.declared_items(stack) == once, f"{handler.event_type}: the resend changed a declared table"
    parked = generic.letters(stack)
    if found == "applied":
        assert parked == []
    else:  # dead-lettered by a business condition: the resend is too, for the same reason
        assert [letter.body for letter in parked] == [message.body] * 2
        assert len({letter.error_type for letter in parked}) == 1


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


def test_every_endpoint_parameter_points_at_the_sink_whatever_its_name_and_the_stack_signs_with_the_sinks_secret(
    make_stack: Callable[..., DeployedStack], webhook_sink: WebhookSink, tmp_path: Path
) -> None:
    def add_a_handlers_webhook(document: dict[str, Any]) -> None:
        # Endpoints' parameters by any name, known by ApiUrl's pattern; one of another pattern is left alone.
        endpoint = {"Type": "String", "Default": "", "AllowedPattern": URL_PATTERN}
        document["Parameters"] |= {"CarrierApi": endpoint, "OtherWebhookUrl": endpoint}
        document["Parameters"]["PlainWebhookUrl"] = {"Type": "String", "Default": "https://plain.example/hook"}
        # Secrets' parameters by any name, as handlers' SecretArn settings take them (the example's pattern).
        secret = {**document["Parameters"].pop("WebhookSecretArn"), "Default": ""}
        document["Parameters"] |= {"BillingSecretArn": secret, "RefundsSigningSecret": secret}
        function_properties(document)["CodeUri"] = str(REPO_ROOT / "src")
        variables = function_properties(document)["Environment"]["Variables"]
        variables |= {"CARRIER_API": {"Ref": "CarrierApi"}, "OTHER_WEBHOOK_URL": {"Ref": "OtherWebhookUrl"}}
        variables |= {"PLAIN_WEBHOOK_URL": {"Ref": "PlainWebhookUrl"}}
        variables.pop("WEBHOOK_SECRET_ARN")
        variables |= {
            "BILLING_SECRET_ARN": {"Ref": "BillingSecretArn"},
            "REFUNDS_SECRET": {"Ref": "RefundsSigningSecret"},
        }
        document["Conditions"]["HasWebhookSecret"] = {"Fn::Not": [{"Fn::Equals": [{"Ref": "BillingSecretArn"}, ""]}]}
        document["Resources"]["WebhookSecretPolicy"]["Properties"]["PolicyDocument"]["Statement"][0]["Resource"] = {
            "Ref": "BillingSecretArn"
        }

    stack = make_stack(
        template_path=template_copy(tmp_path, add_a_handlers_webhook),
        parameter_overrides={"OtherWebhookUrl": "https://receiver.example/hook"},
    )

    environment = stack.function_environment
    assert environment["CARRIER_API"] == f"{webhook_sink.url}/CarrierApi"
    assert environment["OTHER_WEBHOOK_URL"] == "https://receiver.example/hook"  # a given value wins
    assert environment["PLAIN_WEBHOOK_URL"] == "https://plain.example/hook"  # not an endpoint's pattern: its name alone
    for variable in ("BILLING_SECRET_ARN", "REFUNDS_SECRET"):
        secret = stack.servers.client("secretsmanager").get_secret_value(SecretId=environment[variable])
        assert secret["SecretString"] == webhook_sink.secret
