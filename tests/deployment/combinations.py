"""The parameter combinations that change the template's shape, each checked by lint and by the tests."""

from __future__ import annotations

import itertools
from typing import Any

ALARM_TOPIC = "arn:aws:sns:us-east-1:123456789012:payments-oncall"

SHAPES: list[dict[str, Any]] = [
    {"QueueType": queue, "EventSourceMode": mode, "AlarmTopicArn": topic}
    for queue, mode, topic in itertools.product(["standard", "fifo"], ["on-demand", "provisioned"], ["", ALARM_TOPIC])
]


def shape_id(shape: dict[str, Any]) -> str:
    return "-".join(str(value).rsplit(":", 1)[-1] or "no-topic" for value in shape.values())
