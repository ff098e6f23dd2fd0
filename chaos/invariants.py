"""A run's history (the runtimes' journals, what the pollers saw) and end state (ledger, records,
dead letters, webhook calls), and the invariants they are checked against (DESIGN: "Invariants
every reliability test checks"), each counted as a number of violations."""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boto3.dynamodb.types import TypeDeserializer

from chaos import journal
from chaos.faults import FaultKind
from consumer.errors import ErrorType
from consumer.idempotency.record import Attr, Status
from consumer.outcome import Outcome
from local.poller import BatchReport, PollerStats
from testkit.dead_letters import DeadLetter
from testkit.messages import Outgoing
from testkit.webhook import ReceivedRequest

_deserializer = TypeDeserializer()
_EXAMPLES = 3
# What the emulator reports when the runtime process exits during an invocation.
_EXIT_ERROR = "Runtime.ExitError"
_UNFINISHED = (Outcome.RETRIED, Outcome.CONFLICT)
CUT_OFF = "request cut off by a crash"
# The ledger entry of each event type: its entryId prefix and the payload field that ends it.
_ENTRIES = {"PaymentReceived": ("PAYMENT#", "paymentId"), "ReceiptRequested": ("RECEIPT#", "receiptId")}


@dataclass
class History:
    """What the run did: the runtimes' journals read back once it is over, and what the pollers saw."""

    faults: Counter[FaultKind] = field(default_factory=Counter)
    # Record id -> the faults injected on it, and the requests on it a crash cut off.
    faults_by_record: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    # Zombie commits or releases that the server accepted after another owner took the key over.
    zombie_writes_accepted: list[str] = field(default_factory=list)
    zombies_without_takeover: int = 0
    cold_starts: int = 0
    redelivered_records: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    conflicts_absorbed: int = 0
    # messageId -> deliveries that ended without the record's work recorded: "retried", or "conflict"
    # (a lock-mode commit is retried for the invocation's whole time, so it gives up only when that
    # time is out: an attempt cut off like any other, whose claim the next owner takes after the lease).
    unfinished: Counter[str] = field(default_factory=Counter)
    crashed: int = 0
    # batchItemFailures ids that were not ids of the invocation's batch.
    foreign_failure_ids: list[str] = field(default_factory=list)
    pollers: PollerStats = field(default_factory=PollerStats)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def settled(self, report: BatchReport) -> None:
        """What a poller saw of an invocation; thread-safe."""
        self.pollers.add(report)
        invocation = report.invocation
        response = invocation.response if invocation.succeeded and isinstance(invocation.response, Mapping) else {}
        foreign = [
            str(failure.get("itemIdentifier"))
            for failure in response.get("batchItemFailures", [])
            if failure.get("itemIdentifier") not in report.message_ids
        ]
        with self._lock:
            self.crashed += invocation.error_type == _EXIT_ERROR
            self.foreign_failure_ids.extend(foreign)

    def read_journals(self, directory: Path) -> None:
        for entry in journal.read(sorted(directory.glob("env-*.jsonl"))):
            event, record = entry["event"], entry.get("record")
            if event == "fault":
                self.faults[FaultKind(entry["kind"])] += 1
                if record is not None:
                    self.faults_by_record[record][entry["kind"]] += 1
            elif event == "cut_off":
                self.faults_by_record[entry["record"]][CUT_OFF] += 1
            elif event == "zombie_write_accepted":
                self.zombie_writes_accepted.append(entry["description"])
            elif event == "zombie_without_takeover":
                self.zombies_without_takeover += 1
            elif event == "init":
                self.cold_starts += 1
            elif event == "invoked":
                self.redelivered_records += entry["redelivered"]
            elif event == "results":
                for message_id, outcome, absorbed in entry["results"]:
                    self.outcomes[outcome] += 1
                    self.conflicts_absorbed += absorbed
                    self.unfinished[message_id] += outcome in _UNFINISHED


@dataclass(frozen=True)
class EndState:
    ledger: list[dict[str, Any]]
    records: list[dict[str, Any]]
    dead_letters: list[DeadLetter]
    webhook_calls: list[ReceivedRequest]
    drained: bool


@dataclass(frozen=True)
class Verdict:
    name: str
    violations: int
    examples: list[str]


def scan(client: Any, table: str) -> list[dict[str, Any]]:
    pages = client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
    items = (item for page in pages for item in page["Items"])
    return [{name: _deserializer.deserialize(value) for name, value in item.items()} for item in items]


