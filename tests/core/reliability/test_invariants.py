"""Each invariant of the chaos checker, on a hand-made history of the core's test handlers (``tests/core/handlers.py``):
silent on a correct end state, and reporting the one violation planted in an otherwise correct one. An invariant
that cannot fire would pass every run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chaos.faults import FaultKind
from chaos.invariants import HELD_BACK, Checker, EndState, History
from chaos.journal import Journal
from consumer.envelope import payload_hash
from consumer.errors import ErrorType
from consumer.idempotency.record import Attr, Status
from consumer.outbox import Attr as Outbox
from consumer.outbox import derived_key
from testkit.dead_letters import DeadLetter
from testkit.messages import Outgoing
from testkit.webhook import ReceivedRequest
from tests.core.handlers import CALL_EVENT, TALLY_EVENT, call_body, call_payload, tally_body, tally_payload

ADDED = Outgoing(tally_body("e-1", key="add-1"), "drawn", "add-1")
# The key reused for another entry on another tally: a producer that regenerated its business id.
REUSED = Outgoing(tally_body("e-2", "t-2", key="add-1"), "reused", "add-1")
CALLED = Outgoing(call_body("c-1", key="call-1"), "drawn", "call-1")
BROKEN = Outgoing('{"eventType": ', "poison", None, ErrorType.INVALID_JSON)
SENT = {"m-added": ADDED, "m-resent": ADDED, "m-reused": REUSED, "m-called": CALLED, "m-broken": BROKEN}
TALLY_RECORD, CALL_RECORD = f"{TALLY_EVENT}#add-1", f"{CALL_EVENT}#call-1"


def _completed(record: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {Attr.ID: record, Attr.STATUS: Status.COMPLETED, Attr.PAYLOAD_HASH: payload_hash(payload)}


def _call(key: str, status: int = 200) -> ReceivedRequest:
    return ReceivedRequest("/calls", key, json.dumps(call_payload("c-1")), {"Idempotency-Key": key}, status, 0.0)


def _emitted(source: str, position: int, entry: str) -> dict[str, Any]:
    """The outbox item of the ``position``-th tally message ``source`` emitted, as the run scans it."""
    key = derived_key(source, position)
    return {Outbox.ID: key, Outbox.SOURCE_RECORD: source, Outbox.BODY: tally_body(entry, key=key)}


def _refused_downstream(message_id: str, key: str) -> DeadLetter:
    attributes = {"IdempotencyKey": {"StringValue": key, "DataType": "String"}}
    return DeadLetter(message_id, ErrorType.BUSINESS_CONDITION_FAILED, attributes=attributes)


# The tally message emits two: the first applied downstream, the second refused there by its handler's rule.
APPLIED_DOWNSTREAM, REFUSED_DOWNSTREAM = _emitted(TALLY_RECORD, 0, "e-10"), _emitted(TALLY_RECORD, 1, "e-11")
DOWNSTREAM_RECORD = f"{TALLY_EVENT}#{APPLIED_DOWNSTREAM[Outbox.ID]}"
CORRECT = EndState(
    records=[
        _completed(TALLY_RECORD, tally_payload("e-1")),
        _completed(CALL_RECORD, call_payload("c-1")),
        _completed(DOWNSTREAM_RECORD, tally_payload("e-10")),
    ],
    commits={TALLY_RECORD: 1, CALL_RECORD: 1, DOWNSTREAM_RECORD: 1},
    dead_letters=[
        DeadLetter("m-reused", ErrorType.IDEMPOTENCY_KEY_REUSED),
        DeadLetter("m-broken", ErrorType.INVALID_JSON),
        _refused_downstream("m-emitted-1", REFUSED_DOWNSTREAM[Outbox.ID]),
    ],
    webhook_calls=[_call("call-1")],
    drained=True,
    outbox=[APPLIED_DOWNSTREAM, REFUSED_DOWNSTREAM],
)


def _verdicts(end: EndState, history: History | None = None) -> dict[str, int]:
    checker = Checker(SENT, end, history or History())
    return {verdict.name: verdict.violations for verdict in checker.all()}


def _history(
    results: dict[str, set[str]] | None = None, zombies: tuple[str, ...] = (), foreign: tuple[str, ...] = ()
) -> History:
    history = History(zombie_writes_accepted=list(zombies), foreign_failure_ids=list(foreign))
    for message_id, outcomes in (results or {}).items():
        history.results[message_id] |= outcomes
    return history


def test_a_correct_end_state_has_no_violation() -> None:
    assert set(_verdicts(CORRECT).values()) == {0}
    # The duplicates' and the refused key's outcomes as a run journals them change nothing.
    history = _history(results={"m-added": {"applied"}, "m-resent": {"duplicate"}, "m-called": {"applied"}})
    assert set(_verdicts(CORRECT, history).values()) == {0}


_LOST_CALL = [record for record in CORRECT.records if record[Attr.ID] != CALL_RECORD]
_LOST_DOWNSTREAM = [record for record in CORRECT.records if record[Attr.ID] != DOWNSTREAM_RECORD]
_NO_CALL_COMMIT = {record: n for record, n in CORRECT.commits.items() if record != CALL_RECORD}
_STRANGER = f"{TALLY_EVENT}#nobody-sent-this"
# Emitted by a message that is not applied, and applied downstream.
_UNAPPLIED_SOURCES = _emitted(f"{TALLY_EVENT}#never-applied", 0, "e-12")
_ITS_DOWNSTREAM = f"{TALLY_EVENT}#{_UNAPPLIED_SOURCES[Outbox.ID]}"
# name -> (the invariant that must report it, the end state, the history).
PLANTED: dict[str, tuple[str, EndState, History]] = {
    "not drained": ("queue drained before the time limit", replace(CORRECT, drained=False), History()),
    "a message neither applied nor dead-lettered": (
        "every message applied once, a duplicate, or in the DLQ with a reason",
        replace(CORRECT, records=_LOST_CALL, commits=_NO_CALL_COMMIT),
        History(),
    ),
    "a key committed twice": (
        "no key committed twice (commits DynamoDB accepted)",
        replace(CORRECT, commits={**CORRECT.commits, TALLY_RECORD: 2}),
        History(),
    ),
    "a record COMPLETED with no commit seen": (
        "no key committed twice (commits DynamoDB accepted)",
        replace(CORRECT, commits=_NO_CALL_COMMIT),
        History(),
    ),
    "the reused key's payload reported applied": (
        "no key applied with two payloads",
        CORRECT,
        _history(results={"m-reused": {"applied"}}),
    ),
    "a healthy message dead-lettered": (
        "no message dead-lettered for a reason it cannot have",
        replace(CORRECT, dead_letters=[*CORRECT.dead_letters, DeadLetter("m-resent", ErrorType.SCHEMA_VIOLATION)]),
        History(),
    ),
    "poison dead-lettered for another reason": (
        "no message dead-lettered for a reason it cannot have",
        replace(
            CORRECT,
            dead_letters=[
                CORRECT.dead_letters[0],
                DeadLetter("m-broken", ErrorType.SCHEMA_VIOLATION),
                CORRECT.dead_letters[2],
            ],
        ),
        History(),
    ),
    "a dead letter never sent": (
        "no message dead-lettered for a reason it cannot have",
        replace(CORRECT, dead_letters=[*CORRECT.dead_letters, DeadLetter("m-ghost", ErrorType.INVALID_JSON)]),
        History(),
    ),
    "an emitted message never applied downstream, nor refused there": (
        "outbox: what applied messages emitted, applied downstream or refused there",
        replace(CORRECT, records=_LOST_DOWNSTREAM, commits={TALLY_RECORD: 1, CALL_RECORD: 1}),
        History(),
    ),
    "a message emitted by one not applied": (
        "outbox: nothing emitted or applied downstream for one not applied",
        replace(
            CORRECT,
            outbox=[*CORRECT.outbox, _UNAPPLIED_SOURCES],
            records=[*CORRECT.records, _completed(_ITS_DOWNSTREAM, tally_payload("e-12"))],
            commits={**CORRECT.commits, _ITS_DOWNSTREAM: 1},
        ),
        History(),
    ),
    "a record of a message neither sent nor emitted": (
        "outbox: nothing emitted or applied downstream for one not applied",
        replace(
            CORRECT,
            records=[*CORRECT.records, _completed(_STRANGER, tally_payload("e-13"))],
            commits={**CORRECT.commits, _STRANGER: 1},
        ),
        History(),
    ),
    "a downstream refusal of a message never emitted": (
        "no message dead-lettered for a reason it cannot have",
        replace(CORRECT, dead_letters=[*CORRECT.dead_letters, _refused_downstream("m-ghost", "never-emitted")]),
        History(),
    ),
    "a record stuck": (
        "no record stuck IN_PROGRESS after its lease",
        replace(CORRECT, records=[*CORRECT.records, {Attr.ID: f"{CALL_EVENT}#call-9", Attr.STATUS: "IN_PROGRESS"}]),
        History(),
    ),
    "a zombie write accepted": (
        "no zombie commit or release over a newer owner",
        CORRECT,
        _history(zombies=(f"commit of {CALL_RECORD} by overtaken owner t-1",)),
    ),
    "a foreign failure id": (
        "batchItemFailures name only the batch's ids",
        CORRECT,
        _history(foreign=("not-in-the-batch",)),
    ),
    "a repeat call with no failed attempt": (
        "webhook: no call repeated that alone would not repeat",
        replace(CORRECT, webhook_calls=[_call("call-1"), _call("call-1")]),
        History(),
    ),
    "a call with a key never sent": (
        "every webhook call carries a key that was sent or emitted",
        replace(CORRECT, webhook_calls=[_call("call-1"), _call("someone-else", status=503)]),
        History(),
    ),
}


def test_every_invariant_has_a_planted_violation() -> None:
    assert {invariant for invariant, _, _ in PLANTED.values()} == set(_verdicts(CORRECT))


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_each_planted_violation_is_reported_by_its_invariant(case: str) -> None:
    invariant, end, history = PLANTED[case]
    verdicts = _verdicts(end, history)
    assert verdicts[invariant] == 1
    assert sum(verdicts.values()) == 1, verdicts


def test_a_reused_key_must_put_the_losing_payload_in_the_dead_letter_queue() -> None:
    end = replace(CORRECT, dead_letters=[DeadLetter("m-broken", ErrorType.INVALID_JSON)])
    assert _verdicts(end)["every message applied once, a duplicate, or in the DLQ with a reason"] == 1
    # Dead-lettered as reused although its own payload is the one committed: a refusal it cannot have.
    committed_reused = [_completed(TALLY_RECORD, tally_payload("e-2", "t-2")), CORRECT.records[1]]
    verdicts = _verdicts(replace(CORRECT, records=committed_reused))
    assert verdicts["no message dead-lettered for a reason it cannot have"] == 1


def test_a_message_moved_by_the_redrive_policy_is_lost_only_if_never_applied() -> None:
    moved = DeadLetter("m-resent", None)
    assert set(_verdicts(replace(CORRECT, dead_letters=[*CORRECT.dead_letters, moved])).values()) == {0}
    unapplied = replace(CORRECT, records=_LOST_CALL, commits={TALLY_RECORD: 1})
    assert (
        _verdicts(replace(unapplied, dead_letters=[*CORRECT.dead_letters, DeadLetter("m-called", None)]))[
            "every message applied once, a duplicate, or in the DLQ with a reason"
        ]
        == 1
    )


STUCK = "no record stuck IN_PROGRESS after its lease"


@pytest.mark.parametrize(
    ("attempts", "fault", "violations"),
    [
        # Claimed afresh after another delivery released the key, dead-lettered and deleted the message; then died.
        (1, "request cut off by a crash", 0),
        (1, FaultKind.CRASH_AFTER_CLAIM, 0),
        # Taken over before the dead letter: the dead letter went out under a newer owner, never excused.
        (2, "request cut off by a crash", 1),
        # No delivery of it died: something left it behind.
        (1, None, 1),
        # Held back with a zombie's record, not cut off: its delivery went on.
        (1, HELD_BACK, 1),
    ],
)
def test_a_claim_left_after_its_message_was_dead_lettered_is_excused_only_as_a_dead_first_claim(
    attempts: int, fault: str | None, violations: int
) -> None:
    dead_called = [*CORRECT.dead_letters, DeadLetter("m-called", ErrorType.BUSINESS_CONDITION_FAILED)]
    left = {Attr.ID: CALL_RECORD, Attr.STATUS: Status.IN_PROGRESS, Attr.ATTEMPTS: attempts}
    end = replace(CORRECT, records=[*_LOST_CALL, left], commits=_NO_CALL_COMMIT, dead_letters=dead_called)
    history = History()
    if fault is not None:
        history.faults_by_record[CALL_RECORD][fault] += 1
    verdicts = _verdicts(end, history)
    assert verdicts[STUCK] == violations
    assert sum(verdicts.values()) == violations, verdicts


def test_applied_payloads_are_one_per_key_and_only_those_committed() -> None:
    checker = Checker(SENT, CORRECT, History())
    # The emitted message applied downstream among them, and not the one refused there.
    assert checker.applied_payloads(TALLY_EVENT) == [tally_payload("e-1"), tally_payload("e-10")]
    assert checker.applied_payloads(CALL_EVENT) == [call_payload("c-1")]
    lost = Checker(SENT, replace(CORRECT, records=_LOST_CALL), History())
    assert lost.applied_payloads(CALL_EVENT) == []


def _journaled(directory: Path, *entries: tuple[str, dict[str, Any]]) -> History:
    """The history a runtime's journal of ``entries`` reads back as."""
    journal = Journal(directory / "env-0.jsonl")
    for event, fields in entries:
        journal.write(event, **fields)
    history = History()
    history.read_journals(directory)
    return history


