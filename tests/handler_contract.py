"""The generic contract of a handler: the guarantees any handler gets, each a rule run on DynamoDB Local.

A rule is a function ``rule(rig, subject, payload) -> str | None``: ``None`` when it holds for this payload, else
one line naming the handler, the rule and the payload, and what to do. Rules compare table state (every declared
table's items, as DynamoDB returns them), never the handler's return values. The negative controls in
``test_handler_contract.py`` call the same functions on a core broken on purpose and expect a line back.

The function is wired as Lambda wires it (``consumer.app.wire``), a consumer of its own for each delivery or
thread, with a clock the rig moves (leases run out when a rule says) and the webhook sink standing in for every
endpoint's parameter the template has (``ApiUrl``'s pattern, whatever its name).
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import boto3

from consumer.app import wire
from consumer.config import Settings
from consumer.envelope import payload_hash
from consumer.errors import ErrorType
from consumer.handler import Effect, Guard, MessageContext, MessageHandler
from consumer.idempotency.calls import COMMIT_UPDATE
from consumer.idempotency.record import Attr, reservation_token
from consumer.idempotency.writes import ConditionCheck, Write
from consumer.outbox import OUTBOX_TABLE, Outgoing, derived_key
from consumer.outbox import Attr as OutboxAttr
from consumer.outcome import MessageResult, Outcome
from local.event_files import sample_bodies
from testkit import payloads
from testkit.lambda_sqs import sqs_record
from testkit.webhook import WebhookSink

# The invocation's time left at each delivery; the lease is this less LEASE_MARGIN_MS.
REMAINING_MS = 30_000
PAST_THE_LEASE_S = REMAINING_MS / 1000 + 1
CONCURRENT_DELIVERIES = 3
Payload = dict[str, Any]
Items = dict[str, list[str]]  # table name -> its items, each as DynamoDB's JSON, sorted
# What differs between two deliveries' outbox items that are otherwise alike: when each was written.
_WRITTEN_AT = (OutboxAttr.CREATED_AT_MS, OutboxAttr.EXPIRES_AT)


class Crash(BaseException):
    """The process dies here: no ``except Exception`` of the consumer stops it, so nothing is released."""


class NetworkRefused(OSError):
    """Raised by ``no_network`` at a connection or send attempt."""


@dataclass
class Subject:
    """A handler under contract: its class, and how the rig builds it (``make(settings)``)."""

    handler: type[MessageHandler[Any]]
    make: Callable[[Settings, str], MessageHandler[Any]]  # (settings, the webhook sink's URL) -> the handler

    @property
    def name(self) -> str:
        return self.handler.event_type

    @property
    def guarded(self) -> bool:
        return self.handler.guard is not MessageHandler.guard


@dataclass
class Calls:
    """What the contract saw a handler instance do: its ``handle`` runs and every write it or its guard returned."""

    handled: int = 0
    writes: list[Write] = field(default_factory=list)
    # The messages each ``handle`` run returned, in run order.
    emitted: list[tuple[Outgoing, ...]] = field(default_factory=list)


@dataclass(frozen=True)
class State:
    """What a delivery leaves: every declared table's items and the key's record status (``None``: no record)."""

    items: Items
    record: str | None


def line(subject: Subject, rule: str, payload: Any, what: str, advice: str = "") -> str:
    body = json.dumps(payload, sort_keys=True, default=str)
    text = f"{subject.name}: rule '{rule}' broken for payload {body[:300]}: {what}" + (f"; {advice}" if advice else "")
    return " ".join(text.split())  # one line, whatever a reason quoted (a validation error spans several)


def differences(before: Items, after: Items) -> str:
    changed = []
    for table in sorted(set(before) | set(after)):
        gone = sorted(set(before.get(table, [])) - set(after.get(table, [])))
        new = sorted(set(after.get(table, [])) - set(before.get(table, [])))
        changed += [f"{table} lost {item}" for item in gone] + [f"{table} gained {item}" for item in new]
    return "; ".join(changed)[:600] or "no item differs"


class Rig:
    """One stack for a module: the template's tables and queues, the test handlers' tables, the sink, a clock."""

    def __init__(self, settings: Settings, sink: WebhookSink, dynamodb: Any) -> None:
        self.settings = settings
        self.sink = sink
        self.dynamodb = dynamodb
        self.skew_s = 0.0
        self.calls: dict[str, Calls] = {}
        self.crashes = 0
        # One session for every consumer the rig wires (creating one per consumer costs more than a delivery).
        self.session = boto3.session.Session()
        self._keys: dict[str, list[tuple[str, str]]] = {}

    def clock(self) -> float:
        return time.time() + self.skew_s

    def advance_past_the_lease(self) -> None:
        self.skew_s += PAST_THE_LEASE_S

    # -- deliveries ---------------------------------------------------------------------

    def consumer(self, subject: Subject, session: Any = None) -> Any:
        """The function as Lambda wires it, with this subject's handler (recorded) and the rig's clock."""
        handler = subject.make(self.settings, self.sink.url)
        self._record(handler)
        return wire(self.settings, session or self.session, clock=self.clock, handlers={subject.name: handler})

    def _record(self, handler: MessageHandler[Any]) -> None:
        calls = self.calls.setdefault(handler.event_type, Calls())
        handle, guard = handler.handle, handler.guard

        def recorded_handle(payload: Any, context: MessageContext) -> Effect:
            calls.handled += 1
            effect = handle(payload, context)
            calls.writes.extend(effect.writes)
            calls.emitted.append(tuple(effect.messages))
            return effect

        def recorded_guard(payload: Any, context: MessageContext) -> Guard | None:
            found = guard(payload, context)
            if found is not None:
                calls.writes.extend((*found.writes, *found.undo))
            return found

        handler.handle = recorded_handle  # type: ignore[method-assign]
        handler.guard = recorded_guard  # type: ignore[method-assign]

    @staticmethod
    def message(subject: Subject, key: str, payload: Any, message_id: str | None = None, receives: int = 1) -> Any:
        body = json.dumps({"eventType": subject.name, "metadata": {"idempotencyKey": key}, "payload": payload})
        return sqs_record(message_id or f"m-{uuid.uuid4().hex[:12]}", body, receive_count=receives)

    def deliver(self, subject: Subject, record: Any, session: Any = None) -> MessageResult:
        result: MessageResult = self.consumer(subject, session).process([record], lambda: REMAINING_MS).results[0]
        return result

    def seed(self, subject: Subject, payload: Payload) -> None:
        payloads.put_seeds(self.dynamodb, self.settings.table_names, payloads.seed_items(subject.handler, payload))

    # -- state --------------------------------------------------------------------------

    def items(self) -> Items:
        """Every declared table's items; an outbox item without the times it was written at, which two deliveries
        made apart never share (what it sends, and to whom, is what must be alike)."""
        found: Items = {}
        outbox = self.settings.table_names.get(OUTBOX_TABLE)
        for table in sorted(set(self.settings.table_names.values())):
            pages = self.dynamodb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
            scanned = [item for page in pages for item in page["Items"]]
            if table == outbox:
                scanned = [{k: v for k, v in item.items() if k not in _WRITTEN_AT} for item in scanned]
            found[table] = sorted(json.dumps(item, sort_keys=True) for item in scanned)
        return found

    def emitted(self, record_id: str) -> dict[str, tuple[str, str]]:
        """The outbox's items a source record wrote: by key, their destination and body."""
        outbox = self.settings.table_names.get(OUTBOX_TABLE)
        if outbox is None:
            return {}
        pages = self.dynamodb.get_paginator("scan").paginate(TableName=outbox, ConsistentRead=True)
        return {
            item[OutboxAttr.ID]["S"]: (item[OutboxAttr.DESTINATION]["S"], item[OutboxAttr.BODY]["S"])
            for page in pages
            for item in page["Items"]
            if item[OutboxAttr.SOURCE_RECORD]["S"] == record_id
        }

    def record_status(self, subject: Subject, key: str) -> str | None:
        item = self.dynamodb.get_item(
            TableName=self.settings.idempotency_table_name, Key=self._record_key(subject, key), ConsistentRead=True
        ).get("Item")
        return item[Attr.STATUS]["S"] if item else None

    def state(self, subject: Subject, key: str) -> State:
        return State(self.items(), self.record_status(subject, key))

    def restore(self, subject: Subject, key: str, items: Items) -> None:
        """Put the declared tables back as ``items`` were, and forget the key's record."""
        for table, now in self.items().items():
            for item in set(now) - set(items.get(table, [])):
                self.dynamodb.delete_item(TableName=table, Key=self._key_of(table, json.loads(item)))
            for item in set(items.get(table, [])) - set(now):
                self.dynamodb.put_item(TableName=table, Item=json.loads(item))
        self.dynamodb.delete_item(TableName=self.settings.idempotency_table_name, Key=self._record_key(subject, key))

    @staticmethod
    def _record_key(subject: Subject, key: str) -> dict[str, Any]:
        return {Attr.ID: {"S": f"{subject.name}#{key}"}}

    def key_schema(self, table: str) -> list[tuple[str, str]]:
        """(attribute, type) of the table's key, partition key first."""
        if table not in self._keys:
            description = self.dynamodb.describe_table(TableName=table)["Table"]
            types = {a["AttributeName"]: a["AttributeType"] for a in description["AttributeDefinitions"]}
            keys = sorted(description["KeySchema"], key=lambda k: k["KeyType"] != "HASH")
            self._keys[table] = [(k["AttributeName"], types[k["AttributeName"]]) for k in keys]
        return self._keys[table]

    def called_keys(self) -> list[str | None]:
        """The ``Idempotency-Key`` of every call the sink saw since it was last cleared."""
        return self.sink.keys()

    def _key_of(self, table: str, item: Mapping[str, Any]) -> dict[str, Any]:
        return {name: item[name] for name, _ in self.key_schema(table)}


