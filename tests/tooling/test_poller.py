"""The poller behaves as Lambda's SQS event source mapping: event shape, context, deletes, redrive."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from local.poller import BatchReport, BatchVerdict, reported_failures
from local.stack import DeployedStack
from tests.tooling.lambda_shape import RECORD_KEYS
from tests.tooling.template_copies import (
    function_properties,
    probe_function,
    queue_properties,
    sqs_event_properties,
    template_copy,
)

# A handler whose behaviour each test picks through the message body. It runs in Lambda's
# runtime, another process: what it saw goes to a file beside it, one JSON line per invocation.
PROBE = """
import json
import os
import time


def handler(event, context):
    seen = {"event": event, "remaining_ms": context.get_remaining_time_in_millis(),
                 "function_name": context.function_name, "arn": context.invoked_function_arn,
                 "memory": context.memory_limit_in_mb, "request_id": context.aws_request_id}
    with open(os.path.join(os.environ["LAMBDA_TASK_ROOT"], "seen.jsonl"), "a") as log:
        log.write(json.dumps(seen) + "\\n")
    bodies = [record["body"] for record in event["Records"]]
    if "raise" in bodies:
        raise RuntimeError("the handler failed")
    if "unknown-id" in bodies:
        return {"batchItemFailures": [{"itemIdentifier": "not-in-this-batch"}]}
    if "sleep" in bodies:
        time.sleep(1.5)
    return {"batchItemFailures": [{"itemIdentifier": r["messageId"]} for r in event["Records"] if r["body"] == "fail"]}