REPEAT = "webhook: no call repeated that alone would not repeat"
TWICE = replace(CORRECT, webhook_calls=[_call("call-1"), _call("call-1")])


def _results(outcome: str, reason: str | None = None, *, deadline: bool = False) -> dict[str, Any]:
    """A runtime's results entry for an invocation that delivered ``m-called`` once (``deadline``: cut short)."""
    return {"results": [["m-called", outcome, reason]], "deadline": deadline, "conflicts_absorbed": 0}


FENCED = f"lease on {CALL_RECORD} lost before commit; record is now held by t-2"


@pytest.mark.parametrize(
    "results",
    [
        _results("retried", "webhook answered HTTP 503"),
        _results("retried", "webhook call passed its 0.4 s deadline"),
        # Its invocation's time was cut short: alone, its lease and its commit's time are as short.
        _results("retried", FENCED, deadline=True),
        _results("conflict", "still in conflict", deadline=True),
    ],
    ids=["its call failed", "its call timed out", "fenced after an early deadline", "conflict at an early deadline"],
)
def test_a_repeat_call_is_allowed_after_a_failed_attempt_of_its_own(tmp_path: Path, results: dict[str, Any]) -> None:
    history = _journaled(tmp_path, ("results", results))
    assert set(_verdicts(TWICE, history=history).values()) == {0}
    assert _verdicts(replace(TWICE, webhook_calls=[_call("call-1")] * 3), history=history)[REPEAT] == 1


