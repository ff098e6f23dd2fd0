"""The core's own test handlers: what the proof of the store, the batch and the processor runs on.

Users delete the shipped examples, so no test of the core depends on them. Two handlers of the
tests' own, with tables of their own (created by the tests, not in ``template.yaml``):

- ``TallyHandler`` (optimistic, ``TallyAdded``): adds ``amount`` to a tally's total in one
  transaction with one entry per applied message. Its invariant: a tally's total is the sum of its
  distinct entries, and it has one entry per distinct ``entryId``. Two conditions can fail as a
  business condition: a tally counts in one unit (another unit is refused), and an entry is
  written once (the same entry under another key is refused).
- ``CallHandler`` (lock, ``CallRequested``): POSTs to a webhook through ``WebhookClient`` with the
  ``Idempotency-Key``, then records the call (its status and key) in its table.
- ``HoldHandler`` (lock with a guard, ``HoldRequested``): its claim reserves a hold in the calls table
  under the message's reservation token, refused while another message holds it; its commit turns the reservation into
  the final state, refused if the hold was cancelled meanwhile, and a release takes it back. Not in
  ``handlers_for_tests``: the processor's tests pass it as an extra handler, with a hook (``during``)
  that fails ``handle`` or plays another worker inside it.
- ``NoticeHandler`` (optimistic, ``NoticeRequested``) and ``LockedNoticeHandler`` (lock, ``LockedNoticeRequested``):
  write a notice's entry in the tally table (once per notice) and emit ``count`` ``TallyAdded`` messages to the
  ``NoticeQueue`` through the outbox, so the chain ends in the tally handler's own exactly-once invariant. Not in
  ``handlers_for_tests`` either: the outbox's tests pass them, with a hook (``during``) as the hold's.

The chaos run builds them in Lambda's runtime too (``tests/core/chaos_handlers.py``), whose venv is the function's:
what needs the tests' own tools (pytest, the template's reader) is imported in the functions that use it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from consumer.config import Settings
from consumer.errors import TransientError
from consumer.handler import ID_PATTERN, Effect, Guard, MessageContext, MessageHandler, Mode
from consumer.idempotency.writes import Delete, Put, Update
from consumer.outbox import QueueMessage
from consumer.outcome import Outcome
from consumer.webhook import WebhookClient
from testkit.lambda_sqs import sqs_record
from testkit.messages import envelope

TALLY_EVENT = "TallyAdded"
CALL_EVENT = "CallRequested"
HOLD_EVENT = "HoldRequested"
NOTICE_EVENT = "NoticeRequested"
LOCKED_NOTICE_EVENT = "LockedNoticeRequested"
NOTICE_QUEUE = "NoticeQueue"
TALLY_TABLE = "TallyTable"
CALL_TABLE = "CallTable"
UNIT = "PTS"
TOTAL = "TOTAL"

# Shaped as the template's tables are (on-demand, string keys): a tally and its entries, a call by id.
TABLE_PROPERTIES: dict[str, dict[str, Any]] = {
    TALLY_TABLE: {
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": "tallyId", "AttributeType": "S"},
            {"AttributeName": "entryId", "AttributeType": "S"},
        ],
        "KeySchema": [
            {"AttributeName": "tallyId", "KeyType": "HASH"},
            {"AttributeName": "entryId", "KeyType": "RANGE"},
        ],
    },
    CALL_TABLE: {
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [{"AttributeName": "callId", "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": "callId", "KeyType": "HASH"}],
    },
}
TEST_TABLES = tuple(TABLE_PROPERTIES)


class TallyAdded(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    entryId: str = Field(pattern=ID_PATTERN)
    tallyId: str = Field(pattern=ID_PATTERN)
    amount: StrictInt = Field(gt=0, le=10**12)
    unit: str = Field(pattern=r"^[A-Z]{3}$")


class TallyHandler(MessageHandler[TallyAdded]):
    event_type: ClassVar[str] = TALLY_EVENT
    mode: ClassVar[Mode] = Mode.OPTIMISTIC
    payload_model: ClassVar[type[BaseModel]] = TallyAdded
    tables: ClassVar[tuple[str, ...]] = (TALLY_TABLE,)

    def contention_key(self, payload: TallyAdded) -> str:
        return f"{TALLY_TABLE}/{payload.tallyId}"

    def handle(self, payload: TallyAdded, context: MessageContext) -> Effect:
        table = self.table_names[TALLY_TABLE]
        add = Update(
            table=table,
            key={"tallyId": payload.tallyId, "entryId": TOTAL},
            expression="ADD tallied :amount SET #unit = if_not_exists(#unit, :unit)",
            condition="attribute_not_exists(#unit) OR #unit = :unit",
            names={"#unit": "unit"},
            values={":amount": payload.amount, ":unit": payload.unit},
        )
        entry = Put(
            table=table,
            item={
                "tallyId": payload.tallyId,
                "entryId": f"ENTRY#{payload.entryId}",
                "amount": payload.amount,
                "idempotencyKey": context.idempotency_key,
                "messageId": context.message_id,
            },
            condition="attribute_not_exists(entryId)",
        )
        return Effect(result={"tallyId": payload.tallyId, "added": payload.amount}, writes=(add, entry))


class CallRequested(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    callId: str = Field(pattern=ID_PATTERN)
    tallyId: str = Field(pattern=ID_PATTERN)
    note: str = Field(default="", max_length=254)


class CallHandler(MessageHandler[CallRequested]):
    event_type: ClassVar[str] = CALL_EVENT
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = CallRequested
    tables: ClassVar[tuple[str, ...]] = (CALL_TABLE,)

    def __init__(
        self,
        settings: Settings,
        url: str = "",
        timeout_ms: int = 5_000,
        signing_key: Callable[[], Sequence[bytes]] | None = None,
    ) -> None:
        super().__init__(settings)
        self._timeout_ms = timeout_ms
        self._client = WebhookClient(url, "the test webhook", signing_key=signing_key) if url else None

    def handle(self, payload: CallRequested, context: MessageContext) -> Effect:
        if self._client is None:
            raise TransientError("no webhook for calls")
        deadline_s = max(0.1, min(self._timeout_ms, context.remaining_ms()) / 1000)
        body = json.dumps(payload.model_dump(mode="json")).encode("utf-8")
        status = self._client.post(body, context.idempotency_key, deadline_s).status
        record = Put(
            table=self.table_names[CALL_TABLE],
            item={"callId": payload.callId, "status": status, "idempotencyKey": context.idempotency_key},
        )
        return Effect(result={"callId": payload.callId, "status": status}, writes=(record,))


class HoldRequested(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    holdId: str = Field(pattern=ID_PATTERN)


class HoldHandler(MessageHandler[HoldRequested]):
    event_type: ClassVar[str] = HOLD_EVENT
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = HoldRequested
    tables: ClassVar[tuple[str, ...]] = (CALL_TABLE,)

    def __init__(self, settings: Settings, during: Callable[[MessageContext], None] | None = None) -> None:
        super().__init__(settings)
        self._during = during
        # What guard and handle were told: (which, its context's remaining ms), in call order.
        self.seen: list[tuple[str, int]] = []

    def guard(self, payload: HoldRequested, context: MessageContext) -> Guard:
        self.seen.append(("guard", context.remaining_ms()))
        table, key = self.table_names[CALL_TABLE], hold_key(payload.holdId)
        ours = {":token": context.reservation_token}
        reserve = Put(
            table,
            {**key, "status": "HELD", "holdToken": context.reservation_token},
            condition="attribute_not_exists(callId) OR holdToken = :token",
            values=ours,
            reason=f"hold {payload.holdId} is taken",
        )
        undo = Delete(table, key, "holdToken = :token", values=ours, reason=f"hold {payload.holdId} is no longer ours")
        return Guard((reserve,), (undo,))

    def handle(self, payload: HoldRequested, context: MessageContext) -> Effect:
        self.seen.append(("handle", context.remaining_ms()))
        if self._during is not None:
            self._during(context)
        # Final only over this message's reservation, still held: a hold cancelled meanwhile refuses the commit.
        done = Put(
            self.table_names[CALL_TABLE],
            {**hold_key(payload.holdId), "status": "DONE", "holdToken": context.reservation_token},
            condition="holdToken = :token AND #status = :held",
            names={"#status": "status"},
            values={":token": context.reservation_token, ":held": "HELD"},
            reason=f"hold {payload.holdId} was cancelled",
        )
        return Effect(result={"holdId": payload.holdId}, writes=(done,))


class NoticeRequested(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    noticeId: str = Field(pattern=ID_PATTERN)
    tallyId: str = Field(pattern=ID_PATTERN)
    count: StrictInt = Field(default=1, ge=0, le=200)
    # Padding of each emitted message's payload, to pass the outbox's size limit (never delivered: refused first).
    padding: StrictInt = Field(default=0, ge=0, le=10**6)
    # Where the messages go: the declared queue unless a test names another.
    destination: str = NOTICE_QUEUE


class NoticeHandler(MessageHandler[NoticeRequested]):
    event_type: ClassVar[str] = NOTICE_EVENT
    mode: ClassVar[Mode] = Mode.OPTIMISTIC
    payload_model: ClassVar[type[BaseModel]] = NoticeRequested
    tables: ClassVar[tuple[str, ...]] = (TALLY_TABLE,)
    destinations: ClassVar[tuple[str, ...]] = (NOTICE_QUEUE,)

    def __init__(self, settings: Settings, during: Callable[[MessageContext], None] | None = None) -> None:
        super().__init__(settings)
        self._during = during

    def handle(self, payload: NoticeRequested, context: MessageContext) -> Effect:
        if self._during is not None:
            self._during(context)
        entry = Put(
            table=self.table_names[TALLY_TABLE],
            item={"tallyId": payload.tallyId, "entryId": f"NOTICE#{payload.noticeId}", "count": payload.count},
            condition="attribute_not_exists(entryId)",
            reason=f"notice {payload.noticeId} was given before",
        )
        padding = {"note": "x" * payload.padding} if payload.padding else {}
        messages = tuple(
            QueueMessage(
                payload.destination,
                TALLY_EVENT,
                {**tally_payload(notice_entry(payload.noticeId, i), payload.tallyId, amount=1), **padding},
            )
            for i in range(payload.count)
        )
        return Effect(
            result={"noticeId": payload.noticeId, "emitted": payload.count}, writes=(entry,), messages=messages
        )


class LockedNoticeHandler(NoticeHandler):
    event_type: ClassVar[str] = LOCKED_NOTICE_EVENT
    mode: ClassVar[Mode] = Mode.LOCK


def notice_entry(notice_id: str, position: int) -> str:
    """The tally entry the ``position``-th message of a notice adds."""
    return f"{notice_id}.{position}"


def hold_key(hold_id: str) -> dict[str, str]:
    return {"callId": f"HOLD#{hold_id}"}


def handlers_for_tests(
    settings: Settings, webhook_url: str = "", timeout_ms: int = 5_000
) -> dict[str, MessageHandler[Any]]:
    """The consumer's handlers in the core's tests: pass them as ``wire(..., handlers=...)``."""
    return {
        TALLY_EVENT: TallyHandler(settings),
        CALL_EVENT: CallHandler(settings, webhook_url, timeout_ms),
    }


def create_test_tables(dynamodb: Any, names: Mapping[str, str]) -> None:
    """Create the tables named in ``names`` (logical id -> table name): the test handlers' own, and
    any of the template's (the idempotency table) as the template defines it."""
    from testkit.tables import create_table, create_template_tables  # noqa: PLC0415 (see the module's docstring)

    create_template_tables(dynamodb, {table: name for table, name in names.items() if table not in TABLE_PROPERTIES})
    for logical_id, name in names.items():
        if logical_id in TABLE_PROPERTIES:
            create_table(dynamodb, name, TABLE_PROPERTIES[logical_id])


