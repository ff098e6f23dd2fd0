"""A run's history (the runtimes' journals, what the pollers saw) and end state (records, the commits DynamoDB
accepted, dead letters, webhook calls), and the invariants they are checked against (DESIGN: "Invariants every
reliability test checks"), each counted as a number of violations. They hold for any handler: whether a message
was applied is read from its idempotency record and the commits seen at the conflict proxy, never from a table of
the handler's; an example's own invariants (the payment ledger's balances) are its checks in ``tests/app``."""

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
from consumer.envelope import payload_hash
from consumer.errors import ErrorType
from consumer.idempotency.record import Attr, Status
from consumer.outbox import Attr as Outbox
from consumer.outcome import Outcome
from local.poller import BatchReport, PollerStats
from testkit.dead_letters import DeadLetter
from testkit.messages import EMITTED, Outgoing
from testkit.webhook import ReceivedRequest

_deserializer = TypeDeserializer()
_EXAMPLES = 3
# What the emulator reports when the runtime process exits during an invocation.
_EXIT_ERROR = "Runtime.ExitError"
_UNFINISHED = (Outcome.RETRIED, Outcome.CONFLICT)
# How the consumer's WebhookClient words a failed call (5xx, timeout, unreachable) in the message's retry reason.
_OWN_CALL_FAILED = "webhook "
CUT_OFF = "request cut off by a crash"
HELD_BACK = "request held back with a zombie's record"
_CRASHES = {FaultKind.CRASH_AFTER_CLAIM, FaultKind.CRASH_BEFORE_COMMIT, FaultKind.CRASH_AFTER_COMMIT}
# What may dead-letter a well-formed message of a handler: its business rule, or its key taken by another payload.
RELAY_JOURNAL = "env-relay.jsonl"  # the outbox relay's environment's
_REFUSALS = (ErrorType.BUSINESS_CONDITION_FAILED, ErrorType.IDEMPOTENCY_KEY_REUSED)


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
    # messageId -> deliveries that ended unfinished (retried, conflict) for a failure of their own, one that alone
    # fails as well: their webhook call failed, or their invocation's deadline came early (it shortens every
    # message's time alike; a lock-mode commit in conflict gives up only when that time is out). A delivery fenced
    # out of its commit, or retried with no fault of its own, is not one.
    failed_alone: Counter[str] = field(default_factory=Counter)
    # messageId -> the outcomes of its deliveries.
    results: defaultdict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    # messageId -> why its unfinished deliveries (retried, conflict) ended so: what a repeated call's report shows.
    unfinished: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    crashed: int = 0
    # Crashes injected while other lock-mode handlers of the invocation were running: inside a lock wave.
    crashes_in_a_wave: int = 0
    # batchItemFailures ids that were not ids of the invocation's batch.
    foreign_failure_ids: list[str] = field(default_factory=list)
    pollers: PollerStats = field(default_factory=PollerStats)
    keys: dict[str, str | None] = field(default_factory=dict)  # messageId -> the key its body carried, as delivered
    relay_faults: Counter[FaultKind] = field(default_factory=Counter)  # those of the outbox's relay (in ``faults`` too)
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
        relay = journal.read([directory / RELAY_JOURNAL])
        self.relay_faults.update(FaultKind(entry["kind"]) for entry in relay if entry["event"] == "fault")
        for entry in journal.read(sorted(directory.glob("env-*.jsonl"))):
            event, record = entry["event"], entry.get("record")
            if event == "fault":
                self.faults[FaultKind(entry["kind"])] += 1
                self.crashes_in_a_wave += entry.get("beside", 0) > 0
                for each in (record, *entry.get("others", ())) if record is not None else ():
                    self.faults_by_record[each][entry["kind"]] += 1
            elif event == "cut_off":
                self.faults_by_record[entry["record"]][CUT_OFF] += 1
            elif event == "held_back":
                self.faults_by_record[entry["record"]][HELD_BACK] += 1
            elif event == "zombie_write_accepted":
                self.zombie_writes_accepted.append(entry["description"])
            elif event == "zombie_without_takeover":
                self.zombies_without_takeover += 1
            elif event == "init":
                self.cold_starts += 1
            elif event == "invoked":
                self.redelivered_records += entry["redelivered"]
                self.keys.update(entry.get("keys") or {})
            elif event == "results":
                self.conflicts_absorbed += entry["conflicts_absorbed"]
                for message_id, outcome, reason in entry["results"]:
                    self.outcomes[outcome] += 1
                    own = entry.get("deadline") or (reason or "").startswith(_OWN_CALL_FAILED)
                    self.failed_alone[message_id] += outcome in _UNFINISHED and bool(own)
                    self.results[message_id].add(outcome)
                    if outcome in _UNFINISHED:
                        self.unfinished[message_id].append(f"{outcome}: {reason}")


