"""The dashboard names only metrics the stack emits, under the namespaces and dimensions they carry."""

from __future__ import annotations

import json
from typing import Any

import pytest

from consumer.config import table_parameter
from consumer.relay import METRICS
from testkit.template import LOCAL_TABLES, ResourceRef, Template
from tests.deployment.lookups import properties, read, resources_of_type

# AWS metrics the dashboard may chart: namespace -> metric -> (dimension, resource type it names).
AWS_METRICS: dict[str, dict[str, tuple[str, str]]] = {
    "AWS/SQS": {
        metric: ("QueueName", "AWS::SQS::Queue")
        for metric in (
            "ApproximateNumberOfMessagesVisible",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateAgeOfOldestMessage",
        )
    },
    "AWS/Lambda": {
        metric: ("FunctionName", "AWS::Lambda::Function")
        for metric in ("Duration", "Errors", "Throttles", "IteratorAge")
    },
    "AWS/DynamoDB": {
        metric: ("TableName", "AWS::DynamoDB::Table") for metric in ("WriteThrottleEvents", "TransactionConflict")
    },
}
# What the dashboard must show, whatever else it shows.
REQUIRED = {
    ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "ConsumerQueue"),
    ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "ConsumerDeadLetterQueue"),
    ("AWS/SQS", "ApproximateAgeOfOldestMessage", "ConsumerQueue"),
    ("AWS/Lambda", "Errors", "ConsumerFunction"),
    ("AWS/Lambda", "Throttles", "ConsumerFunction"),
    ("AWS/DynamoDB", "WriteThrottleEvents", "IdempotencyTable"),
    ("AWS/DynamoDB", "TransactionConflict", "IdempotencyTable"),
    ("AWS/Lambda", "IteratorAge", "RelayFunction"),
    ("AWS/Lambda", "Errors", "RelayFunction"),
    ("AWS/SQS", "ApproximateNumberOfMessagesVisible", "RelayDeadLetterQueue"),
}
# The relay's EMF metrics, under the consumer's namespace and service (its environment gives it the same): sent,
# failed, skipped, and the time from an item's commit to its send.
RELAY_METRICS = set(METRICS)


@pytest.fixture(scope="module")
def dashboard(transformed_template: dict[str, Any], resolver: Template) -> dict[str, Any]:
    (logical_id,) = resources_of_type(transformed_template, "AWS::CloudWatch::Dashboard")
    return json.loads(resolver.resolve(properties(transformed_template, logical_id)["DashboardBody"]))


@pytest.fixture(scope="module")
def emitted(started_function: str) -> list[dict[str, Any]]:
    """The ``_aws.CloudWatchMetrics`` directives of what the function prints, with their dimension values."""
    result = started_function
    documents = [json.loads(line) for line in result.splitlines() if line.startswith("{") and '"_aws"' in line]
    directives = []
    for document in documents:
        for directive in document["_aws"]["CloudWatchMetrics"]:
            dimensions = {name: document[name] for names in directive["Dimensions"] for name in names}
            directives.append({**directive, "dimension_values": dimensions})
    assert directives, result
    return directives


def _charted(dashboard: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    """(namespace, metric, dimensions) of every metric line; "..." repeats the line above, as CloudWatch reads it."""
    charted = []
    for widget in dashboard["widgets"]:
        previous: list[Any] = []
        for line in widget["properties"]["metrics"]:
            fields = [field for field in line if not isinstance(field, dict)]
            if fields and fields[0] == "...":
                fields = previous[: len(previous) - len(fields) + 1] + fields[1:]
            previous = fields
            namespace, metric, *pairs = fields
            charted.append((namespace, metric, dict(zip(pairs[::2], pairs[1::2], strict=True))))
    return charted


def test_every_custom_metric_charted_is_one_the_function_or_the_relay_emits(
    dashboard: dict[str, Any], emitted: list[dict[str, Any]], transformed_template: dict[str, Any], resolver: Template
) -> None:
    emitted_names = {
        (directive["Namespace"], metric["Name"], tuple(sorted(directive["dimension_values"].items())))
        for directive in emitted
        for metric in directive["Metrics"]
    }
    # The relay's, where the function's go: its Powertools namespace and service are the function's.
    consumer, relay = (
        resolver.resolve(properties(transformed_template, function)["Environment"]["Variables"])
        for function in ("ConsumerFunction", "RelayFunction")
    )
    for name in ("POWERTOOLS_METRICS_NAMESPACE", "POWERTOOLS_SERVICE_NAME"):
        assert relay[name] == consumer[name], name
    dimensions = (("service", relay["POWERTOOLS_SERVICE_NAME"]),)
    emitted_names |= {(relay["POWERTOOLS_METRICS_NAMESPACE"], name, dimensions) for name in RELAY_METRICS}
    namespaces = {directive["Namespace"] for directive in emitted}
    custom = [
        (namespace, metric, tuple(sorted(dimensions.items())))
        for namespace, metric, dimensions in _charted(dashboard)
        if namespace in namespaces
    ]
    assert set(custom) <= emitted_names
    # And every outcome the function counts is on the dashboard.
    assert {name for _, name, _ in emitted_names} == {metric for _, metric, _ in custom}


def test_every_aws_metric_charted_exists_and_names_a_resource_of_the_stack(
    dashboard: dict[str, Any], emitted: list[dict[str, Any]], transformed_template: dict[str, Any], resolver: Template
) -> None:
    custom_namespaces = {directive["Namespace"] for directive in emitted}
    # A table given by a parameter is charted by its name, the parameter's value.
    given = {resolver.parameters.get(table_parameter(table)): table for table in resolver.local(LOCAL_TABLES)}
    charted = set()
    for namespace, metric, dimensions in _charted(dashboard):
        if namespace in custom_namespaces:
            continue
        assert metric in AWS_METRICS.get(namespace, {}), (namespace, metric)
        dimension, resource_type = AWS_METRICS[namespace][metric]
        assert set(dimensions) == {dimension}, (namespace, metric, dimensions)
        # Resource values come through Fn::Sub as "LogicalId" or "LogicalId.Attribute".
        logical_id = given.get(dimensions[dimension]) or dimensions[dimension].split(".")[0]
        if logical_id not in given.values():
            assert transformed_template["Resources"][logical_id]["Type"] == resource_type, (metric, logical_id)
        if resource_type == "AWS::SQS::Queue":
            assert dimensions[dimension] == str(ResourceRef(logical_id, "QueueName"))
        charted.add((namespace, metric, logical_id))
    assert charted >= REQUIRED, REQUIRED - charted


def test_duration_is_charted_at_p50_and_p99(dashboard: dict[str, Any]) -> None:
    stats = {
        options.get("stat")
        for widget in dashboard["widgets"]
        for line in widget["properties"]["metrics"]
        if "Duration" in line
        for options in line
        if isinstance(options, dict)
    }
    assert stats == {"p50", "p99"}


def test_dashboard_follows_the_queue_type(transformed_template: dict[str, Any]) -> None:
    (logical_id,) = resources_of_type(transformed_template, "AWS::CloudWatch::Dashboard")
    body = read(transformed_template, QueueType="fifo").resolve(
        properties(transformed_template, logical_id)["DashboardBody"]
    )
    # Queue names are the queues' own attributes, so a FIFO stack's dashboard watches its .fifo queues.
    assert str(ResourceRef("ConsumerQueue", "QueueName")) in json.loads(body)["widgets"][1]["properties"]["metrics"][0]
