"""The functions' roles (the consumer's, the relay's): every statement names one of the stack's resources, nothing
more."""

from __future__ import annotations

from typing import Any

import pytest

from consumer.config import is_secret_arn
from consumer.handler import declared_settings
from consumer.outbox import OUTBOX_TABLE
from service.registry import HANDLERS
from testkit.template import secret_parameters as secret_parameters_of
from tests.deployment.lookups import (
    EVENT_SOURCE_POLLING,
    as_list,
    grants_by_resource,
    parameter_name,
    policy_statements,
    properties,
    read,
    resources_of_type,
)

ROLE = "ConsumerFunctionRole"
# Each function, its own role and its own log group.
FUNCTIONS = [
    ("ConsumerFunction", ROLE, "ConsumerLogGroup"),
    ("RelayFunction", "RelayFunctionRole", "RelayLogGroup"),
]


@pytest.mark.parametrize(("function", "role_id", "_"), FUNCTIONS)
def test_function_assumes_the_stacks_own_role_with_no_managed_policies(
    transformed_template: dict[str, Any], function: str, role_id: str, _: str
) -> None:
    assert properties(transformed_template, function)["Role"] == {"Fn::GetAtt": [role_id, "Arn"]}
    role = properties(transformed_template, role_id)
    assert role.get("ManagedPolicyArns", []) == []
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust == {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}


def test_no_statement_in_the_stack_uses_a_wildcard(transformed_template: dict[str, Any]) -> None:
    resolver = read(transformed_template)
    roles = resources_of_type(transformed_template, "AWS::IAM::Role")
    assert roles, "the stack should create the function's role"
    for role_id in roles:
        for statement in policy_statements(transformed_template, role_id):
            assert "NotAction" not in statement and "NotResource" not in statement, statement
            for action in as_list(statement["Action"]):
                assert "*" not in action, (role_id, statement.get("Sid"), action)
            for resource in as_list(resolver.resolve(statement["Resource"])):
                assert not (isinstance(resource, str) and "*" in resource), (role_id, statement.get("Sid"), resource)


def test_only_the_dead_letter_queue_receives_messages_from_the_function(transformed_template: dict[str, Any]) -> None:
    grants = grants_by_resource(transformed_template, ROLE)
    senders = {resource for resource, actions in grants.items() if "sqs:SendMessage" in actions}
    assert senders == {"ConsumerDeadLetterQueue"}


def test_event_source_polls_only_the_consumer_queue(transformed_template: dict[str, Any]) -> None:
    grants = grants_by_resource(transformed_template, ROLE)
    pollers = {resource for resource, actions in grants.items() if actions & EVENT_SOURCE_POLLING}
    assert pollers == {"ConsumerQueue"}
    assert grants["ConsumerQueue"] >= EVENT_SOURCE_POLLING


@pytest.mark.parametrize(("_", "role", "log_group"), FUNCTIONS)
def test_function_writes_only_its_own_log_group(
    transformed_template: dict[str, Any], _: str, role: str, log_group: str
) -> None:
    grants = grants_by_resource(transformed_template, role)
    writers = {resource for resource, actions in grants.items() if any(a.startswith("logs:") for a in actions)}
    assert writers == {log_group}
    assert grants[log_group] == {"logs:CreateLogStream", "logs:PutLogEvents"}


def test_the_consumer_may_only_put_into_the_outbox_and_only_the_relay_reads_its_stream(
    transformed_template: dict[str, Any],
) -> None:
    consumer, relay = (grants_by_resource(transformed_template, role) for role in (ROLE, "RelayFunctionRole"))
    # DescribeTable is the consumer's cold-start check that the table is there.
    assert consumer[OUTBOX_TABLE] == {"dynamodb:DescribeTable", "dynamodb:PutItem"}
    assert f"{OUTBOX_TABLE}.StreamArn" not in consumer
    assert OUTBOX_TABLE not in relay and f"{OUTBOX_TABLE}.StreamArn" in relay
    # Nothing of the relay's touches a table: its only DynamoDB actions are the stream's.
    assert {r for r, actions in relay.items() if any(a.startswith("dynamodb:") for a in actions)} == {
        f"{OUTBOX_TABLE}.StreamArn"
    }


SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:handler-secret-AbCdEf"


def _secret_parameters(template: dict[str, Any]) -> dict[str, str]:
    """The parameter that feeds each handler setting naming a secret (``SecretArn``), by its variable."""
    variables = properties(template, "ConsumerFunction")["Environment"]["Variables"]
    found = {}
    for model in declared_settings(HANDLERS):
        for name in (name for name in model.model_fields if is_secret_arn(model, name)):
            assert name.upper() in variables, f"{name.upper()} names a secret: give it to the function from a parameter"
            found[name.upper()] = parameter_name(variables[name.upper()])
    return found


def test_a_handlers_secret_is_readable_only_when_named_and_only_that_secret(
    registered_handlers: None,
    transformed_template: dict[str, Any],
) -> None:
    without = grants_by_resource(transformed_template, ROLE)
    assert not any(action.startswith("secretsmanager:") for actions in without.values() for action in actions)
    secret_parameters = _secret_parameters(transformed_template)
    for variable, parameter in secret_parameters.items():
        named = grants_by_resource(transformed_template, ROLE, **{parameter: SECRET_ARN})
        assert named == {**without, SECRET_ARN: {"secretsmanager:GetSecretValue"}}
        environment = read(transformed_template, **{parameter: SECRET_ARN}).properties("ConsumerFunction")
        assert environment["Environment"]["Variables"][variable] == SECRET_ARN
    # A secret's parameter (and its grant) left behind by a handler that is gone is an error too.
    assert set(secret_parameters_of(transformed_template)) == set(secret_parameters.values())


@pytest.mark.parametrize("tracing", ["off", "on"])
def test_tracing_is_active_with_xrays_grant_only_when_on_and_the_code_is_told(
    transformed_template: dict[str, Any], tracing: str
) -> None:
    # Lambda refuses active tracing to a role that cannot send traces; a grant left when off is a wildcard for nothing.
    function = read(transformed_template, Tracing=tracing).properties("ConsumerFunction")
    grants = grants_by_resource(transformed_template, ROLE, Tracing=tracing)
    untraced = grants_by_resource(transformed_template, ROLE, Tracing="off")
    on = tracing == "on"
    assert function["TracingConfig"] == {"Mode": "Active" if on else "PassThrough"}
    assert function["Environment"]["Variables"]["TRACING"] == str(on).lower()
    assert grants == ({**untraced, "*": {"xray:PutTraceSegments", "xray:PutTelemetryRecords"}} if on else untraced)
    assert "*" not in untraced