# -- the network guard ----------------------------------------------------------------------


@contextmanager
def no_network() -> Iterator[list[str]]:
    """Refuse every name lookup, connection and send of this thread; yields what was attempted.

    Sends are refused as well as connections, so a connection opened before (a pooled client's) is caught too;
    other threads (the local servers') are left alone.
    """
    attempts: list[str] = []
    me = threading.get_ident()
    patched: list[tuple[Any, str, Any]] = []

    def refusing(owner: Any, name: str) -> None:
        original = getattr(owner, name)

        def refuse(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != me:
                return original(*args, **kwargs)
            target = next((a for a in args if isinstance(a, str | tuple)), "")
            attempts.append(f"{name}({target})")
            raise NetworkRefused(f"network access refused by the handler contract: {name}({target})")

        patched.append((owner, name, original))
        setattr(owner, name, refuse)

    refusing(socket, "getaddrinfo")
    for owner in (socket.socket, ssl.SSLSocket):
        for name in ("connect", "connect_ex", "send", "sendall", "sendto"):
            refusing(owner, name)
    try:
        yield attempts
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


# -- the rules ------------------------------------------------------------------------------

RESEND = "a resend with the same key changes nothing"
REUSED = "the same key with other content changes nothing and is dead-lettered as IdempotencyKeyReused"
CONCURRENT = "concurrent deliveries of one key leave the state one delivery leaves"
CRASH = "a crash after the claim and before the commit, then the redelivery, leave one delivery's state"
GUARD = "a message refused by its guard makes no call, first delivery and redrive"
TAKEOVER_REFUSED = "a crash after the guard's reservation, then a takeover its guard refuses, leave nothing of it"
BUSY = "a message meeting another message's reservation waits: retried, never dead-lettered"
SCHEMA = "a payload the model refuses is dead-lettered as SchemaViolation with nothing written"
PURE = "an optimistic handler makes no call outside DynamoDB"
TABLES = "every write targets a declared table"
EMITS = "an applied message emits each of its messages once, under the key derived from its record and position"
EMITTING_SAMPLE = "give the handler a sample event (events/*.json) whose payload emits a message"
SEEDS = "give seed items (tests/**/<event_type_in_snake_case>_seeds.py) so that a drawn payload applies"


def _fresh_key() -> str:
    return f"contract-{uuid.uuid4().hex[:12]}"


def _same_ending(first: MessageResult, again: MessageResult) -> bool:
    """A later delivery ends as a duplicate of an applied first, or dead-lettered for the very same reason."""
    if first.outcome in (Outcome.APPLIED, Outcome.DUPLICATE):
        return again.outcome is Outcome.DUPLICATE
    return again.outcome is first.outcome and again.reason == first.reason


def _ending(result: MessageResult) -> str:
    return f"{result.outcome.value}" + (f" ({result.reason[:200]})" if result.reason else "")


def resend_changes_nothing(rig: Rig, subject: Subject, payload: Payload) -> str | None:
    key = _fresh_key()
    rig.seed(subject, payload)
    first = rig.deliver(subject, rig.message(subject, key, payload))
    if first.outcome.is_failure:
        return line(subject, RESEND, payload, f"the first delivery was not settled: {_ending(first)}")
    before = rig.items()
    again = rig.deliver(subject, rig.message(subject, key, payload))
    after = rig.items()
    if after != before:
        return line(subject, RESEND, payload, f"the resend changed the tables: {differences(before, after)}")
    if not _same_ending(first, again):
        what = f"the first delivery ended {_ending(first)}, the resend {_ending(again)}"
        return line(subject, RESEND, payload, what, "expected a duplicate, or the same dead letter")
    return None


def other_content_is_refused(rig: Rig, subject: Subject, payload: Payload, other: Payload) -> str | None:
    if payload_hash(other) == payload_hash(payload):
        raise payloads.GeneratorError(f"{subject.name}: the two payloads are the same: {payload}")
    key = _fresh_key()
    rig.seed(subject, payload)
    first = rig.deliver(subject, rig.message(subject, key, payload))
    if first.outcome is not Outcome.APPLIED:
        return line(subject, REUSED, payload, f"the first delivery did not apply: {_ending(first)}", SEEDS)
    rig.seed(subject, other)
    before, calls = rig.items(), len(rig.called_keys())
    again = rig.deliver(subject, rig.message(subject, key, other))
    after = rig.items()
    if after != before:
        what = f"the key reused for {json.dumps(other)[:200]} changed the tables: {differences(before, after)}"
        return line(subject, REUSED, payload, what)
    if again.outcome is not Outcome.POISON or not (again.reason or "").startswith("IdempotencyKeyReused"):
        return line(subject, REUSED, payload, f"the key reused for other content ended {_ending(again)}")
    if len(rig.called_keys()) != calls:
        return line(subject, REUSED, payload, "the key reused for other content made a call")
    return None


def _reference(rig: Rig, subject: Subject, key: str, record: Any, payload: Payload) -> tuple[State, MessageResult, int]:
    """One delivery's state, ending and calls, from the seeded tables; the tables are then put back as seeded."""
    rig.seed(subject, payload)
    seeded = rig.items()
    rig.sink.clear()
    result = rig.deliver(subject, record)
    state, calls = rig.state(subject, key), len(rig.called_keys())
    rig.restore(subject, key, seeded)
    rig.sink.clear()
    return state, result, calls


def _unlike(one: State, after: State) -> str | None:
    """How ``after`` differs from the state one delivery leaves, if it does."""
    if after.items != one.items:
        return differences(one.items, after.items)
    if after.record != one.record:
        return f"the record is {after.record}, one delivery leaves {one.record}"
    return None


def concurrent_deliveries_leave_one(rig: Rig, subject: Subject, payload: Payload) -> str | None:
    key = _fresh_key()
    record = rig.message(subject, key, payload)
    one, reference, calls = _reference(rig, subject, key, record, payload)
    consumers = [rig.consumer(subject) for _ in range(CONCURRENT_DELIVERIES)]
    start = threading.Barrier(len(consumers))
    results: list[MessageResult] = []

    def deliver(consumer: Any) -> None:
        start.wait()
        results.append(consumer.process([record], lambda: REMAINING_MS).results[0])

    threads = [threading.Thread(target=deliver, args=(consumer,)) for consumer in consumers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = rig.state(subject, key)
    endings = ", ".join(sorted(_ending(result) for result in results))
    if unlike := _unlike(one, after):
        return line(subject, CONCURRENT, payload, f"{len(consumers)} deliveries ({endings}) left: {unlike}")
    applied = sum(result.outcome is Outcome.APPLIED for result in results)
    settled = [r for r in results if r.outcome is Outcome.POISON and not _same_ending(reference, r)]
    if applied != (reference.outcome is Outcome.APPLIED) or settled:
        return line(
            subject, CONCURRENT, payload, f"one delivery ends {_ending(reference)}, {len(consumers)} ended {endings}"
        )
    if len(rig.called_keys()) != calls:
        what = f"one delivery makes {calls} call(s), {len(consumers)} concurrent ones made {len(rig.called_keys())}"
        return line(subject, CONCURRENT, payload, what)
    return None


def dying_at_the_commit() -> Any:
    """A session whose consumer dies as it is about to send the commit: the claim is left, nothing released."""
    session = boto3.session.Session()

    def die(params: Mapping[str, Any], **_: Any) -> None:
        first = (params.get("TransactItems") or [{}])[0].get("Update", params)
        if first.get("UpdateExpression") == COMMIT_UPDATE:
            raise Crash

    session.events.register("provide-client-params.dynamodb.*", die)
    return session


def crash_before_commit_leaves_one(rig: Rig, subject: Subject, payload: Payload) -> str | None:
    """Lock mode. ``None`` also when no commit was reached (nothing to crash at): the test asks one payload did."""
    key = _fresh_key()
    record = rig.message(subject, key, payload)
    one, reference, _ = _reference(rig, subject, key, record, payload)
    try:
        rig.deliver(subject, record, session=dying_at_the_commit())
    except Crash:
        rig.crashes += 1
    else:
        if reference.outcome is Outcome.APPLIED:
            return line(subject, CRASH, payload, "the first delivery applied without sending a commit")
        return None
    rig.advance_past_the_lease()
    redelivered = rig.deliver(subject, rig.message(subject, key, payload, record["messageId"], receives=2))
    after = rig.state(subject, key)
    same = redelivered.outcome is reference.outcome and (
        reference.outcome is not Outcome.POISON or redelivered.reason == reference.reason
    )
    unlike = _unlike(one, after)
    if unlike or not same:
        endings = f"the redelivery ended {_ending(redelivered)}, one delivery ends {_ending(reference)}"
        return line(subject, CRASH, payload, f"{endings}; {unlike or 'the tables and the record are alike'}")
    others = [called for called in rig.called_keys() if called != key]
    if others:
        what = f"the calls carried {sorted(set(map(str, others)))}, not the message's key {key!r}"
        return line(subject, CRASH, payload, what, "pass context.idempotency_key downstream as the Idempotency-Key")
    return None


def planted_refusal(rig: Rig, guard: Guard) -> Guard:
    """The guard with a check of the contract's own that always fails: an absent item of the first guarded table."""
    table = guard.writes[0].table if guard.writes else next(iter(rig.settings.table_names.values()))
    schema = rig.key_schema(table)
    values = {"S": "contract-absent-item", "N": 0, "B": b"contract"}
    check = ConditionCheck(
        table,
        {name: values[kind] for name, kind in schema},
        "attribute_exists(#key)",
        names={"#key": schema[0][0]},
        reason="the handler contract's planted refusal",
    )
    return Guard((*guard.writes, check), guard.undo)


def refusing(rig: Rig, subject: Subject) -> Subject:
    """The subject with a refusal the contract plants in its own guard."""
    original = subject.make

    def make(settings: Settings, url: str) -> MessageHandler[Any]:
        handler = original(settings, url)
        guard = handler.guard

        def refused(payload: Any, context: MessageContext) -> Guard:
            return planted_refusal(rig, guard(payload, context) or Guard(()))

        handler.guard = refused  # type: ignore[method-assign]
        return handler

    return Subject(subject.handler, make)


def refused_guard_makes_no_call(rig: Rig, subject: Subject, payload: Payload) -> str | None:
    """Lock mode with a guard: the handler's own guard, with a refusal the contract plants in it."""
    key = _fresh_key()
    rig.seed(subject, payload)
    before = rig.items()
    rig.sink.clear()
    calls = rig.calls.setdefault(subject.name, Calls())
    handled = calls.handled
    refused_subject = refusing(rig, subject)
    for delivery, record in (
        ("first delivery", rig.message(subject, key, payload)),
        ("redrive", rig.message(subject, key, payload)),
    ):
        result = rig.deliver(refused_subject, record)
        if calls.handled != handled or rig.called_keys():
            what = f"the {delivery} refused by the guard ran handle, and the sink saw {len(rig.called_keys())} call(s)"
            return line(subject, GUARD, payload, what)
        if result.outcome is not Outcome.POISON or not (result.reason or "").startswith("BusinessConditionFailed"):
            return line(subject, GUARD, payload, f"the {delivery} refused by the guard ended {_ending(result)}")
        if rig.items() != before or rig.record_status(subject, key) is not None:
            what = f"the {delivery} refused by the guard wrote: {differences(before, rig.items())}"
            return line(subject, GUARD, payload, what)
    return None


def _crashed_at_the_commit(rig: Rig, subject: Subject, key: str, payload: Payload) -> Any:
    """The message delivered by a worker that dies as it sends the commit (its reservation standing): its record,
    or None when no commit was reached (refused, or poison: nothing left to take over)."""
    rig.seed(subject, payload)
    record = rig.message(subject, key, payload)
    try:
        rig.deliver(subject, record, session=dying_at_the_commit())
    except Crash:
        rig.crashes += 1
        return record
    return None


def _left_of(rig: Rig, subject: Subject, key: str, payload: Payload) -> list[str]:
    """The declared tables' items that still carry the message: its reservation token or its key."""
    token = reservation_token(f"{subject.name}#{key}", payload_hash(payload))
    return [item for items in rig.items().values() for item in items if token in item or key in item]


def refused_takeover_leaves_nothing(rig: Rig, subject: Subject, payload: Payload) -> str | None:
    """Lock mode with a guard: the redelivery that takes a dead worker's claim over is refused by its guard (the
    rule changed meanwhile; here a refusal the contract plants), and the core must release the abandoned claim with
    the handler's ``undo``: no reservation, no record left."""
    key = _fresh_key()
    record = _crashed_at_the_commit(rig, subject, key, payload)
    if record is None:
        return None
    rig.advance_past_the_lease()
    again = rig.message(subject, key, payload, record["messageId"], receives=2)
    result = rig.deliver(refusing(rig, subject), again)
    if result.outcome is not Outcome.POISON or not (result.reason or "").startswith("BusinessConditionFailed"):
        return line(subject, TAKEOVER_REFUSED, payload, f"the refused takeover ended {_ending(result)}")
    if (status := rig.record_status(subject, key)) is not None:
        return line(subject, TAKEOVER_REFUSED, payload, f"the abandoned claim was left {status}")
    if left := _left_of(rig, subject, key, payload):
        what = f"the message's reservation outlived it: {left[0][:300]}"
        return line(subject, TAKEOVER_REFUSED, payload, what, "let undo take back every write of the guard")
    return None


def busy_waits(rig: Rig, subject: Subject, payload: Payload) -> str | None:
    """Lock mode with a guard: while a dead worker's reservation stands (its lease running), the same payload under
    another key meets it, and must come back later, not be dead-lettered; the first is then settled."""
    first = _fresh_key()
    record = _crashed_at_the_commit(rig, subject, first, payload)
    if record is None:
        return None
    before, calls = rig.items(), len(rig.called_keys())
    waiting = rig.deliver(subject, rig.message(subject, _fresh_key(), payload))
    after, called = rig.items(), len(rig.called_keys()) - calls
    rig.advance_past_the_lease()
    rig.deliver(subject, rig.message(subject, first, payload, record["messageId"], receives=2))
    if waiting.outcome is Outcome.POISON:
        what = f"the message meeting another's reservation ended {_ending(waiting)}"
        advice = "mark the reserving write with held_by=<the attribute carrying context.reservation_token>"
        return line(subject, BUSY, payload, what, advice)
    if waiting.outcome.is_failure and (after != before or called):
        what = f"the message that waits wrote {differences(before, after)} and made {called} call(s)"
        return line(subject, BUSY, payload, what)
    return None


def refused_payload_writes_nothing(rig: Rig, subject: Subject, invalid: payloads.Invalid) -> str | None:
    key = _fresh_key()
    before, calls = rig.items(), len(rig.called_keys())
    result = rig.deliver(subject, rig.message(subject, key, invalid.payload))
    what = ""
    if result.outcome is not Outcome.POISON or not (result.reason or "").startswith("SchemaViolation"):
        what = f"({invalid.defect}) ended {_ending(result)}"
    elif rig.items() != before or rig.record_status(subject, key) is not None:
        what = f"({invalid.defect}) wrote: {differences(before, rig.items())}"
    elif len(rig.called_keys()) != calls:
        what = f"({invalid.defect}) made a call"
    return line(subject, SCHEMA, invalid.payload, what) if what else None


def optimistic_handle_is_pure(rig: Rig, subject: Subject, payload: Payload) -> str | None:
    """``handle`` run under ``no_network``: an optimistic handler runs again for each duplicate before it is known."""
    handler = subject.make(rig.settings, rig.sink.url)
    parsed = subject.handler.payload_model.model_validate(payload)
    context = MessageContext("contract-message", _fresh_key(), 1, lambda: REMAINING_MS)
    # What it raises is its own business (it may have swallowed the refusal): only the attempts count.
    with no_network() as attempts, contextlib.suppress(Exception):
        handler.handle(parsed, context)
    if attempts:
        what = f"handle tried the network ({', '.join(attempts[:3])})"
        advice = "an optimistic handler runs again before its duplicate is recognised: make the call in lock mode"
        advice += " (mode = Mode.LOCK)"
        return line(subject, PURE, payload, what, advice)
    return None


def writes_target_declared_tables(rig: Rig, subject: Subject, payload: Payload) -> str | None:
    calls = rig.calls.setdefault(subject.name, Calls())
    calls.writes.clear()
    rig.seed(subject, payload)
    rig.deliver(subject, rig.message(subject, _fresh_key(), payload))
    declared = {rig.settings.table_names[table] for table in subject.handler.tables}
    stray = sorted({write.table for write in calls.writes} - declared)
    if stray:
        what = f"it wrote {stray}, not among its declared tables {list(subject.handler.tables)}"
        return line(subject, TABLES, payload, what, "declare the table in the handler's `tables`")
    return None


_OUTBOX_REFUSALS = (
    ErrorType.UNDECLARED_DESTINATION,
    ErrorType.OUTGOING_MESSAGE_TOO_LARGE,
    ErrorType.INVALID_OUTGOING_MESSAGE,
)


def emits_once_under_derived_keys(rig: Rig, subject: Subject, payload: Payload) -> str | None:
    """A handler with destinations, delivered twice: applied, the outbox holds exactly the messages its first ``handle``
    returned, each under ``derived_key(record, position)`` and carrying it; not applied, it holds none of them."""
    calls = rig.calls.setdefault(subject.name, Calls())
    runs = len(calls.emitted)
    key = _fresh_key()
    source = f"{subject.name}#{key}"
    rig.seed(subject, payload)
    first = rig.deliver(subject, rig.message(subject, key, payload))
    rig.deliver(subject, rig.message(subject, key, payload))
    emitted = rig.emitted(source)
    if first.outcome is not Outcome.APPLIED:
        if (first.reason or "").startswith(_OUTBOX_REFUSALS):
            advice = "emit only to the handler's `destinations`, JSON of at most 250,000 bytes"
            return line(subject, EMITS, payload, f"its messages were refused: {_ending(first)}", advice)
        if emitted:
            return line(subject, EMITS, payload, f"it ended {_ending(first)}, yet emitted {sorted(emitted)}")
        return None
    returned = calls.emitted[runs] if len(calls.emitted) > runs else ()
    expected = {derived_key(source, position): message.destination for position, message in enumerate(returned)}
    found = {emitted_key: destination for emitted_key, (destination, _) in emitted.items()}
    if found != expected:
        return line(subject, EMITS, payload, f"the outbox holds {found} for the message, expected {expected}")
    for position, message in enumerate(returned):
        emitted_key = derived_key(source, position)
        body = emitted[emitted_key][1]
        if not getattr(message, "raw", False) and json.loads(body)["metadata"]["idempotencyKey"] != emitted_key:
            return line(subject, EMITS, payload, f"the message {emitted_key} does not carry its key: {body[:200]}")
    return None


def draws(subject: Subject, rule: str, count: int = 2, samples: bool = True) -> list[Payload]:
    """``count`` payloads drawn from the model (a seed of the rule's own, so that rules do not share business
    identities), then the first of its sample events the model accepts."""
    drawn = payloads.valid_payloads(subject.handler, count, zlib.crc32(rule.encode()))
    for body in sample_bodies(subject.name) if samples else ():
        sample = json.loads(body).get("payload")
        if payloads.refusal(subject.handler.payload_model, sample) is None:
            return [*drawn, sample]
    return drawn


def failures(rule: Callable[..., str | None], rig: Rig, subject: Subject, cases: Sequence[Any]) -> list[str]:
    return [found for case in cases if (found := rule(rig, subject, *case)) is not None]