@pytest.mark.parametrize(
    "results",
    [
        # Its lease ran out while it waited on another message (a slow neighbour): alone it would have committed.
        _results("retried", FENCED),
        _results("conflict", "still in conflict"),
        # An early deadline excuses only a delivery it left unfinished.
        _results("applied", deadline=True),
    ],
    ids=["fenced", "conflict with time left", "applied at an early deadline"],
)
def test_a_repeat_call_after_a_failure_not_its_own_is_a_violation(tmp_path: Path, results: dict[str, Any]) -> None:
    history = _journaled(tmp_path, ("results", results), ("results", _results("applied")))
    (verdict,) = (verdict for verdict in Checker(SENT, TWICE, history).all() if verdict.name == REPEAT)
    assert verdict.violations == 1
    # Named with why its deliveries ended unfinished: what a run that fails shows of the cause.
    ((_, outcome, reason),) = results["results"]
    assert verdict.examples[0].endswith(f"unfinished: {outcome}: {reason}" if reason else "unfinished: none")


@pytest.mark.parametrize("kind", [FaultKind.SLOW_HANDLER, FaultKind.CRASH_BEFORE_COMMIT, FaultKind.ZOMBIE])
def test_a_repeat_call_is_allowed_after_a_fault_on_its_record(tmp_path: Path, kind: FaultKind) -> None:
    for name in ("own", "other"):
        (tmp_path / name).mkdir()
    history = _journaled(tmp_path / "own", ("fault", {"kind": kind, "record": CALL_RECORD}))
    assert set(_verdicts(TWICE, history=history).values()) == {0}
    # Not after one on another record: a slow neighbour explains nothing of this key's calls.
    other = _journaled(tmp_path / "other", ("fault", {"kind": kind, "record": TALLY_RECORD}))
    assert _verdicts(TWICE, history=other)[REPEAT] == 1


