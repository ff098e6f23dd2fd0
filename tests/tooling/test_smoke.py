"""``make smoke``: the local form end to end, what the clean-up leaves, failed checks, a stack that does not fit.

Each runs on the core's own application (the template's examples), never on the handlers this project registers: the
stack's tests in a project made from the template, the deployed form's with the core's test handlers."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from consumer.config import table_variable
from consumer.handler import declared_tables
from local import smoke
from local.replace_examples import handlers_statement
from local.stack import DeployedStack
from testkit import application, dead_letters, payloads
from tests.core.handlers import CallHandler, TallyHandler
from tests.tooling.template_copies import on_the_cores_own_application, run_in, template_project

test_on_the_cores_own_application = on_the_cores_own_application(__name__, seconds=40)


def _target(stack: DeployedStack) -> smoke.Target:
    return smoke.Target(
        sqs=stack.servers.client("sqs"),
        dynamodb=stack.servers.client("dynamodb"),
        queue_url=stack.queue.url,
        dead_letter_queue_url=stack.dead_letter_queue.url,
        idempotency_table=stack.table_name("IdempotencyTable"),
        tables={table: stack.table_name(table) for table in declared_tables(payloads.registered())},
    )


def _scan(stack: DeployedStack, logical_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = stack.servers.client("dynamodb").scan(TableName=stack.table_name(logical_id))["Items"]
    return items


@pytest.mark.integration
@pytest.mark.long(35)
def test_the_local_form_starts_the_stack_passes_and_stops(tmp_path: Path) -> None:
    project = template_project(tmp_path)
    answer = run_in(project, [sys.executable, "-m", "local", "smoke", "--timeout", "30"], timeout=90)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    lines = answer.stdout.splitlines()
    registered = handlers_statement(application.registry_file(project).read_text())[1]
    # One per registered handler, then their emitted messages, the drain, the resends, the poison and its reason.
    assert sum(line.startswith("ok ") for line in lines) == len(registered) + 5, answer.stdout
    assert not any(line.startswith("FAIL") for line in lines)
    assert lines[-1] == "smoke test passed"


@pytest.mark.cores_own_application
def test_a_run_removes_its_own_writes_and_nothing_else(make_stack: Callable[..., DeployedStack]) -> None:
    stack = make_stack()
    target = _target(stack)
    # Someone else's dead letter and an item in each declared table, already there: the clean-up must leave them.
    target.sqs.send_message(QueueUrl=target.dead_letter_queue_url, MessageBody="not the smoke test's")
    others = {table: _someone_elses(stack, table) for table in target.tables}
    stack.pollers(2)

    checks = smoke.run_smoke(target, run_id="cleanup-1", timeout_s=30)

    assert all(check.passed for check in checks), [c.text for c in checks if not c.passed]
    assert {table: _scan(stack, table) for table in target.tables} == {t: [item] for t, item in others.items()}
    assert not [item for item in _scan(stack, "IdempotencyTable") if "cleanup-1" in item["id"]["S"]]
    assert [d.body for d in dead_letters.peek(target.sqs, target.dead_letter_queue_url)] == ["not the smoke test's"]


def _someone_elses(stack: DeployedStack, table: str) -> dict[str, Any]:
    dynamodb = stack.servers.client("dynamodb")
    types = {
        a["AttributeName"]: a["AttributeType"]
        for a in dynamodb.describe_table(TableName=stack.table_name(table))["Table"]["AttributeDefinitions"]
    }
    item = {name: {kind: "1" if kind == "N" else "someone-else"} for name, kind in types.items()}
    dynamodb.put_item(TableName=stack.table_name(table), Item=item)
    return item


@pytest.mark.cores_own_application
def test_each_failed_check_is_one_line_and_the_exit_status_is_1(
    make_stack: Callable[..., DeployedStack], capsys: pytest.CaptureFixture[str]
) -> None:
    # No pollers: nothing consumes the queue, so nothing the smoke test waits for happens.
    checks = smoke.run_smoke(_target(make_stack()), run_id="nobody-home", timeout_s=1)

    assert smoke.report(checks, print) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FAIL")]
    assert failed == [
        *(f"FAIL {h.event_type} ends neither applied nor dead-lettered in 1s" for h in payloads.registered()),
        "FAIL the queue drained within 1s, so every resend was handled",
        "FAIL the poison message is in the dead-letter queue within 1s",
        "FAIL its ErrorType attribute is InvalidJson (found None)",
    ]


class _CloudFormation:
    def __init__(self, outputs: dict[str, str] | None = None, error: ClientError | None = None) -> None:
        self.outputs = outputs or {}
        self.error = error

    def describe_stacks(self, StackName: str) -> dict[str, Any]:  # noqa: N803 (boto3's parameter name)
        if self.error is not None:
            raise self.error
        outputs = [{"OutputKey": key, "OutputValue": value} for key, value in self.outputs.items()]
        return {"Stacks": [{"StackName": StackName, "Outputs": outputs}]}


class _Lambda:
    def __init__(self, variables: dict[str, str]) -> None:
        self.variables = variables

    def get_function_configuration(self, FunctionName: str) -> dict[str, Any]:  # noqa: N803 (boto3's name)
        assert FunctionName == "fn"
        return {"Environment": {"Variables": self.variables}}


# The core's test handlers, each with a table of its own: the deployed form read as for any registry.
HANDLERS = (TallyHandler, CallHandler)
TABLE_VARIABLES = {table_variable(table): f"deployed-{table}" for table in declared_tables(HANDLERS)}
ALL_OUTPUTS = {
    "ConsumerQueueUrl": "https://sqs.eu-west-1.amazonaws.com/1/q.fifo",
    "DeadLetterQueueUrl": "https://sqs.eu-west-1.amazonaws.com/1/dlq.fifo",
    "IdempotencyTableName": "idempotency",
    "ConsumerFunctionName": "fn",
}


def test_the_target_comes_from_the_stack_outputs() -> None:
    target = smoke.target_from_stack(
        _CloudFormation(ALL_OUTPUTS), _Lambda(TABLE_VARIABLES), "sqs", "dynamodb", "prod", HANDLERS
    )

    assert (target.queue_url, target.dead_letter_queue_url) == (
        ALL_OUTPUTS["ConsumerQueueUrl"],
        ALL_OUTPUTS["DeadLetterQueueUrl"],
    )
    assert (target.idempotency_table, target.fifo) == ("idempotency", True)
    assert target.tables == {table: f"deployed-{table}" for table in declared_tables(HANDLERS)}


def test_a_function_without_a_table_variable_is_named_with_what_it_lacks() -> None:
    first = table_variable(declared_tables(HANDLERS)[0])
    variables = {name: value for name, value in TABLE_VARIABLES.items() if name != first}

    with pytest.raises(smoke.SmokeError, match=f"the function of stack 'prod' has no variable {first}"):
        smoke.target_from_stack(_CloudFormation(ALL_OUTPUTS), _Lambda(variables), "sqs", "dynamodb", "prod", HANDLERS)


def test_a_stack_without_the_outputs_is_named_with_what_it_lacks() -> None:
    partial = {k: v for k, v in ALL_OUTPUTS.items() if k != "DeadLetterQueueUrl"}

    with pytest.raises(smoke.SmokeError, match="stack 'other' has no output DeadLetterQueueUrl"):
        smoke.target_from_stack(_CloudFormation(partial), _Lambda({}), "sqs", "dynamodb", "other")


def test_a_stack_that_does_not_exist_says_so() -> None:
    missing = ClientError(
        {"Error": {"Code": "ValidationError", "Message": "Stack with id nope does not exist"}}, "DescribeStacks"
    )

    with pytest.raises(smoke.SmokeError, match=r"cannot describe stack 'nope': .*does not exist"):
        smoke.target_from_stack(_CloudFormation(error=missing), _Lambda({}), "sqs", "dynamodb", "nope")
