"""The end state of a run, and the invariants it is checked against (DESIGN: "Invariants every
reliability test checks"), each counted as a number of violations.

The history is the messages sent (per SQS ``messageId``), what each delivery came to,
the faults injected per record; the end state is the ledger, the idempotency
records, the dead-letter queue and the webhook sink's log, read after the queue
drained and every lease ran out.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from boto3.dynamodb.types import TypeDeserializer

from chaos.faults import FaultKind, FaultLog
from chaos.function import InvocationHistory
from consumer.errors import ErrorType
from consumer.idempotency.record import Attr, Status
from testkit.dead_letters import DeadLetter
from testkit.messages import Outgoing
from testkit.webhook import ReceivedRequest

_deserializer = TypeDeserializer()
_EXAMPLES = 3


@dataclass(frozen=True)
class EndState:
    ledger: list[dict[str, Any]]
    records: list[dict[str, Any]]
    dead_letters: list[DeadLetter]
    webhook_calls: list[ReceivedRequest]
    drained: bool


@dataclass
class Verdict:
    name: str
    violations: int = 0
    examples: list[str] = field(default_factory=list)

    def violation(self, example: str) -> None:
        self.violations += 1
        if len(self.examples) < _EXAMPLES:
            self.examples.append(example)


def scan(client: Any, table: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for page in client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        items.extend({name: _deserializer.deserialize(value) for name, value in item.items()} for item in page["Items"])
    return items


@dataclass
class _KeyGroup:
    """Every message sent under one idempotency key of one event type."""

    event_type: str
    key: str
    payload: dict[str, Any]  # of the first message; variants differ only in amountCents
    amounts: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))  # amount -> messageIds

    @property
    def message_ids(self) -> list[str]:
        return [message_id for ids in self.amounts.values() for message_id in ids]


def _groups(sent: Mapping[str, Outgoing]) -> dict[tuple[str, str], _KeyGroup]:
    groups: dict[tuple[str, str], _KeyGroup] = {}
    for message_id, message in sent.items():
        well_formed = (
            message.kind in ("payment", "receipt") or message.expected_error == ErrorType.IDEMPOTENCY_KEY_REUSED
        )
        payload = message.payload
        event_type = message.event_type
        if not well_formed or payload is None or event_type is None or message.key is None:
            continue
        group = groups.setdefault((event_type, message.key), _KeyGroup(event_type, message.key, payload))
        group.amounts[int(payload["amountCents"])].append(message_id)
    return groups


class Checker:
    def __init__(self, sent: Mapping[str, Outgoing], end: EndState, history: InvocationHistory, log: FaultLog):
        self.sent = sent
        self.end = end
        self.history = history
        self.log = log
        self.groups = _groups(sent)
        self.entries = {(item["accountId"], item["entryId"]): item for item in end.ledger}
        self.dead: defaultdict[str, list[str | None]] = defaultdict(list)
        for letter in end.dead_letters:
            self.dead[letter.original_message_id].append(letter.error_type)

    # -- helpers ---------------------------------------------------------------------

    def payment_entry(self, group: _KeyGroup) -> dict[str, Any] | None:
        return self.entries.get((group.payload["accountId"], f"PAYMENT#{group.payload['paymentId']}"))

    def receipt_entry(self, group: _KeyGroup) -> dict[str, Any] | None:
        return self.entries.get((group.payload["accountId"], f"RECEIPT#{group.payload['receiptId']}"))

    def winner(self, group: _KeyGroup) -> int | None:
        """The amount that was applied under a key, when one was."""
        entry = self.payment_entry(group) if group.event_type == "PaymentReceived" else self.receipt_entry(group)
        if entry is None:
            return None
        if group.event_type == "PaymentReceived":
            return int(entry["amountCents"])
        return next(iter(group.amounts))

    def dead_lettered_for(self, message_id: str, error_type: str) -> bool:
        return error_type in self.dead.get(message_id, [])

    # -- the invariants --------------------------------------------------------------

    def nothing_lost(self) -> Verdict:
        verdict = Verdict("nothing lost (applied, or in the DLQ with its reason)")
        for group in self.groups.values():
            winner = self.winner(group)
            if winner is None:
                verdict.violation(f"{group.event_type} {group.key}: never applied")
                continue
            for amount, message_ids in group.amounts.items():
                for message_id in message_ids:
                    if amount != winner and not self.dead_lettered_for(message_id, ErrorType.IDEMPOTENCY_KEY_REUSED):
                        verdict.violation(f"{message_id} reused key {group.key}: neither applied nor dead-lettered")
        for message_id, message in self.sent.items():
            if message.kind == "poison" and message.expected_error != ErrorType.IDEMPOTENCY_KEY_REUSED:
                assert message.expected_error is not None
                if not self.dead_lettered_for(message_id, message.expected_error):
                    verdict.violation(f"poison {message_id} not in the DLQ as {message.expected_error}")
        return verdict

    def no_payment_applied_twice(self) -> Verdict:
        verdict = Verdict("no payment applied twice (balance = sum of distinct payments)")
        credited: Counter[str] = Counter()
        for group in self.groups.values():
            if group.event_type != "PaymentReceived":
                continue
            entry = self.payment_entry(group)
            if entry is None:
                continue
            if int(entry["amountCents"]) not in group.amounts:
                verdict.violation(f"{group.key}: ledger entry of {entry['amountCents']} matches no message")
            credited[group.payload["accountId"]] += int(entry["amountCents"])
        sent_payments = {
            (group.payload["accountId"], f"PAYMENT#{group.payload['paymentId']}")
            for group in self.groups.values()
            if group.event_type == "PaymentReceived"
        }
        entries_by_account: Counter[str] = Counter()
        for (account, entry_id), item in self.entries.items():
            if entry_id.startswith("PAYMENT#"):
                entries_by_account[account] += int(item["amountCents"])
                if (account, entry_id) not in sent_payments:
                    verdict.violation(f"{account}/{entry_id}: a ledger entry for no payment sent")
        for (account, entry_id), item in self.entries.items():
            if entry_id != "BALANCE":
                continue
            balance = int(item.get("balanceCents", 0))
            if balance != entries_by_account[account] or balance != credited[account]:
                verdict.violation(
                    f"{account}: balance {balance}, payment entries {entries_by_account[account]},"
                    f" distinct payments applied {credited[account]}"
                )
        return verdict

    def dead_letters_explained(self) -> Verdict:
        verdict = Verdict("no healthy message dead-lettered")
        for message_id, reasons in self.dead.items():
            message = self.sent.get(message_id)
            for reason in reasons:
                if reason is None:
                    continue  # moved by the redrive policy: counted, and lost only if never applied
                if message is None:
                    verdict.violation(f"{message_id}: dead-lettered ({reason}) but never sent")
                elif message.kind == "poison" and message.expected_error != ErrorType.IDEMPOTENCY_KEY_REUSED:
                    if reason != message.expected_error:
                        verdict.violation(f"{message_id}: dead-lettered as {reason}, not {message.expected_error}")
                elif reason != ErrorType.IDEMPOTENCY_KEY_REUSED or self._is_winner(message_id, message):
                    verdict.violation(f"{message_id} ({message.kind} {message.key}): dead-lettered as {reason}")
        return verdict

    def _is_winner(self, message_id: str, message: Outgoing) -> bool:
        group = self.groups.get((message.event_type or "", message.key or ""))
        if group is None:
            return False
        winner = self.winner(group)
        return winner is not None and message_id in group.amounts.get(winner, [])

    def no_record_stuck(self) -> Verdict:
        verdict = Verdict("no record stuck IN_PROGRESS")
        for record in self.end.records:
            if record.get(Attr.STATUS) == Status.IN_PROGRESS:
                verdict.violation(f"{record['id']} IN_PROGRESS, lease ended {record.get('leaseExpiresAt')}")
        return verdict

    def zombies_fenced(self) -> Verdict:
        verdict = Verdict("no zombie commit or release over a newer owner")
        for description in self.log.zombie_writes_accepted:
            verdict.violation(description)
        return verdict

    def failures_name_their_batch(self) -> Verdict:
        verdict = Verdict("batchItemFailures name only the batch's ids")
        for message_id in self.history.foreign_failure_ids:
            verdict.violation(f"{message_id} reported outside its batch")
        return verdict

    def receipts_called_once(self) -> Verdict:
        """More than one accepted webhook call per key only after as many failed attempts.

        A transaction conflict is not a failed attempt: the consumer retries the fenced
        commit, never the call, so a repeat after one is a violation.
        """
        verdict = Verdict("receipt webhook: a repeat call only after a failed attempt")
        accepted = Counter(call.idempotency_key for call in self.end.webhook_calls if 200 <= call.status < 300)
        for group in self.groups.values():
            if group.event_type != "ReceiptRequested":
                continue
            record_id = f"{group.event_type}#{group.key}"
            faults = self.log.by_record.get(record_id, Counter())
            failed_attempts = (
                sum(faults.values())
                - faults[FaultKind.TRANSACTION_CONFLICT.value]
                + sum(
                    1
                    for message_id in group.message_ids
                    for outcome, _ in self.history.results.get(message_id, [])
                    if outcome == "retried"
                )
            )
            if accepted[group.key] > 1 + failed_attempts:
                verdict.violation(
                    f"{group.key}: {accepted[group.key]} calls accepted, {failed_attempts} failed attempts"
                )
        return verdict

    def receipts_carry_their_key(self) -> Verdict:
        verdict = Verdict("every receipt call carries its message's Idempotency-Key")
        key_of = {
            group.payload["receiptId"]: group.key
            for group in self.groups.values()
            if group.event_type == "ReceiptRequested"
        }
        for call in self.end.webhook_calls:
            receipt_id = call.json().get("receiptId")
            if call.idempotency_key != key_of.get(receipt_id):
                verdict.violation(
                    f"receipt {receipt_id}: key {call.idempotency_key!r}, sent as {key_of.get(receipt_id)!r}"
                )
        return verdict

    def queue_drained(self) -> Verdict:
        verdict = Verdict("queue drained before the time limit")
        if not self.end.drained:
            verdict.violation("messages still queued or in flight at the time limit")
        return verdict

    def all(self) -> list[Verdict]:
        return [
            self.queue_drained(),
            self.nothing_lost(),
            self.no_payment_applied_twice(),
            self.dead_letters_explained(),
            self.no_record_stuck(),
            self.zombies_fenced(),
            self.failures_name_their_batch(),
            self.receipts_called_once(),
            self.receipts_carry_their_key(),
        ]