# -- bodies --------------------------------------------------------------------------------


def tally_payload(entry_id: str, tally_id: str = "t-1", amount: int = 1250, unit: str = UNIT) -> dict[str, Any]:
    return {"entryId": entry_id, "tallyId": tally_id, "amount": amount, "unit": unit}


def tally_body(entry_id: str, tally_id: str = "t-1", amount: int = 1250, key: str | None = None) -> str:
    return envelope(TALLY_EVENT, key or f"add-{entry_id}", tally_payload(entry_id, tally_id, amount))


def call_payload(call_id: str, tally_id: str = "t-1") -> dict[str, Any]:
    return {"callId": call_id, "tallyId": tally_id, "note": f"call {call_id}"}


def call_body(call_id: str, key: str | None = None, tally_id: str = "t-1") -> str:
    return envelope(CALL_EVENT, key or f"call-{call_id}", call_payload(call_id, tally_id))


def notice_body(notice_id: str, count: int = 1, key: str | None = None, *, locked: bool = False, **fields: Any) -> str:
    payload = {"noticeId": notice_id, "tallyId": "t-1", "count": count, **fields}
    return envelope(LOCKED_NOTICE_EVENT if locked else NOTICE_EVENT, key or f"notice-{notice_id}", payload)


def hold_body(hold_id: str, key: str | None = None) -> str:
    return envelope(HOLD_EVENT, key or f"hold-{hold_id}", {"holdId": hold_id})


