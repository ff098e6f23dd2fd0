"""The FIFO order checks of the local stack and its --fifo flag, without servers."""

from __future__ import annotations

import pytest

from local import fifo
from local.cli import _parameters
from local.poller import BatchReport, BatchVerdict
from testkit import messages
from testkit.invocation import Invocation
from tests.core.handlers import tally_body

A1 = messages.Outgoing(tally_body("e1", "t-a", key="k1"), "drawn", "k1", group="t-a")
A2 = messages.Outgoing(tally_body("e2", "t-a", key="k2"), "drawn", "k2", group="t-a")
B1 = messages.Outgoing(tally_body("e3", "t-b", key="k3"), "drawn", "k3", group="t-b")
SENT = {"m1": A1, "m2": B1, "m3": A2, "m4": A1}  # m4: a resend of m1


def test_a_group_completed_in_the_order_sent_passes_whatever_other_groups_did() -> None:
    assert fifo.out_of_order(SENT, {"m2": 0, "m1": 1, "m3": 2, "m4": 3}) == []


def test_a_message_completed_before_an_earlier_one_of_its_group_is_named() -> None:
    (problem,) = fifo.out_of_order(SENT, {"m3": 0, "m1": 1, "m2": 2, "m4": 3})
    assert problem == "group t-a: m3 completed before m1, which was sent earlier"


def test_a_message_that_never_completed_is_named() -> None:
    assert fifo.out_of_order(SENT, {"m1": 0, "m2": 1, "m3": 2}) == ["group t-a: m4 never completed"]


def test_completed_ids_keep_the_batch_order_and_drop_failures_and_whole_batch_failures() -> None:
    invocation = Invocation(None, None, False, 0.1, "r")
    partial = BatchReport(BatchVerdict.PARTIAL, 3, 2, ("b",), invocation, message_ids=("c", "b", "a"))
    raised = BatchReport(BatchVerdict.RAISED, 2, 0, ("a", "c"), invocation, message_ids=("c", "a"))
    assert (partial.completed_ids, raised.completed_ids) == (("c", "a"), ())


def test_a_message_goes_to_its_group_else_its_key_else_the_keyless_group() -> None:
    assert (A1.group_id, messages.Outgoing(A1.body, "drawn", "k1").group_id) == ("t-a", "k1")
    assert messages.Outgoing("{", "poison").group_id == messages.NO_KEY_GROUP


def test_fifo_flag_sets_the_queue_type_and_refuses_a_contradicting_param() -> None:
    assert _parameters(["BatchSize=5"], fifo=True) == {"BatchSize": "5", "QueueType": "fifo"}
    with pytest.raises(SystemExit, match="--fifo contradicts --param QueueType=standard"):
        _parameters(["QueueType=standard"], fifo=True)
