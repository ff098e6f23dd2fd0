"""The FIFO order checks of the local stack and its --fifo flag, without servers."""

from __future__ import annotations

import pytest

from local import fifo
from local.cli import _parameters
from local.poller import BatchReport, BatchVerdict
from testkit import messages
from testkit.invocation import Invocation

A1 = messages.payment("k1", "p1", "acc-a", 100)
A2 = messages.payment("k2", "p2", "acc-a", 200)
B1 = messages.payment("k3", "p3", "acc-b", 300)
SENT = {"m1": A1, "m2": B1, "m3": A2, "m4": A1}  # m4: a resend of m1


def test_a_group_completed_in_the_order_sent_passes_whatever_other_groups_did() -> None:
    assert fifo.out_of_order(SENT, {"m2": 0, "m1": 1, "m3": 2, "m4": 3}) == []


def test_a_message_completed_before_an_earlier_one_of_its_group_is_named() -> None:
    (problem,) = fifo.out_of_order(SENT, {"m3": 0, "m1": 1, "m2": 2, "m4": 3})
    assert problem == "group acc-a: m3 completed before m1, which was sent earlier"


def test_a_message_that_never_completed_is_named() -> None:
    assert fifo.out_of_order(SENT, {"m1": 0, "m2": 1, "m3": 2}) == ["group acc-a: m4 never completed"]


def test_a_payment_applied_by_its_resend_is_named() -> None:
    assert fifo.not_first_copies(SENT, {"p1": "m1", "p2": "m3", "p3": "m2"}) == []
    assert fifo.not_first_copies(SENT, {"p1": "m4", "p2": "m3", "p3": "m2"}) == [
        "payment p1: applied by m4, its first copy sent was m1"
    ]


def test_completed_ids_keep_the_batch_order_and_drop_failures_and_whole_batch_failures() -> None:
    invocation = Invocation(None, None, False, 0.1, "r")
    partial = BatchReport(BatchVerdict.PARTIAL, 3, 2, ("b",), invocation, message_ids=("c", "b", "a"))
    raised = BatchReport(BatchVerdict.RAISED, 2, 0, ("a", "c"), invocation, message_ids=("c", "a"))
    assert (partial.completed_ids, raised.completed_ids) == (("c", "a"), ())


def test_a_message_without_an_account_goes_to_its_own_group_unless_told() -> None:
    broken = messages.Outgoing("{", "poison")
    assert (A1.group_id, broken.group_id) == ("acc-a", messages.NO_ACCOUNT_GROUP)
    assert messages.Outgoing("{", "from-file", group="g-7").group_id == "g-7"


def test_fifo_flag_sets_the_queue_type_and_refuses_a_contradicting_param() -> None:
    assert _parameters(["BatchSize=5"], fifo=True) == {"BatchSize": "5", "QueueType": "fifo"}
    with pytest.raises(SystemExit, match="--fifo contradicts --param QueueType=standard"):
        _parameters(["QueueType=standard"], fifo=True)
