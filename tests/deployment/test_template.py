"""Resources come from template.yaml itself: a changed value in the template changes the local stack."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from consumer.config import table_variable
from consumer.handler import declared_tables
from consumer.outbox import OUTBOX_TABLE
from service.registry import HANDLERS
from testkit.servers import LocalServers
from testkit.template import TEMPLATE_PATH, Template, TemplateError, load_template
from tests.tooling.template_copies import (
    function_properties,
    queue_properties,
    sqs_event_properties,
    template_copy,
)


def test_short_tags_become_intrinsic_functions(tmp_path: Path) -> None:
    source = tmp_path / "t.yaml"
    source.write_text(
        textwrap.dedent(
            """
            Parameters:
              Env: {Type: String, Default: dev, AllowedValues: [dev, prod]}
            Conditions:
              IsProd: !Equals [!Ref Env, prod]
            Mappings:
              Sizes: {dev: {Memory: 128}, prod: {Memory: 1024}}
            Resources:
              Thing:
                Type: AWS::SQS::Queue
                Properties:
                  Name: !Sub "${AWS::StackName}-${Env}-${!Literal}"
                  Memory: !FindInMap [Sizes, !Ref Env, Memory]
                  Alarm: !If [IsProd, "on", !Ref AWS::NoValue]
                  Joined: !Join ["/", [a, !Select [1, !Split [",", "x,y,z"]]]]
                  Either: !Or [!Condition IsProd, !Not [!Equals [1, 2]]]
            """
        )
    )

    dev = Template.from_file(source, stack_name="s")
    assert dev.properties("Thing") == {
        "Name": "s-dev-${Literal}",
        "Memory": 128,
        "Joined": "a/y",
        "Either": True,
    }
    prod = Template.from_file(source, stack_name="s", parameter_overrides={"Env": "prod"})
    assert prod.properties("Thing")["Alarm"] == "on"
    assert prod.properties("Thing")["Memory"] == 1024
    with pytest.raises(TemplateError, match="not one of"):
        Template.from_file(source, parameter_overrides={"Env": "staging"})
    with pytest.raises(TemplateError, match="unknown parameter"):
        Template.from_file(source, parameter_overrides={"Nope": "1"})


def test_sam_globals_reach_a_function_and_its_own_values_win() -> None:
    function = {"Type": "AWS::Serverless::Function", "Properties": {"Environment": {"Variables": {"B": "own"}}}}
    template = Template(
        {
            "Globals": {"Function": {"Timeout": 9, "Environment": {"Variables": {"A": "global", "B": "global"}}}},
            "Resources": {"Fn": function, "Queue": {"Type": "AWS::SQS::Queue", "Properties": {}}},
        }
    )
    assert template.properties("Fn") == {"Timeout": 9, "Environment": {"Variables": {"A": "global", "B": "own"}}}
    assert template.properties("Queue") == {}


def test_parameter_bounds_of_the_real_template_are_enforced() -> None:
    with pytest.raises(TemplateError, match="below its MinValue"):
        Template.from_file(TEMPLATE_PATH, parameter_overrides={"MaxReceiveCount": 1})
    with pytest.raises(TemplateError, match="not one of"):
        Template.from_file(TEMPLATE_PATH, parameter_overrides={"FunctionTimeoutSeconds": 31})


def test_template_defaults_are_applied(local_servers: LocalServers) -> None:
    resources = local_servers.deploy()
    template = load_template()
    parameters = template["Parameters"]
    sqs = local_servers.client("sqs")

    queue = resources.queues["ConsumerQueue"]
    dead_letter = resources.queues["ConsumerDeadLetterQueue"]
    attributes = sqs.get_queue_attributes(QueueUrl=queue.url, AttributeNames=["All"])["Attributes"]
    redrive = json.loads(attributes["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dead_letter.arn
    assert int(redrive["maxReceiveCount"]) == parameters["MaxReceiveCount"]["Default"]
    timeout = str(parameters["FunctionTimeoutSeconds"]["Default"])
    expected_visibility = template["Mappings"]["QueueVisibilityByFunctionTimeout"][timeout]["VisibilityTimeout"]
    assert int(attributes["VisibilityTimeout"]) == expected_visibility

    dynamodb = local_servers.client("dynamodb")
    idempotency = dynamodb.describe_table(TableName=resources.tables["IdempotencyTable"].name)["Table"]
    assert idempotency["KeySchema"] == [{"AttributeName": "id", "KeyType": "HASH"}]
    ttl = dynamodb.describe_time_to_live(TableName=resources.tables["IdempotencyTable"].name)
    assert ttl["TimeToLiveDescription"] == {"TimeToLiveStatus": "ENABLED", "AttributeName": "expiresAt"}
    # Each table the registered handlers declare exists, its name in the variable the function reads.
    for table in declared_tables(HANDLERS):
        dynamodb.describe_table(TableName=resources.tables[table].name)

    function = resources.function("ConsumerFunction")
    assert function.handler == "service.lambda_function.handler"
    assert function.timeout_s == int(timeout)
    assert function.environment["IDEMPOTENCY_TABLE_NAME"] == resources.tables["IdempotencyTable"].name
    for table in declared_tables(HANDLERS):
        assert function.environment[table_variable(table)] == resources.tables[table].name
    assert function.environment["DEAD_LETTER_QUEUE_URL"] == dead_letter.url
    (trigger,) = function.triggers
    assert trigger.queue_arn == queue.arn
    assert trigger.batch_size == parameters["BatchSize"]["Default"]
    assert trigger.report_batch_item_failures

    # The outbox streams its new images; the relay reads that stream, no queue: the function the queue feeds is the
    # stack's one function unless named.
    outbox = resources.tables[OUTBOX_TABLE]
    described = dynamodb.describe_table(TableName=outbox.name)["Table"]
    assert described["StreamSpecification"] == {"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"}
    assert outbox.stream_arn == described["LatestStreamArn"]
    assert function.environment[table_variable(OUTBOX_TABLE)] == outbox.name
    relay = resources.function("RelayFunction")
    assert (relay.handler, relay.triggers) == ("consumer.relay.handler", ())
    assert resources.function() == function


def test_a_changed_copy_of_the_template_is_applied(local_servers: LocalServers, tmp_path: Path) -> None:
    # The copy is written back with long-form intrinsics ({"Ref": ...}), which must resolve too.
    def edit(document: dict) -> None:
        queue_properties(document)["RedrivePolicy"]["maxReceiveCount"] = 7
        queue_properties(document)["VisibilityTimeout"] = 45
        sqs_event_properties(document).update(BatchSize=4, MaximumBatchingWindowInSeconds=2)
        function_properties(document)["Timeout"] = 12

    copy = template_copy(tmp_path, edit)
    (tmp_path / "src").mkdir()

    resources = local_servers.deploy(copy)

    sqs = local_servers.client("sqs")
    attributes = sqs.get_queue_attributes(QueueUrl=resources.queues["ConsumerQueue"].url, AttributeNames=["All"])[
        "Attributes"
    ]
    assert json.loads(attributes["RedrivePolicy"])["maxReceiveCount"] == 7
    assert attributes["VisibilityTimeout"] == "45"
    function = resources.function()
    assert (function.triggers[0].batch_size, function.triggers[0].batching_window_s) == (4, 2)
    assert function.timeout_s == 12
    assert function.code_dir == (tmp_path / "src").resolve()


def test_parameter_overrides_flow_into_queue_function_and_environment(local_servers: LocalServers) -> None:
    resources = local_servers.deploy(
        parameter_overrides={
            "FunctionTimeoutSeconds": 60,
            "BatchSize": 3,
            "MaxReceiveCount": 9,
            "IdempotencyTtlSeconds": 432_000,
        }
    )
    sqs = local_servers.client("sqs")
    attributes = sqs.get_queue_attributes(QueueUrl=resources.queues["ConsumerQueue"].url, AttributeNames=["All"])[
        "Attributes"
    ]
    assert attributes["VisibilityTimeout"] == "380"  # the template's mapping for a 60 s function
    assert json.loads(attributes["RedrivePolicy"])["maxReceiveCount"] == 9
    function = resources.function()
    assert function.timeout_s == 60
    assert function.triggers[0].batch_size == 3
    assert function.environment["IDEMPOTENCY_TTL_SECONDS"] == "432000"
