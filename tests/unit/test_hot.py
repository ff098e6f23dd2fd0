"""make hot's bookkeeping: what counts as applied and returned, and which targets a run misses."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from local.cli import parser
from local.hot import Figures, TimedRuntime, Tracker
from testkit import messages as outgoing
from testkit.invocation import Invocation

_MESSAGES = [outgoing.payment(f"k{index}", f"p{index}", "acc-1", 100) for index in range(3)]


def _event(*ids: str) -> dict[str, Any]:
    return {"Records": [{"messageId": message_id} for message_id in ids]}


class _Runtime:
    function = object()

    def __init__(self, invocation: Invocation) -> None:
        self.invocation = invocation

    def invoke(self, event: dict[str, Any]) -> Invocation:
        del event
        return self.invocation


def _invocation(response: Any = None, error: BaseException | None = None, timed_out: bool = False) -> Invocation:
    return Invocation(response, error, timed_out, 0.01, "request")


def test_a_message_is_done_at_its_first_completion_and_every_return_is_counted() -> None:
    tracker = Tracker()
    tracker.sent(dict(zip(["a", "b", "c"], _MESSAGES, strict=True)), at=1.0)
    tracker.finished(["a", "b"], returned={"b"}, at=2.0)
    assert not tracker.all_done()
    tracker.finished(["b", "c", "a"], returned=set(), at=3.0)
    assert tracker.all_done()
    assert tracker.done_at == {"a": 2.0, "b": 3.0, "c": 3.0}
    assert (tracker.deliveries, tracker.returned) == (5, 1)
    assert [message.key for message in tracker.applied()] == ["k0", "k1", "k2"]


@pytest.mark.parametrize(
    ("invocation", "returned"),
    [
        (_invocation({"batchItemFailures": [{"itemIdentifier": "b"}]}), {"b"}),
        (_invocation(None), set()),
        (_invocation(error=RuntimeError("raised")), {"a", "b"}),
        (_invocation({}, timed_out=True), {"a", "b"}),
        (_invocation({"batchItemFailures": [{"itemIdentifier": "not-in-batch"}]}), {"a", "b"}),
    ],
)
def test_the_runtime_wrapper_reports_what_goes_back_to_sqs(invocation: Invocation, returned: set[str]) -> None:
    tracker = Tracker()
    tracker.sent(dict(zip(["a", "b"], _MESSAGES[:2], strict=True)), at=1.0)
    TimedRuntime(_Runtime(invocation), tracker).invoke(_event("a", "b"))  # type: ignore[arg-type]
    assert tracker.returned == len(returned)
    assert set(tracker.done_at) == {"a", "b"} - returned


_MET = Figures(
    accounts=1,
    messages=100,
    serial_per_s=50.0,
    ceiling_per_s=60.0,
    throughput_per_s=45.0,
    p50_s=0.5,
    p99_s=1.5,
    deliveries=100,
    returned=0,
    not_done=0,
    dead_lettered=0,
    webhook_repeats=0,
    proxy={},
    outcomes={},
    wrong_balances=0,
)


@pytest.mark.parametrize(
    ("change", "missed"),
    [
        ({"throughput_per_s": 39.0}, "throughput >= 80% of the serial limit"),
        ({"returned": 1}, "fewer than 1% of records returned to SQS"),
        ({"dead_lettered": 1}, "0 healthy messages in the DLQ"),
        ({"webhook_repeats": 1}, "0 webhook calls repeated"),
        ({"not_done": 1}, "every message applied before the timeout"),
        ({"wrong_balances": 1}, "every balance the sum of its distinct applied payments"),
    ],
)
def test_each_missed_target_is_named(change: dict[str, Any], missed: str) -> None:
    assert _MET.misses() == []
    assert dataclasses.replace(_MET, **change).misses() == [missed]


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        (["--latency-ms", "-1"], "milliseconds >= 0"),
        (["--hold-ms", "x"], "must be a number of milliseconds >= 0, got 'x'"),
        (["--messages", "0"], "whole number >= 1"),
        (["--serial", "many"], "whole number >= 1, got 'many'"),
        (["--receipts", "1.5"], "between 0 and 1"),
    ],
)
def test_bad_arguments_are_refused(arguments: list[str], complaint: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["hot", *arguments])
    assert complaint in capsys.readouterr().err


def test_defaults_are_the_issue_targets_setup() -> None:
    arguments: argparse.Namespace = parser().parse_args(["hot"])
    assert (arguments.pollers, arguments.batch_size, arguments.latency_ms) == (4, 10, 10.0)
    assert arguments.accounts == [1, 100]