@dataclass
class _KeyGroup:
    """Every message sent under one idempotency key of one event type, by payload: a key reused
    with other content (another amount, or another business id altogether) is another variant."""

    event_type: str
    key: str
    variants: dict[str, tuple[dict[str, Any], list[str]]] = field(default_factory=dict)  # canonical -> messageIds

    def entry_id(self, payload: Mapping[str, Any]) -> tuple[str, str]:
        prefix, id_field = _ENTRIES[self.event_type]
        return payload["accountId"], prefix + payload[id_field]

    @property
    def first(self) -> dict[str, Any]:
        return next(iter(self.variants.values()))[0]

    def message_ids(self) -> list[str]:
        return [message_id for _, ids in self.variants.values() for message_id in ids]


def _groups(sent: Mapping[str, Outgoing]) -> dict[tuple[str, str], _KeyGroup]:
    groups: dict[tuple[str, str], _KeyGroup] = {}
    for message_id, message in sent.items():
        payload, event_type, key = message.payload, message.event_type, message.key
        well_formed = (
            message.kind in ("payment", "receipt") or message.expected_error == ErrorType.IDEMPOTENCY_KEY_REUSED
        )
        if well_formed and payload is not None and event_type is not None and key is not None:
            group = groups.setdefault((event_type, key), _KeyGroup(event_type, key))
            group.variants.setdefault(json.dumps(payload, sort_keys=True), (payload, []))[1].append(message_id)
    return groups