"""


@pytest.fixture
def probe_stack(make_stack: Callable[..., DeployedStack], tmp_path: Path) -> Callable[..., DeployedStack]:
    """The template with the probe as its handler, a 1 s visibility timeout unless told, and the given edits."""

    def make(
        timeout_s: int = 5, max_receive_count: int = 5, batch_size: int = 10, visibility_timeout_s: int = 1
    ) -> DeployedStack:
        module, code_dir = probe_function(tmp_path, PROBE)

        def edit(document: dict[str, Any]) -> None:
            function = function_properties(document)
            function.update(Handler=f"{module}.handler", CodeUri=str(code_dir), Timeout=timeout_s)
            queue_properties(document)["VisibilityTimeout"] = visibility_timeout_s
            queue_properties(document)["RedrivePolicy"]["maxReceiveCount"] = max_receive_count
            sqs_event_properties(document)["BatchSize"] = batch_size

        return make_stack(template_path=template_copy(tmp_path, edit))

    return make


def _seen(stack: DeployedStack) -> list[dict[str, Any]]:
    seen = stack.function.code_dir / "seen.jsonl"
    lines = seen.read_text(encoding="utf-8").splitlines() if seen.exists() else []
    return [json.loads(line) for line in lines]


def _queue_depth(stack: DeployedStack, url: str | None = None) -> int:
    attributes = stack.servers.client("sqs").get_queue_attributes(
        QueueUrl=url or stack.queue.url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])


def test_reported_failures_follow_lambdas_rules() -> None:
    batch = {"a", "b"}
    assert reported_failures(None, batch) == (set(), "")
    assert reported_failures({}, batch) == (set(), "")
    assert reported_failures({"batchItemFailures": []}, batch) == (set(), "")
    assert reported_failures({"batchItemFailures": [{"itemIdentifier": "b"}]}, batch) == ({"b"}, "")
    whole_batch_fails: object
    for whole_batch_fails in (
        {"batchItemFailures": [{"itemIdentifier": "c"}]},
        {"batchItemFailures": [{"itemIdentifier": ""}]},
        {"batchItemFailures": [{"itemIdentifier": None}]},
        {"batchItemFailures": [{}]},
        {"batchItemFailures": "a"},
        "a",
    ):
        assert reported_failures(whole_batch_fails, batch)[0] is None, whole_batch_fails


def test_event_has_lambdas_shape_and_context_follows_timeout(probe_stack: Callable[..., DeployedStack]) -> None:
    stack = probe_stack(timeout_s=7)
    sqs = stack.servers.client("sqs")
    sent = sqs.send_message(
        QueueUrl=stack.queue.url,
        MessageBody="ok",
        MessageAttributes={
            "IdempotencyKey": {"DataType": "String", "StringValue": "k-1"},
            "Blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
        },
    )

    report = stack.poller().poll_once()

    assert report is not None
    assert report.verdict is BatchVerdict.PARTIAL
    assert report.deleted == 1
    seen = _seen(stack)[-1]
    (record,) = seen["event"]["Records"]
    assert set(record) >= RECORD_KEYS
    assert record["messageId"] == sent["MessageId"]
    assert record["md5OfBody"] == hashlib.md5(b"ok").hexdigest()
    assert (record["eventSource"], record["eventSourceARN"], record["awsRegion"]) == (
        "aws:sqs",
        stack.queue.arn,
        "us-east-1",
    )
    assert record["attributes"]["ApproximateReceiveCount"] == "1"
    assert {"SentTimestamp", "SenderId", "ApproximateFirstReceiveTimestamp"} <= set(record["attributes"])
    assert record["messageAttributes"]["IdempotencyKey"] == {
        "stringValue": "k-1",
        "binaryValue": None,
        "stringListValues": [],
        "binaryListValues": [],
        "dataType": "String",
    }
    assert base64.b64decode(record["messageAttributes"]["Blob"]["binaryValue"]) == b"\x00\xff"
    # Timeout less what had passed when the handler asked, at most the whole invocation (a cold start included).
    assert 7_000 - report.invocation.duration_s * 1000 <= seen["remaining_ms"] <= 7_000
    assert seen["function_name"] == stack.function.name
    # The emulator builds the ARN with an account of its own: the function part is what it takes from us.
    assert seen["arn"].endswith(f":function:{stack.function.name}")
    assert seen["memory"] == str(stack.function.memory_mb)  # a string, as in Lambda's Python runtime
    assert _queue_depth(stack) == 0


def test_only_reported_failures_stay_in_the_queue(probe_stack: Callable[..., DeployedStack]) -> None:
    stack = probe_stack()
    sqs = stack.servers.client("sqs")
    for body in ("ok", "fail", "ok"):
        sqs.send_message(QueueUrl=stack.queue.url, MessageBody=body)
    poller = stack.poller()

    received = 0
    while received < 3:
        report = poller.poll_once()
        received += report.received if report else 0

    assert _queue_depth(stack) == 1
    time.sleep(1.2)  # the failure's visibility timeout
    again = poller.poll_once()
    assert again is not None
    assert [r["body"] for r in _seen(stack)[-1]["event"]["Records"]] == ["fail"]
    assert _seen(stack)[-1]["event"]["Records"][0]["attributes"]["ApproximateReceiveCount"] == "2"


@pytest.mark.parametrize(
    ("body", "verdict"),
    [("raise", BatchVerdict.RAISED), ("unknown-id", BatchVerdict.INVALID_RESPONSE), ("sleep", BatchVerdict.TIMED_OUT)],
)
def test_nothing_is_deleted_when_the_batch_fails_whole(
    probe_stack: Callable[..., DeployedStack], body: str, verdict: BatchVerdict
) -> None:
    # The probe sleeps 1.5 s: a 1 s Timeout times it out by construction, and 30 s keeps the other verdicts (and a
    # cold start, which the emulator counts against Timeout) far from it.
    stack = probe_stack(timeout_s=1 if verdict is BatchVerdict.TIMED_OUT else 30)
    sqs = stack.servers.client("sqs")
    sqs.send_message(QueueUrl=stack.queue.url, MessageBody="ok")
    sqs.send_message(QueueUrl=stack.queue.url, MessageBody=body)
    poller = stack.poller()

    reports: list[BatchReport] = []
    while sum(report.received for report in reports) < 2:
        report = poller.poll_once()
        if report is not None:
            reports.append(report)

    failing = [r for r in reports if r.verdict is verdict]
    assert failing, [r.verdict for r in reports]
    assert all(r.deleted == 0 for r in failing)
    assert _queue_depth(stack) == sum(r.received for r in failing)


def test_redrive_policy_moves_a_message_that_keeps_failing(probe_stack: Callable[..., DeployedStack]) -> None:
    stack = probe_stack(max_receive_count=2)
    sqs = stack.servers.client("sqs")
    sqs.send_message(QueueUrl=stack.queue.url, MessageBody="raise")
    poller = stack.poller()

    deadline = time.monotonic() + 20
    while _queue_depth(stack, stack.dead_letter_queue.url) == 0 and time.monotonic() < deadline:
        poller.poll_once()

    assert len(_seen(stack)) == 2  # maxReceiveCount deliveries, then the queue moved it
    assert _queue_depth(stack) == 0
    moved = sqs.receive_message(QueueUrl=stack.dead_letter_queue.url, WaitTimeSeconds=1)["Messages"]
    assert [message["Body"] for message in moved] == ["raise"]


def test_pollers_in_parallel_consume_everything(probe_stack: Callable[..., DeployedStack]) -> None:
    # The emulator counts a cold start against Timeout: 30 s leaves four at once on a loaded machine far from it. The
    # visibility timeout, longer still, keeps every message away while its batch is being handled.
    stack = probe_stack(batch_size=5, timeout_s=30, visibility_timeout_s=60)
    sqs = stack.servers.client("sqs")
    bodies = {f"ok-{index}" for index in range(60)}
    for start in range(0, 60, 10):
        entries = [{"Id": str(i), "MessageBody": f"ok-{start + i}"} for i in range(10)]
        sqs.send_message_batch(QueueUrl=stack.queue.url, Entries=entries)

    with stack.pollers(4):
        deadline = time.monotonic() + 60
        while _queue_depth(stack) and time.monotonic() < deadline:
            time.sleep(0.1)

    assert stack.stats.verdicts == Counter({"partial": stack.stats.invocations})
    # At least once, as SQS promises: concurrent receives may hand a message to two pollers.
    delivered = [record["body"] for seen in _seen(stack) for record in seen["event"]["Records"]]
    assert set(delivered) == bodies
    assert _queue_depth(stack) == 0
    assert stack.stats.invocations > 1
    assert max(len(seen["event"]["Records"]) for seen in _seen(stack)) <= 5
    assert len({seen["request_id"] for seen in _seen(stack)}) == len(_seen(stack))
