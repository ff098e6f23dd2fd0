"""The queue, its dead-letter queue and the rules that tie them to the function; the relay's dead-letter queue."""

from __future__ import annotations

import itertools
from typing import Any

from testkit.template import ACCOUNT_ID, REGION, ResourceRef, Template
from tests.deployment.lookups import (
    SQS_QUEUE_NAME,
    event_source_mapping,
    parameter_candidates,
    parameter_name,
    properties,
    read,
    resources_of_type,
)

SQS_MAX_VISIBILITY_TIMEOUT = 12 * 3600
SQS_MAX_RETENTION = 14 * 24 * 3600


def test_queue_redrives_to_the_dead_letter_queue_after_the_parameterised_receive_count(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    redrive = resolver.resolve(properties(transformed_template, "ConsumerQueue")["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == ResourceRef("ConsumerDeadLetterQueue", "Arn")
    assert redrive["maxReceiveCount"] == 5

    parameter = parameter_name(properties(transformed_template, "ConsumerQueue")["RedrivePolicy"]["maxReceiveCount"])
    overridden = read(transformed_template, **{parameter: 9}).resolve(
        properties(transformed_template, "ConsumerQueue")["RedrivePolicy"]
    )
    assert overridden["maxReceiveCount"] == 9
    # Throttled and in-flight retries count as receives too; fewer than 5 dead-letters healthy messages.
    assert transformed_template["Parameters"][parameter]["MinValue"] >= 5


def test_dead_letter_queue_accepts_redrives_from_the_consumer_queue_only(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    allow = resolver.resolve(properties(transformed_template, "ConsumerDeadLetterQueue")["RedriveAllowPolicy"])
    queue_name = resolver.resolve(properties(transformed_template, "ConsumerQueue")["QueueName"])
    assert allow["redrivePermission"] == "byQueue"
    assert allow["sourceQueueArns"] == [f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{queue_name}"]
    assert SQS_QUEUE_NAME.fullmatch(queue_name), queue_name


def test_every_queue_is_encrypted(transformed_template: dict[str, Any]) -> None:
    queues = resources_of_type(transformed_template, "AWS::SQS::Queue")
    # The core's, and any a handler emits to (a destination).
    assert set(queues) >= {"ConsumerQueue", "ConsumerDeadLetterQueue", "RelayDeadLetterQueue"}
    for name, queue in queues.items():
        assert queue["Properties"].get("SqsManagedSseEnabled") is True, name


def test_dead_letter_queue_keeps_messages_longest(transformed_template: dict[str, Any], resolver: Template) -> None:
    dead_letter = resolver.resolve(properties(transformed_template, "ConsumerDeadLetterQueue"))
    queue = resolver.resolve(properties(transformed_template, "ConsumerQueue"))
    assert dead_letter["MessageRetentionPeriod"] == SQS_MAX_RETENTION
    # A standard queue's message keeps its first enqueue time in the DLQ: it needs the longer retention.
    assert queue.get("MessageRetentionPeriod", 4 * 24 * 3600) < dead_letter["MessageRetentionPeriod"]


def test_the_relays_dead_letter_queue_is_a_standard_queue_keeping_its_records_longest(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    # An event source mapping's on-failure destination must be a standard queue, whatever QueueType is.
    for queue_type in ("standard", "fifo"):
        relay = read(transformed_template, QueueType=queue_type).resolve(
            properties(transformed_template, "RelayDeadLetterQueue")
        )
        assert relay.get("FifoQueue") is None and relay["MessageRetentionPeriod"] == SQS_MAX_RETENTION, queue_type


def test_idempotency_records_outlive_every_redelivery(transformed_template: dict[str, Any]) -> None:
    queue_retention = properties(transformed_template, "ConsumerQueue").get("MessageRetentionPeriod", 4 * 24 * 3600)
    function = properties(transformed_template, "ConsumerFunction")
    ttl_parameter = parameter_name(function["Environment"]["Variables"]["IDEMPOTENCY_TTL_SECONDS"])
    for ttl in parameter_candidates(transformed_template, ttl_parameter):
        assert ttl >= queue_retention


def test_visibility_timeout_covers_six_function_timeouts_and_the_batching_window_for_every_allowed_value(
    transformed_template: dict[str, Any],
) -> None:
    timeout_parameter = parameter_name(properties(transformed_template, "ConsumerFunction")["Timeout"])
    window_parameter = parameter_name(event_source_mapping(transformed_template)["MaximumBatchingWindowInSeconds"])
    checked = 0
    for timeout, window in itertools.product(
        parameter_candidates(transformed_template, timeout_parameter),
        parameter_candidates(transformed_template, window_parameter),
    ):
        resolver = read(transformed_template, **{timeout_parameter: timeout, window_parameter: window})
        visibility = resolver.resolve(properties(transformed_template, "ConsumerQueue")["VisibilityTimeout"])
        assert 6 * timeout + window <= visibility <= SQS_MAX_VISIBILITY_TIMEOUT, (timeout, window, visibility)
        checked += 1
    assert checked > 1


FIFO_PROPERTIES = {
    "FifoQueue": True,
    "ContentBasedDeduplication": False,
    "DeduplicationScope": "messageGroup",
    "FifoThroughputLimit": "perMessageGroupId",
}


def test_fifo_queue_type_makes_both_queues_high_throughput_fifo_without_content_deduplication(
    transformed_template: dict[str, Any],
) -> None:
    reading = read(transformed_template, QueueType="fifo")
    queue = reading.resolve(properties(transformed_template, "ConsumerQueue"))
    dead_letter = reading.resolve(properties(transformed_template, "ConsumerDeadLetterQueue"))
    for name, resolved in (("ConsumerQueue", queue), ("ConsumerDeadLetterQueue", dead_letter)):
        assert {key: resolved.get(key) for key in FIFO_PROPERTIES} == FIFO_PROPERTIES, name
    assert queue["QueueName"] == "idempotent-sqs-consumer-consumer.fifo"
    # CloudFormation adds .fifo to the name it generates for an unnamed FIFO queue.
    assert "QueueName" not in dead_letter
    assert dead_letter["RedriveAllowPolicy"]["sourceQueueArns"] == [
        f"arn:aws:sqs:{REGION}:{ACCOUNT_ID}:{queue['QueueName']}"
    ]
    assert queue["RedrivePolicy"]["deadLetterTargetArn"] == ResourceRef("ConsumerDeadLetterQueue", "Arn")


def test_standard_queue_type_sets_no_fifo_property(transformed_template: dict[str, Any], resolver: Template) -> None:
    for logical_id in ("ConsumerQueue", "ConsumerDeadLetterQueue"):
        resolved = resolver.resolve(properties(transformed_template, logical_id))
        assert set(resolved) & set(FIFO_PROPERTIES) == set(), logical_id
    assert not resolver.resolve(properties(transformed_template, "ConsumerQueue"))["QueueName"].endswith(".fifo")
