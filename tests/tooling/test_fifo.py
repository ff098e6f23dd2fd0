"""The local stack with ``QueueType=fifo``: queues as the template makes them, per-group order, held groups, send."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from local import fifo, state
from local.poller import BatchReport, Poller, PollerGroup
from local.session import describe
from local.stack import DeployedStack
from testkit import dead_letters, messages
from testkit.invocation import Invocation, Invoker
from testkit.lambda_sqs import record_from_message
from testkit.webhook import WebhookSink
from tests.tooling import generic
from tests.tooling.template_copies import on_the_cores_own_application

pytestmark = pytest.mark.cores_own_application
test_on_the_cores_own_application = on_the_cores_own_application(__name__, seconds=60)

REPO_ROOT = Path(__file__).resolve().parents[2]
FIFO = {"QueueType": "fifo"}


@pytest.fixture
def fifo_stack(make_stack: Callable[..., DeployedStack]) -> DeployedStack:
    return make_stack(parameter_overrides=FIFO)


class RecordingRuntime:
    """The stack's runtime, keeping every event it was invoked with."""

    def __init__(self, runtime: Invoker) -> None:
        self._runtime = runtime
        self.events: list[dict[str, Any]] = []

    @property
    def function(self) -> Any:
        return self._runtime.function

    def invoke(self, event: dict[str, Any]) -> Invocation:
        self.events.append(event)
        return self._runtime.invoke(event)


def consume(
    stack: DeployedStack, sent: dict[str, messages.Outgoing], pollers: int, timeout_s: float = 30.0
) -> tuple[fifo.CompletionLog, list[BatchReport], RecordingRuntime]:
    """Run ``pollers`` pollers until every sent message has completed."""
    log = fifo.CompletionLog()
    reports: list[BatchReport] = []

    def on_batch(report: BatchReport) -> None:
        reports.append(report)
        log.record(report)

    runtime = RecordingRuntime(stack.fleet.add())
    sqs = stack.servers.client("sqs")
    group = PollerGroup([Poller(sqs, stack.queue, stack.trigger, runtime, on_batch=on_batch) for _ in range(pollers)])
    with group:
        deadline = time.monotonic() + timeout_s
        while not set(sent) <= set(log.positions()):
            assert time.monotonic() < deadline, f"not completed: {sorted(set(sent) - set(log.positions()))}"
            time.sleep(0.1)
    return log, reports, runtime


def _drawn(stack: DeployedStack, groups: int, per_handler: int) -> list[messages.Outgoing]:
    """``per_handler`` drawn messages of each registered handler, dealt over ``groups`` message groups."""
    made = [
        generic.drawn(stack, handler, f"fifo-{handler.event_type}-{n}", seed=n)
        for handler in generic.HANDLERS
        for n in range(per_handler)
    ]
    return [replace(message, group=f"group-{index % groups}") for index, message in enumerate(made)]


def test_a_fifo_stack_applies_every_group_in_the_order_sent(fifo_stack: DeployedStack) -> None:
    queue, dlq = fifo_stack.queue, fifo_stack.dead_letter_queue
    assert (queue.name.endswith(".fifo"), dlq.name.endswith(".fifo")) == (True, True)
    for attributes in (queue.attributes, dlq.attributes):
        assert attributes["ContentBasedDeduplication"] == "false"
        assert attributes["DeduplicationScope"] == "messageGroup"
        assert attributes["FifoThroughputLimit"] == "perMessageGroupId"
    drawn = _drawn(fifo_stack, groups=3, per_handler=6)
    # Producer resends, later in their group than the original: the original must complete first.
    sent = messages.send_all(fifo_stack.servers.client("sqs"), queue.url, [*drawn, drawn[0], drawn[4]])

    log, _, runtime = consume(fifo_stack, sent, pollers=2)

    records = [record for event in runtime.events for record in event["Records"]]
    for record in records:
        assert record["attributes"]["MessageGroupId"] == sent[record["messageId"]].group
        assert record["attributes"]["MessageDeduplicationId"]
        assert record["attributes"]["SequenceNumber"].isdigit()
    assert len({r["attributes"]["MessageDeduplicationId"] for r in records}) == len(sent)
    assert fifo.out_of_order(sent, log.positions()) == []
    assert [m.key for m in drawn if generic.outcome(fifo_stack, m) is None] == []


