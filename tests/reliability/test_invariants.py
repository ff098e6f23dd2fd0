"""Each invariant of the harness, on a hand-made history: silent on a correct end state, and
reporting the one violation planted in an otherwise correct one. An invariant that cannot
fire would pass every run."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chaos.faults import FaultKind
from chaos.invariants import Checker, EndState, History
from chaos.journal import Journal
from consumer.errors import ErrorType
from testkit.dead_letters import DeadLetter
from testkit.messages import Outgoing, envelope, payment, receipt
from testkit.webhook import ReceivedRequest

PAID = payment(key="pay-1", payment_id="p-1", account_id="acc-1", amount_cents=100)
REUSED = Outgoing(
    envelope("PaymentReceived", "pay-1", {**(PAID.payload or {}), "amountCents": 999}),
    "poison",
    "pay-1",
    ErrorType.IDEMPOTENCY_KEY_REUSED,
)
# The key reused for another payment on another account: a producer that regenerated its business id.
ELSEWHERE_PAYLOAD = {**(PAID.payload or {}), "paymentId": "p-2", "accountId": "acc-2"}
REUSED_ELSEWHERE = Outgoing(
    envelope("PaymentReceived", "pay-1", ELSEWHERE_PAYLOAD), "poison", "pay-1", ErrorType.IDEMPOTENCY_KEY_REUSED
)
RECEIPT = receipt(key="rcpt-1", receipt_id="r-1", account_id="acc-1", payment_id="p-1", amount_cents=100)
BROKEN = Outgoing('{"eventType": ', "poison", None, ErrorType.INVALID_JSON)
SENT = {
    "m-paid": PAID,
    "m-resent": PAID,
    "m-reused": REUSED,
    "m-reused-elsewhere": REUSED_ELSEWHERE,
    "m-receipt": RECEIPT,
    "m-broken": BROKEN,
}


def _call(key: str, receipt_id: str = "r-1", status: int = 200) -> ReceivedRequest:
    body = json.dumps({"receiptId": receipt_id})
    return ReceivedRequest("/receipts", key, body, {"Idempotency-Key": key}, status, 0.0)


CORRECT = EndState(
    ledger=[
        {"accountId": "acc-1", "entryId": "BALANCE", "balanceCents": 100},
        {"accountId": "acc-1", "entryId": "PAYMENT#p-1", "amountCents": 100, "idempotencyKey": "pay-1"},
        {"accountId": "acc-1", "entryId": "RECEIPT#r-1", "idempotencyKey": "rcpt-1"},
    ],
    records=[
        {"id": "PaymentReceived#pay-1", "status": "COMPLETED"},
        {"id": "ReceiptRequested#rcpt-1", "status": "COMPLETED"},
    ],
    dead_letters=[
        DeadLetter("m-reused", ErrorType.IDEMPOTENCY_KEY_REUSED),
        DeadLetter("m-reused-elsewhere", ErrorType.IDEMPOTENCY_KEY_REUSED),
        DeadLetter("m-broken", ErrorType.INVALID_JSON),
    ],
    webhook_calls=[_call("rcpt-1")],
    drained=True,
)


def _verdicts(end: EndState, history: History | None = None) -> dict[str, int]:
    checker = Checker(SENT, end, history or History())
    return {verdict.name: verdict.violations for verdict in checker.all()}


def test_a_correct_end_state_has_no_violation() -> None:
    assert set(_verdicts(CORRECT).values()) == {0}


def _with_ledger(change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> EndState:
    return replace(CORRECT, ledger=change([dict(item) for item in CORRECT.ledger]))


def _credited_twice(ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ledger[0]["balanceCents"] = 200
    return ledger


def _applied_elsewhere(ledger: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reused key's other payment credited as well: its own entry and balance, consistent."""
    entry = {"accountId": "acc-2", "entryId": "PAYMENT#p-2", "amountCents": 100, "idempotencyKey": "pay-1"}
    return [*ledger, entry, {"accountId": "acc-2", "entryId": "BALANCE", "balanceCents": 100}]


