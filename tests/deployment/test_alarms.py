"""The alarms (the consumer's four, the relay's three) watch the right resources and notify the optional topic."""

from __future__ import annotations

import re
from typing import Any

import pytest

from testkit.template import ResourceRef, Template
from tests.deployment.lookups import event_source_mapping, read, resources_of_type

TOPIC = "arn:aws:sns:us-east-1:123456789012:payments-oncall"


def _alarm(
    resolver: Template,
    template: dict[str, Any],
    namespace: str,
    metric: str,
    queue: str | None = None,
    function: str | None = None,
) -> dict[str, Any]:
    matching = [
        resolver.resolve(alarm["Properties"])
        for alarm in resources_of_type(template, "AWS::CloudWatch::Alarm").values()
        if (alarm["Properties"]["Namespace"], alarm["Properties"]["MetricName"]) == (namespace, metric)
    ]
    if queue is not None:
        matching = [alarm for alarm in matching if _dimensions(alarm) == {"QueueName": ResourceRef(queue, "QueueName")}]
    if function is not None:
        matching = [alarm for alarm in matching if _dimensions(alarm) == {"FunctionName": ResourceRef(function)}]
    assert len(matching) == 1, f"expected one {namespace} {metric} alarm, found {len(matching)}"
    return matching[0]


def _dimensions(alarm: dict[str, Any]) -> dict[str, Any]:
    return {dimension["Name"]: dimension["Value"] for dimension in alarm["Dimensions"]}


@pytest.mark.parametrize("queue", ["ConsumerDeadLetterQueue", "RelayDeadLetterQueue"])
def test_dead_letter_queue_alarm_fires_on_the_first_message(
    transformed_template: dict[str, Any], resolver: Template, queue: str
) -> None:
    alarm = _alarm(resolver, transformed_template, "AWS/SQS", "ApproximateNumberOfMessagesVisible", queue)
    assert (alarm["Statistic"], alarm["ComparisonOperator"], alarm["Threshold"]) == (
        "Maximum",
        "GreaterThanThreshold",
        0,
    )


def test_oldest_message_alarm_watches_the_consumer_queue_at_the_parameterised_age(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    alarm = _alarm(resolver, transformed_template, "AWS/SQS", "ApproximateAgeOfOldestMessage", "ConsumerQueue")
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == ("GreaterThanThreshold", 300)
    overridden = _alarm(
        read(transformed_template, **{"OldestMessageAgeAlarmSeconds": 900}),
        transformed_template,
        "AWS/SQS",
        "ApproximateAgeOfOldestMessage",
        "ConsumerQueue",
    )
    assert overridden["Threshold"] == 900


def test_dead_letter_age_alarm_fires_long_before_the_dlq_deletes_its_oldest_message(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    alarm = _alarm(
        resolver, transformed_template, "AWS/SQS", "ApproximateAgeOfOldestMessage", "ConsumerDeadLetterQueue"
    )
    retention = transformed_template["Resources"]["ConsumerDeadLetterQueue"]["Properties"]["MessageRetentionPeriod"]
    assert (alarm["Statistic"], alarm["ComparisonOperator"]) == ("Maximum", "GreaterThanThreshold")
    # At least six days left to redrive or inspect it once the alarm fires.
    assert retention - (alarm["Threshold"] + alarm["Period"] * alarm["EvaluationPeriods"]) >= 6 * 86_400


@pytest.mark.parametrize("function", ["ConsumerFunction", "RelayFunction"])
def test_function_errors_alarm_fires_on_any_error(
    transformed_template: dict[str, Any], resolver: Template, function: str
) -> None:
    alarm = _alarm(resolver, transformed_template, "AWS/Lambda", "Errors", function=function)
    assert (alarm["Statistic"], alarm["ComparisonOperator"], alarm["Threshold"]) == ("Sum", "GreaterThanThreshold", 0)


def test_relay_iterator_age_alarm_calls_someone_long_before_a_record_is_given_up(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    alarm = _alarm(resolver, transformed_template, "AWS/Lambda", "IteratorAge", function="RelayFunction")
    mapping = resolver.resolve(event_source_mapping(transformed_template, "RelayFunction"))
    assert (alarm["Statistic"], alarm["ComparisonOperator"]) == ("Maximum", "GreaterThanThreshold")
    # IteratorAge is in milliseconds: the alarm's whole wait, at most a quarter of the age a record is given up at.
    waited_ms = alarm["Threshold"] + alarm["Period"] * alarm["EvaluationPeriods"] * 1000
    assert 0 < waited_ms <= mapping["MaximumRecordAgeInSeconds"] * 1000 / 4


@pytest.mark.parametrize(("topic", "actions"), [("", None), (TOPIC, [TOPIC])])
def test_alarms_notify_the_topic_only_when_one_is_given(
    transformed_template: dict[str, Any], topic: str, actions: list[str] | None
) -> None:
    resolver = read(transformed_template, **{"AlarmTopicArn": topic})
    alarms = resources_of_type(transformed_template, "AWS::CloudWatch::Alarm")
    assert len(alarms) == 7
    for name, alarm in alarms.items():
        resolved = resolver.resolve(alarm["Properties"])
        assert resolved.get("AlarmActions") == actions, name
        assert resolved.get("OKActions") == actions, name


@pytest.mark.parametrize(
    ("value", "accepted"),
    [("", True), (TOPIC, True), ("arn:aws:sqs:us-east-1:123456789012:queue", False), ("oncall", False)],
)
def test_alarm_topic_parameter_accepts_only_an_sns_topic_or_nothing(
    transformed_template: dict[str, Any], value: str, accepted: bool
) -> None:
    pattern = transformed_template["Parameters"]["AlarmTopicArn"]["AllowedPattern"]
    assert bool(re.fullmatch(pattern, value)) is accepted