@dataclass(frozen=True)
class EndState:
    records: list[dict[str, Any]]
    # Record id -> the commits of it DynamoDB accepted, counted at the conflict proxy.
    commits: Mapping[str, int]
    dead_letters: list[DeadLetter]
    webhook_calls: list[ReceivedRequest]
    drained: bool
    outbox: list[dict[str, Any]] = field(default_factory=list)  # the outbox's items: every message emitted


@dataclass(frozen=True)
class Verdict:
    name: str
    violations: int
    examples: list[str]


def scan(client: Any, table: str) -> list[dict[str, Any]]:
    pages = client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
    items = (item for page in pages for item in page["Items"])
    return [{name: _deserializer.deserialize(value) for name, value in item.items()} for item in items]


class Checker:
    def __init__(self, sent: Mapping[str, Outgoing], end: EndState, history: History):
        self.sent = sent
        self.end = end
        self.history = history
        completed = (record for record in end.records if record.get(Attr.STATUS) == Status.COMPLETED)
        # Record id -> the hash of the payload it was committed with.
        self.committed = {record[Attr.ID]: record.get(Attr.PAYLOAD_HASH) for record in completed}
        self.dead: defaultdict[str, list[str | None]] = defaultdict(list)
        for letter in end.dead_letters:
            self.dead[letter.original_message_id].append(letter.error_type)
        # Each outbox item by the record its message claims downstream (its envelope's event type and its key): read
        # once, by every check of the chain.
        self.emitted = {
            record: item
            for item in end.outbox
            if (record := Outgoing(item[Outbox.BODY], EMITTED, item[Outbox.ID]).record_id) is not None
        }
        emitted = {item[Outbox.ID] for item in end.outbox}
        # An emitted message's letters, by its key: the harness never sent it, so knows it by its key alone.
        self.refused_downstream = {
            letter.original_message_id: key
            for letter in end.dead_letters
            if (key := letter.attributes.get("IdempotencyKey", {}).get("StringValue")) in emitted
            and letter.error_type == ErrorType.BUSINESS_CONDITION_FAILED
        }

    def all(self) -> list[Verdict]:
        checks: dict[str, Callable[[], Iterable[str]]] = {
            "queue drained before the time limit": self.queue_drained,
            "every message applied once, a duplicate, or in the DLQ with a reason": self.nothing_lost,
            "no key committed twice (commits DynamoDB accepted)": self.no_key_committed_twice,
            "no key applied with two payloads": self.no_key_applied_twice,
            "no message dead-lettered for a reason it cannot have": self.dead_letters_explained,
            "no record stuck IN_PROGRESS after its lease": self.no_record_stuck,
            "no zombie commit or release over a newer owner": lambda: self.history.zombie_writes_accepted,
            "batchItemFailures name only the batch's ids": self.failures_name_their_batch,
            "webhook: no call repeated that alone would not repeat": self.repeats_as_alone,
            "every webhook call carries a key that was sent or emitted": self.calls_carry_their_key,
            "outbox: what applied messages emitted, applied downstream or refused there": self.emitted_applied,
            "outbox: nothing emitted or applied downstream for one not applied": self.nothing_from_unapplied,
        }
        found = {name: list(check()) for name, check in checks.items()}
        return [Verdict(name, len(each), each[:_EXAMPLES]) for name, each in found.items()]

    def applied(self, message: Outgoing) -> bool:
        """Its record is COMPLETED with its payload: applied by it, or by an earlier copy (it is a duplicate)."""
        record = message.record_id
        return record in self.committed and self.committed[record] == payload_hash(message.payload or {})

    def applied_payloads(self, event_type: str) -> list[dict[str, Any]]:
        """The payloads of ``event_type`` applied, one per key, the emitted ones among them: what an example's own
        checks are given."""
        applied = {m.key: m.payload for m in self.sent.values() if m.event_type == event_type and self.applied(m)}
        for record, item in self.emitted.items():
            if record in self.committed and record.startswith(f"{event_type}#"):
                applied[item[Outbox.ID]] = json.loads(item[Outbox.BODY]).get("payload")
        return [payload for payload in applied.values() if payload is not None]

    # -- the invariants: each yields its violations ------------------------------------

    def queue_drained(self) -> Iterator[str]:
        if not self.end.drained:
            yield "messages still queued or in flight at the time limit"

    def nothing_lost(self) -> Iterator[str]:
        for message_id, message in self.sent.items():
            if not self.applied(message) and not any(self.dead.get(message_id, [])):
                yield f"{message_id} ({message.kind} {message.key}): neither applied nor dead-lettered with a reason"

    def no_key_committed_twice(self) -> Iterator[str]:
        for record, commits in self.end.commits.items():
            if commits > 1:
                yield f"{record}: {commits} commits accepted"
        for record in self.committed.keys() - self.end.commits.keys():
            yield f"{record}: COMPLETED with no commit seen at the proxy"

    def no_key_applied_twice(self) -> Iterator[str]:
        for message_id, message in self.sent.items():
            succeeded = self.history.results[message_id] & {Outcome.APPLIED, Outcome.DUPLICATE}
            if message.record_id is not None and succeeded and not self.applied(message):
                yield f"{message_id}: {'/'.join(sorted(succeeded))} under {message.key}, committed with another payload"

    def dead_letters_explained(self) -> Iterator[str]:
        for message_id, reasons in self.dead.items():
            message = self.sent.get(message_id)
            for reason in filter(None, reasons):  # moved by the redrive policy: lost only if never applied
                if message is None and message_id not in self.refused_downstream:
                    yield f"{message_id}: dead-lettered ({reason}) but neither sent nor emitted"
                elif message is None:
                    continue  # an emitted message its handler's rule refused downstream
                elif message.expected_error is not None and reason != message.expected_error:
                    yield f"{message_id}: dead-lettered as {reason}, not {message.expected_error}"
                elif message.expected_error is None and (
                    reason not in _REFUSALS or (reason == ErrorType.IDEMPOTENCY_KEY_REUSED and self.applied(message))
                ):
                    yield f"{message_id} ({message.kind} {message.key}): dead-lettered as {reason}"

    def no_record_stuck(self) -> Iterator[str]:
        """Excused: a first claim (attempts 1) of a key whose message another delivery dead-lettered, by a delivery
        a crash then ended. The other delivery, on an older receipt, released the key and deleted the message (SQS may
        honour an older receipt handle), so nothing comes back to the claim; it holds nothing, its lease over, and a
        redrive takes it over. A claim taken over (attempts 2 and more) before a dead letter is never excused."""
        dead = {message.record_id for message_id, message in self.sent.items() if any(self.dead.get(message_id, []))}
        for record in self.end.records:
            if record.get(Attr.STATUS) != Status.IN_PROGRESS:
                continue
            faults = self.history.faults_by_record.get(record[Attr.ID], Counter())
            died = faults.keys() & {CUT_OFF, *_CRASHES}
            if not (record.get(Attr.ATTEMPTS) == 1 and record[Attr.ID] in dead and died):
                ids = sorted(m for m, message in self.sent.items() if message.record_id == record[Attr.ID])
                yield (
                    f"{record['id']} IN_PROGRESS, lease ended {record.get('leaseExpiresAt')}, attempts"
                    f" {record.get(Attr.ATTEMPTS)}, faults {dict(faults)};"
                    f" deliveries {[(m, sorted(self.history.results[m]), self.dead.get(m)) for m in ids]}"
                )

    def emitted_applied(self) -> Iterator[str]:
        refused = set(self.refused_downstream.values())
        for record, item in self.emitted.items():
            # Applied more than once downstream is a key committed twice, which that invariant counts.
            if record not in self.committed and item[Outbox.ID] not in refused:
                yield f"{item[Outbox.ID]} (emitted by {item[Outbox.SOURCE_RECORD]}): neither applied nor refused"

    def nothing_from_unapplied(self) -> Iterator[str]:
        # The outbox item goes in its source's transaction, and the relay sends nothing else.
        for item in self.end.outbox:
            if item[Outbox.SOURCE_RECORD] not in self.committed:
                yield f"{item[Outbox.ID]}: emitted by {item[Outbox.SOURCE_RECORD]}, which is not applied"
        known = {message.record_id for message in self.sent.values()} | self.emitted.keys()
        for record in self.committed.keys() - known:
            yield f"{record}: applied, and neither sent nor emitted"

    def failures_name_their_batch(self) -> Iterator[str]:
        for message_id in self.history.foreign_failure_ids:
            yield f"{message_id} reported outside its batch"

    def repeats_as_alone(self) -> Iterator[str]:
        """A key's accepted webhook calls beyond its first, each explained by a failed attempt of its own messages,
        one that would repeat the call had each message run alone: a fault injected on its record (a crash, a
        request a crash cut off, a zombie or one held back with a zombie's, a transport fault on a request carrying
        it, its own slow handler), or a delivery in ``failed_alone`` (its webhook call failed, its invocation's
        deadline came early).

        Not explained: a transaction conflict absorbed in process (the consumer retries the fenced commit, never the
        call), and a delivery fenced out of its commit or retried with no fault of its own: a message whose lease ran
        out while it waited on another message's handler would, alone, have committed and its resend be a duplicate.
        """
        accepted = Counter(call.idempotency_key for call in self.end.webhook_calls if 200 <= call.status < 300)
        by_key: defaultdict[str, set[str]] = defaultdict(set)
        for message_id, message in self.sent.items():
            if message.key is not None:
                by_key[message.key].add(message_id)
        # An emitted message's deliveries, known by the key they carried, and its record downstream.
        emitted = {item[Outbox.ID]: record for record, item in self.emitted.items()}
        for message_id, key in self.history.keys.items():
            if key is not None and key in emitted:
                by_key[key].add(message_id)
        for key, calls in accepted.items():
            own = by_key.get(key or "", set())
            records = {self.sent[message_id].record_id for message_id in own if message_id in self.sent}
            records |= {emitted[key]} if key in emitted else set()
            faults = sum((self.history.faults_by_record.get(record or "", Counter()) for record in records), Counter())
            failed_attempts = (
                sum(faults.values())
                - faults[FaultKind.TRANSACTION_CONFLICT]
                + sum(self.history.failed_alone[message_id] for message_id in own)
            )
            if calls > 1 + failed_attempts:
                ended = [reason for message_id in sorted(own) for reason in self.history.unfinished[message_id]]
                yield (
                    f"{key}: {calls} calls accepted, {failed_attempts} failed attempts of its own; deliveries"
                    f" unfinished: {'; '.join(ended) or 'none'}"
                )

    def calls_carry_their_key(self) -> Iterator[str]:
        keys = {message.key for message in self.sent.values()} | {item[Outbox.ID] for item in self.end.outbox}
        for call in self.end.webhook_calls:
            if call.idempotency_key not in keys:
                yield f"a call to {call.path} with key {call.idempotency_key!r}, neither sent nor emitted"