PLANTED = {
    "queue drained before the time limit": replace(CORRECT, drained=False),
    "nothing lost (applied, or in the DLQ with its reason)": _with_ledger(
        lambda ledger: [item for item in ledger if item["entryId"] != "RECEIPT#r-1"]
    ),
    "no payment applied twice (balance = sum of distinct payments)": _with_ledger(_credited_twice),
    "no key applied with two payloads": replace(
        _with_ledger(_applied_elsewhere),
        dead_letters=[letter for letter in CORRECT.dead_letters if letter.original_message_id != "m-reused-elsewhere"],
    ),
    "no healthy message dead-lettered": replace(
        CORRECT, dead_letters=[*CORRECT.dead_letters, DeadLetter("m-resent", ErrorType.SCHEMA_VIOLATION)]
    ),
    "no record stuck IN_PROGRESS": replace(
        CORRECT, records=[*CORRECT.records, {"id": "ReceiptRequested#rcpt-9", "status": "IN_PROGRESS"}]
    ),
    "receipt webhook: a repeat call only after a failed attempt": replace(
        CORRECT, webhook_calls=[_call("rcpt-1"), _call("rcpt-1")]
    ),
    "every receipt call carries its message's Idempotency-Key": replace(
        CORRECT, webhook_calls=[_call("rcpt-1"), _call("someone-else", status=503)]
    ),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_each_planted_violation_is_reported_by_its_invariant(name: str) -> None:
    verdicts = _verdicts(PLANTED[name])
    assert verdicts[name] == 1
    assert sum(verdicts.values()) == 1, verdicts


def test_a_reused_key_must_put_the_losing_payload_in_the_dead_letter_queue() -> None:
    end = replace(CORRECT, dead_letters=[DeadLetter("m-broken", ErrorType.INVALID_JSON)])
    assert _verdicts(end)["nothing lost (applied, or in the DLQ with its reason)"] == 2


def _journaled(directory: Path, *entries: tuple[str, dict[str, Any]]) -> History:
    """The history a runtime's journal of ``entries`` reads back as."""
    journal = Journal(directory / "env-0.jsonl")
    for event, fields in entries:
        journal.write(event, **fields)
    history = History()
    history.read_journals(directory)
    return history


def test_a_repeat_webhook_call_is_allowed_after_a_failed_attempt(tmp_path: Path) -> None:
    history = _journaled(tmp_path, ("results", {"results": [["m-receipt", "retried", 0]]}))
    end = replace(CORRECT, webhook_calls=[_call("rcpt-1"), _call("rcpt-1")])
    assert set(_verdicts(end, history=history).values()) == {0}


def test_a_repeat_webhook_call_after_an_absorbed_conflict_is_a_violation(tmp_path: Path) -> None:
    history = _journaled(
        tmp_path,
        ("fault", {"kind": FaultKind.TRANSACTION_CONFLICT, "record": "ReceiptRequested#rcpt-1"}),
        ("results", {"results": [["m-receipt", "applied", 1]]}),
    )
    end = replace(CORRECT, webhook_calls=[_call("rcpt-1"), _call("rcpt-1")])
    assert _verdicts(end, history=history)["receipt webhook: a repeat call only after a failed attempt"] == 1


def test_a_repeat_webhook_call_is_allowed_after_a_delivery_that_ended_in_conflict(tmp_path: Path) -> None:
    """Its commit was still refused when the invocation's time ran out: the next owner posts again."""
    history = _journaled(
        tmp_path,
        ("fault", {"kind": FaultKind.TRANSACTION_CONFLICT, "record": "ReceiptRequested#rcpt-1"}),
        ("results", {"results": [["m-receipt", "conflict", 0]]}),
        ("results", {"results": [["m-receipt", "applied", 0]]}),
    )
    end = replace(CORRECT, webhook_calls=[_call("rcpt-1"), _call("rcpt-1")])
    assert set(_verdicts(end, history=history).values()) == {0}
    three_calls = replace(CORRECT, webhook_calls=[_call("rcpt-1")] * 3)
    assert _verdicts(three_calls, history=history)["receipt webhook: a repeat call only after a failed attempt"] == 1


def test_a_zombie_write_and_a_foreign_failure_id_are_violations(tmp_path: Path) -> None:
    history = _journaled(
        tmp_path, ("zombie_write_accepted", {"description": "commit of ReceiptRequested#rcpt-1 by overtaken owner t-1"})
    )
    history.foreign_failure_ids.append("not-in-the-batch")
    verdicts = _verdicts(CORRECT, history=history)
    assert verdicts["no zombie commit or release over a newer owner"] == 1
    assert verdicts["batchItemFailures name only the batch's ids"] == 1