# -- reading the tables --------------------------------------------------------------------


def tally_total(dynamodb: Any, table: str, tally_id: str) -> int:
    """A tally's total (0 before its first entry), read consistently."""
    key = {"tallyId": {"S": tally_id}, "entryId": {"S": TOTAL}}
    item = dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
    return int(item["tallied"]["N"]) if item else 0


def tally_entries(dynamodb: Any, table: str, tally_id: str) -> list[str]:
    """A tally's items, sorted: ``TOTAL`` and one ``ENTRY#<entryId>`` per applied message."""
    from tests.kit import sort_keys  # noqa: PLC0415 (see the module's docstring)

    return sort_keys(dynamodb, table, "tallyId", tally_id)


def recorded_call(dynamodb: Any, table: str, call_id: str) -> dict[str, Any] | None:
    return dynamodb.get_item(TableName=table, Key={"callId": {"S": call_id}}, ConsistentRead=True).get("Item")


def refusals() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What was applied before, and a batch with one message of each refusal beside new ones, on distinct tallies."""
    before = [
        sqs_record("earlier-dup", tally_body("e-2", tally_id="t-2", key="k-2")),
        sqs_record("earlier-reused", tally_body("e-3", tally_id="t-3", key="k-3")),
        sqs_record("earlier-entry", tally_body("e-4", tally_id="t-4", key="k-4a")),
    ]
    batch = [
        sqs_record("new-1", tally_body("e-1", tally_id="t-1", key="k-1")),
        sqs_record("duplicate", tally_body("e-2", tally_id="t-2", key="k-2")),
        sqs_record("key-reused", tally_body("e-3", tally_id="t-3", amount=7, key="k-3")),
        sqs_record("condition", tally_body("e-4", tally_id="t-4", key="k-4b")),
        sqs_record("new-5", tally_body("e-5", tally_id="t-5", key="k-5")),
    ]
    return before, batch


# What each message of ``refusals``' batch comes to, alone or grouped.
REFUSALS = {
    "new-1": Outcome.APPLIED,
    "duplicate": Outcome.DUPLICATE,
    "key-reused": Outcome.POISON,
    "condition": Outcome.POISON,
    "new-5": Outcome.APPLIED,
}
