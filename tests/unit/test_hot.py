"""make hot's bookkeeping: what counts as applied and returned, and which targets a run misses."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from local.cli import parser
from local.hot import Figures, Tracker
from local.poller import BatchReport, BatchVerdict
from testkit import messages as outgoing
from testkit.invocation import Invocation

_MESSAGES = [outgoing.payment(f"k{index}", f"p{index}", "acc-1", 100) for index in range(3)]


def _report(ids: list[str], verdict: BatchVerdict = BatchVerdict.PARTIAL, failed: tuple[str, ...] = ()) -> BatchReport:
    invocation = Invocation(None, None, False, 0.01, "request")
    deleted = 0 if verdict.deletes_nothing else len(ids) - len(failed)
    return BatchReport(verdict, len(ids), deleted, failed, invocation, message_ids=tuple(ids))


def test_a_message_is_done_at_its_first_completion_and_every_return_is_counted() -> None:
    tracker = Tracker()
    tracker.sent(dict(zip(["a", "b", "c"], _MESSAGES, strict=True)), at=1.0)
    tracker.finished(_report(["a", "b"], failed=("b",)))
    assert not tracker.all_done()
    first_done = tracker.done_at["a"]
    tracker.finished(_report(["b", "c", "a"]))
    assert tracker.all_done()
    assert tracker.done_at["a"] == first_done <= tracker.done_at["b"] == tracker.done_at["c"]
    assert (tracker.deliveries, tracker.returned) == (5, 1)
    assert [message.key for message in tracker.applied()] == ["k0", "k1", "k2"]


@pytest.mark.parametrize(
    ("report", "returned"),
    [
        (_report(["a", "b"], failed=("b",)), {"b"}),
        (_report(["a", "b"]), set()),
        (_report(["a", "b"], BatchVerdict.RAISED, failed=("a", "b")), {"a", "b"}),
        (_report(["a", "b"], BatchVerdict.TIMED_OUT, failed=("a", "b")), {"a", "b"}),
        (_report(["a", "b"], BatchVerdict.INVALID_RESPONSE, failed=("a", "b")), {"a", "b"}),
    ],
)
def test_what_a_batch_sends_back_to_sqs_is_counted_as_returned(report: BatchReport, returned: set[str]) -> None:
    tracker = Tracker()
    tracker.sent(dict(zip(["a", "b"], _MESSAGES[:2], strict=True)), at=1.0)
    tracker.finished(report)
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
