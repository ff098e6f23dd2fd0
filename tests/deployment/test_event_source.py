"""The SQS event source mapping: partial batch responses, batching, and its two scaling modes."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from testkit.template import ResourceRef, TemplateError
from tests.deployment.combinations import SHAPES, shape_id
from tests.deployment.lookups import event_source_mapping, parameter_candidates, parameter_name, read

# Lambda's SQS rule: more than 10 records per batch needs a batching window of at least 1 s.
SQS_UNWINDOWED_MAX_BATCH = 10
FIFO_MAX_BATCH = 10
MAXIMUM_CONCURRENCY_RANGE = range(2, 1001)
# Lambda's ranges for an SQS event source in provisioned mode.
MINIMUM_POLLERS_RANGE = range(2, 201)
MAXIMUM_POLLERS_RANGE = range(2, 2001)


def test_queue_drives_the_function_with_partial_batch_responses_and_counts_its_events(
    transformed_template: dict[str, Any], resolver: Any
) -> None:
    mapping = resolver.resolve(event_source_mapping(transformed_template))
    assert mapping["EventSourceArn"] == ResourceRef("ConsumerQueue", "Arn")
    assert mapping["FunctionName"] == ResourceRef("ConsumerFunction")
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["BatchSize"] == 10
    assert mapping["MaximumBatchingWindowInSeconds"] == 0
    assert mapping["MetricsConfig"] == {"Metrics": ["EventCount"]}
    # On-demand by default: Lambda scales the pollers, the queue's concurrency is capped.
    assert mapping["ScalingConfig"] == {"MaximumConcurrency": 5}
    assert "ProvisionedPollerConfig" not in mapping


@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_each_mode_configures_its_own_scaling_and_never_both(
    transformed_template: dict[str, Any], shape: dict[str, Any]
) -> None:
    settings = {**shape, "MaximumConcurrency": 40, "MinimumPollers": 3, "MaximumPollers": 30}
    mapping = read(transformed_template, **settings).resolve(event_source_mapping(transformed_template))
    if shape["EventSourceMode"] == "provisioned":
        assert mapping["ProvisionedPollerConfig"] == {"MinimumPollers": 3, "MaximumPollers": 30}
        assert "ScalingConfig" not in mapping
    else:
        assert mapping["ScalingConfig"] == {"MaximumConcurrency": 40}
        assert "ProvisionedPollerConfig" not in mapping
    assert mapping["MetricsConfig"] == {"Metrics": ["EventCount"]}
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]


def test_every_allowed_batching_setting_is_one_lambda_accepts(transformed_template: dict[str, Any]) -> None:
    mapping = event_source_mapping(transformed_template)
    batch_sizes = parameter_candidates(transformed_template, parameter_name(mapping["BatchSize"]))
    windows = parameter_candidates(transformed_template, parameter_name(mapping["MaximumBatchingWindowInSeconds"]))
    for batch_size, window in itertools.product(batch_sizes, windows):
        assert batch_size <= SQS_UNWINDOWED_MAX_BATCH or window >= 1, (batch_size, window)
        assert batch_size <= FIFO_MAX_BATCH, batch_size


def test_every_allowed_scaling_setting_is_one_lambda_accepts(transformed_template: dict[str, Any]) -> None:
    mapping = event_source_mapping(transformed_template)
    checked = 0
    for concurrency in parameter_candidates(transformed_template, "MaximumConcurrency"):
        resolved = read(transformed_template, MaximumConcurrency=concurrency).resolve(mapping)
        assert resolved["ScalingConfig"]["MaximumConcurrency"] in MAXIMUM_CONCURRENCY_RANGE
        checked += 1
    for minimum, maximum in itertools.product(
        parameter_candidates(transformed_template, "MinimumPollers"),
        parameter_candidates(transformed_template, "MaximumPollers"),
    ):
        provisioned = read(
            transformed_template, EventSourceMode="provisioned", MinimumPollers=minimum, MaximumPollers=maximum
        ).resolve(mapping)["ProvisionedPollerConfig"]
        assert provisioned["MinimumPollers"] in MINIMUM_POLLERS_RANGE
        assert provisioned["MaximumPollers"] in MAXIMUM_POLLERS_RANGE
        checked += 1
    assert checked > 2


def test_fifo_queue_gets_no_batching_window(transformed_template: dict[str, Any]) -> None:
    mapping = read(transformed_template, QueueType="fifo").resolve(event_source_mapping(transformed_template))
    assert "MaximumBatchingWindowInSeconds" not in mapping
    assert mapping["EventSourceArn"] == ResourceRef("ConsumerQueue", "Arn")


def test_a_batching_window_on_a_fifo_queue_is_refused_with_the_reason(transformed_template: dict[str, Any]) -> None:
    with pytest.raises(TemplateError, match="MaximumBatchingWindowInSeconds must be 0 when QueueType is fifo"):
        read(transformed_template, QueueType="fifo", MaximumBatchingWindowInSeconds=5)
    # The same window on a standard queue is fine.
    assert read(transformed_template, MaximumBatchingWindowInSeconds=5).parameters["MaximumBatchingWindowInSeconds"]


@pytest.mark.parametrize(
    ("name", "value", "reason"),
    [
        ("QueueType", "fifo-ish", "not one of"),
        ("EventSourceMode", "manual", "not one of"),
        ("MinimumPollers", 1, "below its MinValue"),
        ("MaximumPollers", 2001, "above its MaxValue"),
    ],
)
def test_invalid_shape_parameters_are_refused_by_name(
    transformed_template: dict[str, Any], name: str, value: Any, reason: str
) -> None:
    with pytest.raises(
        TemplateError, match=f"parameter {name}={value!r}.*{reason}|parameter {name}={value} .*{reason}"
    ):
        read(transformed_template, **{name: value})


def test_provisioned_mode_by_default_cannot_take_an_accounts_default_concurrency(
    transformed_template: dict[str, Any],
) -> None:
    # Each provisioned poller drives up to 10 concurrent invocations; an account has 1,000 by
    # default, of which 100 always stay unreserved for its other functions.
    resolver = read(transformed_template, EventSourceMode="provisioned")
    provisioned = resolver.resolve(event_source_mapping(transformed_template))
    assert provisioned["ProvisionedPollerConfig"]["MaximumPollers"] * 10 <= 1_000 - 100


def test_provisioned_pollers_are_capped_by_reserved_concurrency_and_on_demand_reserves_nothing(
    transformed_template: dict[str, Any],
) -> None:
    provisioned = read(transformed_template, EventSourceMode="provisioned", ProvisionedReservedConcurrency=60)
    assert provisioned.properties("ConsumerFunction")["ReservedConcurrentExecutions"] == 60
    defaults = read(transformed_template, EventSourceMode="provisioned")
    reserved = defaults.properties("ConsumerFunction")["ReservedConcurrentExecutions"]
    pollers = defaults.resolve(event_source_mapping(transformed_template))["ProvisionedPollerConfig"]["MaximumPollers"]
    # The default reservation is what the default pollers can drive, and leaves an account its unreserved 100.
    assert reserved == pollers * 10 <= 1_000 - 100
    on_demand = read(transformed_template, EventSourceMode="on-demand")
    assert "ReservedConcurrentExecutions" not in on_demand.properties("ConsumerFunction")
