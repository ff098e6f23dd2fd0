"""The chaos run's forced faults land by construction: each kind owed to an environment is taken at its next
opportunity, whatever the draws (chaos/faults.py)."""

from __future__ import annotations

import random
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from chaos.faults import FaultKind, FaultPolicy, Zombies
from chaos.journal import Journal, read
from chaos.store_calls import Step, StoreCall
from chaos.transport_faults import TransportCall
from consumer.handler import Effect, MessageContext
from consumer.idempotency.calls import COMMIT_UPDATE


def _owing(
    tmp_path: Path, kind: FaultKind, *, drawn: float = 0.0, forced_on: str | None = None, owed: int = 1
) -> FaultPolicy:
    zombies = Zombies(tmp_path, max_paused=1, max_pause_s=1.0, owner_of=lambda record: None)
    rates = {**dict.fromkeys(FaultKind, 0.0), kind: drawn}  # by default nothing drawn: what lands was forced
    journal = Journal(tmp_path / "journal")
    return FaultPolicy(
        rates,
        random.Random(1),
        journal,
        "idempotency",
        zombies,
        Counter({kind: owed - journal.paid[kind.value]}),
        forced_on,
    )


def test_a_forced_crash_after_a_claim_is_taken_at_the_first_claim_with_no_handler_beside_it(tmp_path: Path) -> None:
    # A wave's claims go out before any of its handlers runs: waiting for one beside it, the crash was never met.
    policy = _owing(tmp_path, FaultKind.CRASH_AFTER_CLAIM)

    plan = policy._state_machine_fault(StoreCall(Step.CLAIM, "Held#1", "token"), attempt=1)

    assert plan is not None and plan.after is not None and plan.before is None


@pytest.mark.parametrize("kind", [FaultKind.CRASH_BEFORE_COMMIT, FaultKind.CRASH_AFTER_COMMIT])
def test_a_forced_crash_at_a_commit_waits_for_a_lock_handler_running_beside_it(tmp_path: Path, kind: FaultKind) -> None:
    policy = _owing(tmp_path, kind)

    assert policy._state_machine_fault(StoreCall(Step.COMMIT, "Held#1", "token"), attempt=1) is None

    policy._handlers["Other#2"] = True  # another lock handler of this invocation, running
    plan = policy._state_machine_fault(StoreCall(Step.COMMIT, "Held#1", "token"), attempt=1)
    assert plan is not None and (plan.before or plan.after) is not None


def test_a_forced_slow_handler_waits_for_a_free_pause_slot_so_that_a_poller_stays_free(tmp_path: Path) -> None:
    policy = _owing(tmp_path, FaultKind.SLOW_HANDLER)
    policy._handlers["Other#2"] = True  # a lock handler running beside it: the slow one's opportunity
    context = MessageContext(message_id="m-1", idempotency_key="1", receive_count=1, remaining_ms=lambda: 10_000)
    slowed = policy.slowed(lambda payload, context: Effect(), "Held", hold_s=0.01)

    with policy.zombies.slot() as paused:  # the run's one pause slot, taken by another worker
        assert paused
        slowed({}, context)
        assert policy.forced[FaultKind.SLOW_HANDLER] == 1, "with every slot taken, the fault is passed on, still owed"

    slowed({}, context)
    assert policy.forced[FaultKind.SLOW_HANDLER] == 0


def test_a_forced_slow_handler_waits_for_a_neighbour_still_running_not_one_that_has_ended(tmp_path: Path) -> None:
    # A neighbour that has ended may have committed: held beside it, a lock group's late commit repeats nothing.
    policy = _owing(tmp_path, FaultKind.SLOW_HANDLER)
    context = MessageContext(message_id="m-1", idempotency_key="1", receive_count=1, remaining_ms=lambda: 10_000)
    slowed = policy.slowed(lambda payload, context: Effect(), "Held", hold_s=0.01)

    policy._handlers["Other#2"] = False  # started in this invocation, ended
    slowed({}, context)
    assert policy.forced[FaultKind.SLOW_HANDLER] == 1

    policy._handlers["Other#2"] = True
    slowed({}, context)
    assert policy.forced[FaultKind.SLOW_HANDLER] == 0