@pytest.mark.parametrize("handler", generic.HANDLERS, ids=generic.IDS)
def test_a_message_held_elsewhere_holds_its_group_back_and_the_rest_is_applied_after_it(
    fifo_stack: DeployedStack, handler: generic.Handler
) -> None:
    made = [generic.drawn(fifo_stack, handler, f"held-{n}", seed=n) for n in range(1, 6)]
    first, held, *later = [replace(message, group="held") for message in made[:4]]
    other = replace(made[4], group="free")
    generic.hold(fifo_stack, held, for_ms=6_000)
    sent = messages.send_all(fifo_stack.servers.client("sqs"), fifo_stack.queue.url, [first, held, *later, other])
    ids = {message.key: message_id for message_id, message in sent.items()}

    log, reports, _ = consume(fifo_stack, sent, pollers=1)

    # The first batch: the held key failed, and its group's later messages were handed back unapplied.
    assert set(reports[0].failed_ids) == {ids[m.key] for m in (held, *later)}
    assert set(reports[0].completed_ids) == {ids[first.key], ids[other.key]}
    assert fifo.out_of_order(sent, log.positions()) == []
    # Once the lease ran out, the held message was claimed again and settled, and the rest after it.
    assert [m.key for m in (first, held, *later, other) if generic.outcome(fifo_stack, m) is None] == []


def _drain(sqs: Any, url: str) -> list[dict[str, Any]]:
    """Every message of a FIFO queue, deleting each (a group is held while one of its messages is received)."""
    received: list[dict[str, Any]] = []
    while answer := sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"], WaitTimeSeconds=0
    ).get("Messages"):
        received += answer
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(answer)]
        sqs.delete_message_batch(QueueUrl=url, Entries=entries)
    return received


def _send(state_dir: Path, *args: str) -> str:
    """``make send`` against the stack described in ``state_dir``."""
    done = subprocess.run(
        [sys.executable, "-m", "local", "send", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "LOCAL_STACK_DIR": str(state_dir), "PYTHONPATH": str(REPO_ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_send_gives_each_message_its_key_as_group_and_a_deduplication_id_of_its_own(
    fifo_stack: DeployedStack, webhook_sink: WebhookSink, tmp_path: Path
) -> None:
    state.write(describe(fifo_stack), tmp_path / "state.json")

    def send(*args: str) -> str:
        return _send(tmp_path, *args)

    out = send("--count", "12", "--duplicates", "0.5", "--seed", "3")
    sqs = fifo_stack.servers.client("sqs")
    received = _drain(sqs, fifo_stack.queue.url)
    assert f"sent {len(received)} message(s)" in out
    assert len(received) > 12  # the resends reached the queue: SQS deduplicated none of them
    for message in received:
        key = json.loads(message["Body"])["metadata"]["idempotencyKey"]
        assert message["Attributes"]["MessageGroupId"] == key
    assert len({m["Attributes"]["MessageDeduplicationId"] for m in received}) == len(received)


def test_redrive_sends_a_fifo_dead_letter_back_into_its_group(fifo_stack: DeployedStack) -> None:
    sqs = fifo_stack.servers.client("sqs")
    (letter,) = _drawn(fifo_stack, groups=1, per_handler=1)[:1]
    messages.send_all(sqs, fifo_stack.dead_letter_queue.url, [letter])

    moved = dead_letters.redrive(sqs, fifo_stack.dead_letter_queue.url, fifo_stack.queue.url)

    assert moved == 1
    (back,) = _drain(sqs, fifo_stack.queue.url)
    assert (back["Body"], back["Attributes"]["MessageGroupId"]) == (letter.body, letter.group)


def test_on_a_standard_queue_send_tags_fair_queue_tenants_and_the_poller_delivers_them(
    stack: DeployedStack, webhook_sink: WebhookSink, tmp_path: Path
) -> None:
    # A fair queue is a standard queue whose producer sets MessageGroupId; SQS hands the group to the
    # consumer in the record's attributes, from an ARN without ".fifo" (so no FIFO semantics apply).
    state.write(describe(stack), tmp_path / "state.json")
    _send(tmp_path, "--count", "6", "--tenants", "3", "--seed", "5")
    received = _drain(stack.servers.client("sqs"), stack.queue.url)
    assert sorted(m["Attributes"]["MessageGroupId"] for m in received) == [f"tenant-{i}" for i in (0, 0, 1, 1, 2, 2)]
    assert all("MessageDeduplicationId" not in m["Attributes"] for m in received)
    record = record_from_message(received[0], queue_arn=stack.queue.arn)
    assert record["attributes"]["MessageGroupId"].startswith("tenant-")
    assert not record["eventSourceARN"].endswith(".fifo")