@pytest.mark.parametrize(
    "entry",
    [
        # A transport fault on a shared transaction is each of its records' own, not only its first record's.
        ("fault", {"kind": FaultKind.THROTTLED, "record": TALLY_RECORD, "others": [CALL_RECORD]}),
        # Held back while a zombie held the transaction's first record: its lease ran out by a fault on its request.
        ("held_back", {"record": CALL_RECORD}),
    ],
    ids=["fault on a shared transaction", "held back with a zombie's record"],
)
def test_a_repeat_call_is_allowed_after_a_fault_on_a_request_carrying_its_record(
    tmp_path: Path, entry: tuple[str, dict[str, Any]]
) -> None:
    history = _journaled(tmp_path, entry)
    assert set(_verdicts(TWICE, history=history).values()) == {0}


def test_a_repeat_call_after_an_absorbed_conflict_is_a_violation(tmp_path: Path) -> None:
    history = _journaled(
        tmp_path,
        ("fault", {"kind": FaultKind.TRANSACTION_CONFLICT, "record": CALL_RECORD}),
        ("results", _results("applied")),
    )
    assert _verdicts(TWICE, history=history)[REPEAT] == 1


def test_a_crash_beside_running_lock_handlers_is_counted_inside_a_lock_wave(tmp_path: Path) -> None:
    history = _journaled(
        tmp_path,
        ("fault", {"kind": FaultKind.CRASH_AFTER_CLAIM, "record": CALL_RECORD, "beside": 0}),
        ("fault", {"kind": FaultKind.CRASH_BEFORE_COMMIT, "record": CALL_RECORD, "beside": 2}),
    )
    assert history.crashes_in_a_wave == 1