def test_a_fault_drawn_on_another_handlers_record_leaves_the_forced_one_owed_to_its_handler(tmp_path: Path) -> None:
    # Paid by a draw on another record, the forced handler went without it in some short runs.
    policy = _owing(tmp_path, FaultKind.CRASH_AFTER_CLAIM, drawn=1.0, forced_on="Guarded")
    assert policy._state_machine_fault(StoreCall(Step.CLAIM, "Other#1", "token"), attempt=1) is not None
    policy.inject(FaultKind.CRASH_AFTER_CLAIM, "Other#1")  # what the crash would journal
    assert policy.forced[FaultKind.CRASH_AFTER_CLAIM] == 1

    # Still owed to the runtime process that follows a crash, which reads what was paid from the journal.
    after_the_crash = _owing(tmp_path, FaultKind.CRASH_AFTER_CLAIM, forced_on="Guarded")
    assert after_the_crash.forced[FaultKind.CRASH_AFTER_CLAIM] == 1
    after_the_crash.inject(FaultKind.CRASH_AFTER_CLAIM, "Guarded#2")
    assert after_the_crash.forced[FaultKind.CRASH_AFTER_CLAIM] == 0
    assert _owing(tmp_path, FaultKind.CRASH_AFTER_CLAIM, forced_on="Guarded").forced[FaultKind.CRASH_AFTER_CLAIM] == 0


def _commits(*records: str) -> TransportCall:
    """A group's commits of ``records`` in one transaction, as the store sends them."""
    items = [
        {"Update": {"TableName": "idempotency", "Key": {"id": {"S": record}}, "UpdateExpression": COMMIT_UPDATE}}
        for record in records
    ]
    return TransportCall("dynamodb", "TransactWriteItems", {"TransactItems": items}, attempt=1)


def _journaled(tmp_path: Path) -> list[dict[str, Any]]:
    return list(read([tmp_path / "journal"]))


def test_a_transport_fault_on_a_shared_transaction_is_journaled_on_each_of_its_records(tmp_path: Path) -> None:
    policy = _owing(tmp_path, FaultKind.THROTTLED)

    assert policy(_commits("Call#1", "Call#2")) is not None

    (fault,) = (entry for entry in _journaled(tmp_path) if entry["event"] == "fault")
    assert (fault["kind"], fault["record"], fault["others"]) == ("throttled", "Call#1", ["Call#2"])


def test_a_commit_held_back_while_a_zombie_holds_its_first_record_journals_the_others_it_held_back(
    tmp_path: Path,
) -> None:
    policy = _owing(tmp_path, FaultKind.THROTTLED, owed=0)
    policy.zombies.hold("Call#1")
    threading.Timer(0.2, policy.zombies.let_go, args=("Call#1",)).start()

    assert policy(_commits("Call#1", "Call#2")) is None

    assert [(entry["event"], entry["record"]) for entry in _journaled(tmp_path)] == [("held_back", "Call#2")]
    # Once no zombie holds it, a commit goes through unheld, and nothing is journaled.
    assert policy(_commits("Call#1", "Call#3")) is None
    assert len(_journaled(tmp_path)) == 1


def test_a_kind_forced_on_any_record_is_paid_by_its_first_fault_whatever_the_record(tmp_path: Path) -> None:
    # A transport fault is forced at any first attempt: unpaid on another handler's record, every call that followed
    # was given one, until one came to the forced handler.
    policy = _owing(tmp_path, FaultKind.THROTTLED, forced_on="Guarded")

    assert policy(_commits("Call#1")) is not None
    assert policy.forced[FaultKind.THROTTLED] == 0
    assert policy(_commits("Call#2")) is None