class Checker:
    def __init__(self, sent: Mapping[str, Outgoing], end: EndState, history: History):
        self.sent = sent
        self.end = end
        self.history = history
        self.groups = _groups(sent)
        self.payments = [group for group in self.groups.values() if group.event_type == "PaymentReceived"]
        self.receipts = [group for group in self.groups.values() if group.event_type == "ReceiptRequested"]
        self.entries = {(item["accountId"], item["entryId"]): item for item in end.ledger}
        self.dead: defaultdict[str, list[str | None]] = defaultdict(list)
        for letter in end.dead_letters:
            self.dead[letter.original_message_id].append(letter.error_type)

    def all(self) -> list[Verdict]:
        checks: dict[str, Callable[[], Iterable[str]]] = {
            "queue drained before the time limit": self.queue_drained,
            "nothing lost (applied, or in the DLQ with its reason)": self.nothing_lost,
            "no payment applied twice (balance = sum of distinct payments)": self.no_payment_applied_twice,
            "no key applied with two payloads": self.no_key_applied_twice,
            "no healthy message dead-lettered": self.dead_letters_explained,
            "no record stuck IN_PROGRESS": self.no_record_stuck,
            "no zombie commit or release over a newer owner": lambda: self.history.zombie_writes_accepted,
            "batchItemFailures name only the batch's ids": self.failures_name_their_batch,
            "receipt webhook: a repeat call only after a failed attempt": self.receipts_called_once,
            "every receipt call carries its message's Idempotency-Key": self.receipts_carry_their_key,
        }
        verdicts = []
        for name, check in checks.items():
            found = list(check())
            verdicts.append(Verdict(name, len(found), found[:_EXAMPLES]))
        return verdicts

    def applied(self, group: _KeyGroup) -> list[str]:
        """The variants applied under a key: their ledger entry carries the key (and, for a
        payment, the amount); the contract allows one at most."""
        found = []
        for canonical, (payload, _) in group.variants.items():
            entry = self.entries.get(group.entry_id(payload))
            if entry is None or entry.get("idempotencyKey") != group.key:
                continue
            if group.event_type != "PaymentReceived" or int(entry["amountCents"]) == payload["amountCents"]:
                found.append(canonical)
        return found

    def dead_lettered_for(self, message_id: str, error_type: str) -> bool:
        return error_type in self.dead.get(message_id, [])

    # -- the invariants: each yields its violations ------------------------------------

    def queue_drained(self) -> Iterator[str]:
        if not self.end.drained:
            yield "messages still queued or in flight at the time limit"

    def nothing_lost(self) -> Iterator[str]:
        for group in self.groups.values():
            applied = self.applied(group)
            if not applied:
                yield f"{group.event_type} {group.key}: never applied"
                continue
            for canonical, (_, message_ids) in group.variants.items():
                for message_id in message_ids:
                    if canonical not in applied and not self.dead_lettered_for(
                        message_id, ErrorType.IDEMPOTENCY_KEY_REUSED
                    ):
                        yield f"{message_id} reused key {group.key}: neither applied nor dead-lettered"
        for message_id, message in self.sent.items():
            if message.kind == "poison" and message.expected_error != ErrorType.IDEMPOTENCY_KEY_REUSED:
                assert message.expected_error is not None
                if not self.dead_lettered_for(message_id, message.expected_error):
                    yield f"poison {message_id} not in the DLQ as {message.expected_error}"

    def no_key_applied_twice(self) -> Iterator[str]:
        for group in self.groups.values():
            applied = self.applied(group)
            if len(applied) > 1:
                yield f"{group.event_type} {group.key}: applied with {len(applied)} payloads: {', '.join(applied)}"

    def no_payment_applied_twice(self) -> Iterator[str]:
        credited: Counter[str] = Counter()
        for group in self.payments:
            for canonical in self.applied(group):
                payload = group.variants[canonical][0]
                credited[payload["accountId"]] += int(payload["amountCents"])
        sent_payments = {group.entry_id(payload) for group in self.payments for payload, _ in group.variants.values()}
        entries_by_account: Counter[str] = Counter()
        for (account, entry_id), item in self.entries.items():
            if entry_id.startswith("PAYMENT#"):
                entries_by_account[account] += int(item["amountCents"])
                if (account, entry_id) not in sent_payments:
                    yield f"{account}/{entry_id}: a ledger entry for no payment sent"
        for (account, entry_id), item in self.entries.items():
            if entry_id != "BALANCE":
                continue
            balance = int(item.get("balanceCents", 0))
            if balance != entries_by_account[account] or balance != credited[account]:
                yield (
                    f"{account}: balance {balance}, payment entries {entries_by_account[account]},"
                    f" distinct payments applied {credited[account]}"
                )

    def dead_letters_explained(self) -> Iterator[str]:
        for message_id, reasons in self.dead.items():
            message = self.sent.get(message_id)
            for reason in reasons:
                if reason is None:
                    continue  # moved by the redrive policy: counted, and lost only if never applied
                if message is None:
                    yield f"{message_id}: dead-lettered ({reason}) but never sent"
                elif message.kind == "poison" and message.expected_error != ErrorType.IDEMPOTENCY_KEY_REUSED:
                    if reason != message.expected_error:
                        yield f"{message_id}: dead-lettered as {reason}, not {message.expected_error}"
                elif reason != ErrorType.IDEMPOTENCY_KEY_REUSED or self._is_winner(message_id, message):
                    yield f"{message_id} ({message.kind} {message.key}): dead-lettered as {reason}"

    def _is_winner(self, message_id: str, message: Outgoing) -> bool:
        group = self.groups.get((message.event_type or "", message.key or ""))
        if group is None:
            return False
        return any(message_id in group.variants[canonical][1] for canonical in self.applied(group))

    def no_record_stuck(self) -> Iterator[str]:
        for record in self.end.records:
            if record.get(Attr.STATUS) == Status.IN_PROGRESS:
                yield f"{record['id']} IN_PROGRESS, lease ended {record.get('leaseExpiresAt')}"

    def failures_name_their_batch(self) -> Iterator[str]:
        for message_id in self.history.foreign_failure_ids:
            yield f"{message_id} reported outside its batch"

    def receipts_called_once(self) -> Iterator[str]:
        """More than one accepted webhook call per key only after as many failed attempts.

        A transaction conflict absorbed in process is not a failed attempt: the consumer retries
        the fenced commit, never the call, so a repeat after one is a violation. A delivery that
        still ends in conflict is one: its invocation's time ran out before the commit landed.
        """
        accepted = Counter(call.idempotency_key for call in self.end.webhook_calls if 200 <= call.status < 300)
        for group in self.receipts:
            faults = self.history.faults_by_record.get(f"{group.event_type}#{group.key}", Counter())
            failed_attempts = (
                sum(faults.values())
                - faults[FaultKind.TRANSACTION_CONFLICT]
                + sum(self.history.unfinished[message_id] for message_id in group.message_ids())
            )
            if accepted[group.key] > 1 + failed_attempts:
                yield f"{group.key}: {accepted[group.key]} calls accepted, {failed_attempts} failed attempts"

    def receipts_carry_their_key(self) -> Iterator[str]:
        key_of = {group.first["receiptId"]: group.key for group in self.receipts}
        for call in self.end.webhook_calls:
            receipt_id = call.json().get("receiptId")
            if call.idempotency_key != key_of.get(receipt_id):
                yield f"receipt {receipt_id}: key {call.idempotency_key!r}, sent as {key_of.get(receipt_id)!r}"