def test_a_failed_call_is_not_counted_as_an_accepted_one() -> None:
    end = replace(CORRECT, webhook_calls=[_call("call-1", status=503), _call("call-1")])
    assert set(_verdicts(end).values()) == {0}


EMITTED_KEY = APPLIED_DOWNSTREAM[Outbox.ID]
CALLED_TWICE_DOWNSTREAM = replace(
    CORRECT, webhook_calls=[*CORRECT.webhook_calls, _call(EMITTED_KEY), _call(EMITTED_KEY)]
)


def test_an_emitted_messages_calls_carry_its_key_and_a_repeat_is_explained_by_a_failed_delivery_of_its_own(
    tmp_path: Path,
) -> None:
    # The relay sent it: the harness knows its deliveries by the key they carried, and its record downstream.
    for name in ("none", "failed", "faulted", "other"):
        (tmp_path / name).mkdir()
    assert _verdicts(CALLED_TWICE_DOWNSTREAM)[REPEAT] == 1
    relayed = ("invoked", {"redelivered": 0, "keys": {"m-relayed": EMITTED_KEY}})
    failed = ("results", {"results": [["m-relayed", "retried", "webhook answered HTTP 503"]], "conflicts_absorbed": 0})
    assert _verdicts(CALLED_TWICE_DOWNSTREAM, _journaled(tmp_path / "none", relayed))[REPEAT] == 1
    history = _journaled(tmp_path / "failed", relayed, failed)
    assert set(_verdicts(CALLED_TWICE_DOWNSTREAM, history).values()) == {0}
    crash = ("fault", {"kind": FaultKind.CRASH_BEFORE_COMMIT, "record": DOWNSTREAM_RECORD})
    assert set(_verdicts(CALLED_TWICE_DOWNSTREAM, _journaled(tmp_path / "faulted", crash)).values()) == {0}
    # Another delivery's failure explains nothing of this key's calls.
    other = ("invoked", {"redelivered": 0, "keys": {"m-relayed": "another-key"}})
    assert _verdicts(CALLED_TWICE_DOWNSTREAM, _journaled(tmp_path / "other", other, failed))[REPEAT] == 1
