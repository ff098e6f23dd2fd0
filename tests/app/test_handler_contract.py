"""Your handler's contract: every registered handler, and the core's own, held to the rules any handler gets.

Each rule (``tests/handler_contract.py``) runs for each handler it applies to, on DynamoDB Local behind
the conflict emulation and moto's SQS, with payloads drawn from the handler's model, its first accepted sample
event and its seed items; the test id names the event type. A failure is one line per payload: the handler, the
rule, the payload and what to do. The negative controls break the core on purpose (the record's condition
removed, the payload hash not compared, the lease never ending, the guard skipped, the schema check bypassed, the
declared tables' names lost) and show the same rule functions fail for every handler; the purity rule's control is
an impure handler of the tests' own.
"""

from __future__ import annotations

import contextlib
import json
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from consumer import outbox, prepared
from consumer.config import Settings
from consumer.handler import (
    ID_PATTERN,
    Effect,
    Guard,
    MessageContext,
    MessageHandler,
    Mode,
    declared_settings,
    declared_tables,
)
from consumer.idempotency import Duplicate, InFlight, apply, claim
from consumer.idempotency import calls as store
from consumer.idempotency.record import IdempotencyRecord, Status
from consumer.idempotency.release import Release
from consumer.idempotency.writes import Put, Update
from consumer.outbox import OUTBOX_TABLE, QueueMessage
from consumer.webhook import WebhookClient
from local.stack import deploy_stack
from service.registry import HANDLERS
from testkit import payloads
from testkit.servers import LocalServers
from testkit.tables import create_table
from testkit.webhook import WebhookSink
from tests import handler_contract as contract
from tests.handler_contract import Rig, Subject

HOLD_TABLE = "ContractHoldTable"
_HOLD_TABLE_PROPERTIES = {
    "BillingMode": "PAY_PER_REQUEST",
    "AttributeDefinitions": [{"AttributeName": "holdId", "AttributeType": "S"}],
    "KeySchema": [{"AttributeName": "holdId", "KeyType": "HASH"}],
}


class Hold(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    holdId: str = Field(pattern=ID_PATTERN)
    amount: StrictInt = Field(gt=0, le=10**6)


class GuardedCallHandler(MessageHandler[Hold]):
    """Lock mode with a guard: holds an item under its reservation token, calls the sink with the key, then settles
    the hold and emits that it did (through the outbox)."""

    event_type: ClassVar[str] = "ContractGuardedCall"
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = Hold
    tables: ClassVar[tuple[str, ...]] = (HOLD_TABLE,)
    destinations: ClassVar[tuple[str, ...]] = ("ContractQueue",)

    def __init__(self, settings: Settings, url: str) -> None:
        super().__init__(settings)
        self.client = WebhookClient(f"{url}/{self.event_type}", "the contract's sink")

    def _held(self, payload: Hold, token: str, expression: str, condition: str, **values: Any) -> Update:
        table = self.table_names[HOLD_TABLE]
        return Update(table, {"holdId": payload.holdId}, expression, condition, values={":token": token, **values})

    def guard(self, payload: Hold, context: MessageContext) -> Guard:
        token = context.reservation_token
        hold = replace(
            self._held(payload, token, "SET heldBy = :token", "attribute_not_exists(heldBy) OR heldBy = :token"),
            held_by="heldBy",
        )
        return Guard((hold,), (self._held(payload, token, "REMOVE heldBy", "heldBy = :token"),))

    def handle(self, payload: Hold, context: MessageContext) -> Effect:
        status = self.client.post(json.dumps(payload.model_dump()).encode(), context.idempotency_key, 2.0).status
        settle = self._held(
            payload,
            context.reservation_token,
            "REMOVE heldBy SET amount = :amount, callStatus = :status",
            "heldBy = :token",
            **{":amount": payload.amount, ":status": status},
        )
        settled = QueueMessage("ContractQueue", "ContractHoldSettled", {"holdId": payload.holdId, "status": status})
        return Effect({"status": status}, (settle,), messages=(settled,))


class ImpureHandler(MessageHandler[Hold]):
    """Optimistic, yet it opens a connection in ``handle`` (and swallows the refusal): the purity rule's control."""

    event_type: ClassVar[str] = "ContractImpure"
    mode: ClassVar[Mode] = Mode.OPTIMISTIC
    payload_model: ClassVar[type[BaseModel]] = Hold
    tables: ClassVar[tuple[str, ...]] = (HOLD_TABLE,)

    def handle(self, payload: Hold, context: MessageContext) -> Effect:
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", 9), timeout=0.5).close()
        return Effect(None, (Put(self.table_names[HOLD_TABLE], {"holdId": payload.holdId}),))


def _registered(handler: type[MessageHandler[Any]]) -> Subject:
    return Subject(handler, lambda settings, _: handler(settings))


SUBJECTS = [
    *(_registered(handler) for handler in payloads.registered()),
    Subject(GuardedCallHandler, GuardedCallHandler),
]


def _of(applies: Callable[[Subject], bool]) -> Any:
    chosen = [subject for subject in SUBJECTS if applies(subject)]
    return pytest.mark.parametrize("subject", chosen, ids=[subject.name for subject in chosen])


every_handler = _of(lambda subject: True)
emitting_handlers = _of(lambda subject: bool(subject.handler.destinations))
lock_handlers = _of(lambda subject: subject.handler.mode is Mode.LOCK)
guarded_handlers = _of(lambda subject: subject.handler.mode is Mode.LOCK and subject.guarded)
optimistic_handlers = _of(lambda subject: subject.handler.mode is Mode.OPTIMISTIC)


@pytest.fixture(scope="module")
def rig(local_servers: LocalServers) -> Iterator[Rig]:
    """The template deployed once for the module (its webhook URLs at the sink), the tests' own table beside it."""
    with WebhookSink() as sink, pytest.MonkeyPatch.context() as environment:
        stack = deploy_stack(local_servers, webhook=sink)
        stack.stop()
        for name, value in stack.function_environment.items():
            if name.startswith("AWS_"):
                environment.setenv(name, value)
        settings = Settings.from_env(
            stack.function_environment, tables=declared_tables(HANDLERS), handler_settings=declared_settings(HANDLERS)
        )
        dynamodb = local_servers.client("dynamodb")
        hold_table = f"contract-hold-{uuid.uuid4().hex[:8]}"
        create_table(dynamodb, hold_table, _HOLD_TABLE_PROPERTIES)
        # The outbox too, for the core's own emitting subject whatever the registered handlers emit.
        tables = {**settings.table_names, HOLD_TABLE: hold_table, OUTBOX_TABLE: stack.table_name(OUTBOX_TABLE)}
        settings = settings.model_copy(update={"table_names": tables})
        yield Rig(settings, sink, dynamodb)


def _cases(subject: Subject, rule: str) -> list[tuple[Any, ...]]:
    return [(payload,) for payload in contract.draws(subject, rule)]


def _pairs(subject: Subject, rule: str) -> list[tuple[Any, ...]]:
    """Each payload with the next: the first must apply, so no sample event (another rule may have applied it)."""
    drawn = contract.draws(subject, rule, samples=False)
    return [(payload, drawn[(index + 1) % len(drawn)]) for index, payload in enumerate(drawn)]


def _invalid(subject: Subject) -> list[tuple[Any, ...]]:
    return [(invalid,) for invalid in payloads.invalid_payloads(subject.handler)]


def _holds(rule: Callable[..., str | None], rig: Rig, subject: Subject, cases: list[tuple[Any, ...]]) -> None:
    found = contract.failures(rule, rig, subject, cases)
    assert not found, "\n".join(found)


def _broken(rule: Callable[..., str | None], rig: Rig, subject: Subject, cases: list[tuple[Any, ...]]) -> None:
    found = contract.failures(rule, rig, subject, cases)
    assert found, f"{subject.name}: the core is broken on purpose, yet '{rule.__name__}' holds for every payload"


# -- the rules, for every handler they apply to ---------------------------------------------


@every_handler
def test_a_resend_changes_nothing(rig: Rig, subject: Subject) -> None:
    _holds(contract.resend_changes_nothing, rig, subject, _cases(subject, contract.RESEND))


@every_handler
def test_the_same_key_with_other_content_changes_nothing(rig: Rig, subject: Subject) -> None:
    _holds(contract.other_content_is_refused, rig, subject, _pairs(subject, contract.REUSED))


@every_handler
def test_concurrent_deliveries_leave_one_deliverys_state(rig: Rig, subject: Subject) -> None:
    _holds(contract.concurrent_deliveries_leave_one, rig, subject, _cases(subject, contract.CONCURRENT))


def _holds_past_a_crash(rule: Callable[..., str | None], rig: Rig, subject: Subject, name: str) -> None:
    """A rule that crashes a delivery at its commit: it holds, and at least one drawn payload reached the commit."""
    crashes = rig.crashes
    _holds(rule, rig, subject, _cases(subject, name))
    assert rig.crashes > crashes, f"{subject.name}: no drawn payload reached its commit; {contract.SEEDS}"


@lock_handlers
def test_a_crash_before_the_commit_then_the_redelivery_leave_one_deliverys_state(rig: Rig, subject: Subject) -> None:
    _holds_past_a_crash(contract.crash_before_commit_leaves_one, rig, subject, contract.CRASH)


@guarded_handlers
def test_a_message_refused_by_its_guard_makes_no_call(rig: Rig, subject: Subject) -> None:
    _holds(contract.refused_guard_makes_no_call, rig, subject, _cases(subject, contract.GUARD))


@guarded_handlers
def test_a_takeover_refused_by_its_guard_leaves_nothing_of_the_message(rig: Rig, subject: Subject) -> None:
    _holds_past_a_crash(contract.refused_takeover_leaves_nothing, rig, subject, contract.TAKEOVER_REFUSED)


@guarded_handlers
def test_a_message_meeting_another_messages_reservation_waits(rig: Rig, subject: Subject) -> None:
    _holds_past_a_crash(contract.busy_waits, rig, subject, contract.BUSY)


@every_handler
def test_a_payload_the_model_refuses_is_dead_lettered_with_nothing_written(rig: Rig, subject: Subject) -> None:
    _holds(contract.refused_payload_writes_nothing, rig, subject, _invalid(subject))


@optimistic_handlers
def test_an_optimistic_handler_makes_no_call(rig: Rig, subject: Subject) -> None:
    _holds(contract.optimistic_handle_is_pure, rig, subject, _cases(subject, contract.PURE))


@emitting_handlers
def test_an_applied_message_emits_each_of_its_messages_once_under_its_derived_keys(rig: Rig, subject: Subject) -> None:
    _holds_emitting(contract.emits_once_under_derived_keys, rig, subject, _cases(subject, contract.EMITS))


def _holds_emitting(rule: Callable[..., str | None], rig: Rig, subject: Subject, cases: list[tuple[Any, ...]]) -> None:
    """The rule holds, and at least one payload emitted (a sample event that emits is among the draws)."""
    _holds(rule, rig, subject, cases)
    emitted = rig.calls.get(subject.name)
    assert emitted and any(emitted.emitted), f"{subject.name}: no payload emitted; {contract.EMITTING_SAMPLE}"


@every_handler
def test_every_write_targets_a_declared_table(rig: Rig, subject: Subject) -> None:
    _holds(contract.writes_target_declared_tables, rig, subject, _cases(subject, contract.TABLES))


def test_the_purity_rule_catches_a_handler_that_calls_out(rig: Rig) -> None:
    impure = Subject(ImpureHandler, lambda settings, _: ImpureHandler(settings))
    found = contract.failures(contract.optimistic_handle_is_pure, rig, impure, _cases(impure, contract.PURE)[:1])
    assert len(found) == 1 and found[0].startswith("ContractImpure: rule 'an optimistic handler makes no call")
    assert "handle tried the network" in found[0] and "lock mode (mode = Mode.LOCK)" in found[0], found


# -- negative controls: the core broken on purpose, the same rules fail for every handler ----------

# Draws of the controls' own: business identities the rules' tests did not use.
CONTROL = "control: "
# Always true, and using every name and value the claiming writes send (DynamoDB refuses unused ones).
_ANYTHING_CLAIMABLE = (
    "attribute_not_exists(#id) OR attribute_exists(#id) OR #expires < :now_s OR #lease < :now_ms"
    " OR #status = :in_progress OR #hash = :hash"
)
# An abandoned claim whose lease ran out is never taken over.
_LEASE_NEVER_ENDS = (
    "attribute_not_exists(#id) OR #expires < :now_s"
    " OR (#status = :in_progress AND #lease < :now_ms AND #hash = :hash AND #lease < :zero)"
)


def _hash_not_compared(current: IdempotencyRecord, payload_hash: str) -> Duplicate | InFlight:
    return Duplicate(current) if current.status is Status.COMPLETED else InFlight(current)


@every_handler
def test_control_resend_without_the_records_condition(
    rig: Rig, subject: Subject, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "_CLAIMABLE", _ANYTHING_CLAIMABLE)
    _broken(contract.resend_changes_nothing, rig, subject, _cases(subject, CONTROL + contract.RESEND))


@every_handler
def test_control_other_content_without_the_payload_hash(
    rig: Rig, subject: Subject, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every transition that reads a refused record's hash: an apply's and a claim's.
    for transition in (apply, claim):
        monkeypatch.setattr(transition, "existing", _hash_not_compared)
    _broken(contract.other_content_is_refused, rig, subject, _pairs(subject, CONTROL + contract.REUSED))


@every_handler
def test_control_concurrent_deliveries_without_the_records_condition(
    rig: Rig, subject: Subject, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "_CLAIMABLE", _ANYTHING_CLAIMABLE)
    _broken(contract.concurrent_deliveries_leave_one, rig, subject, _cases(subject, CONTROL + contract.CONCURRENT))


@lock_handlers
def test_control_crash_when_a_lease_never_ends(rig: Rig, subject: Subject, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "_CLAIMABLE", _LEASE_NEVER_ENDS)
    _broken(contract.crash_before_commit_leaves_one, rig, subject, _cases(subject, CONTROL + contract.CRASH))


@guarded_handlers
def test_control_guard_skipped(rig: Rig, subject: Subject, monkeypatch: pytest.MonkeyPatch) -> None:
    checked = claim.Claim.__post_init__

    def unguarded(self: claim.Claim) -> None:
        object.__setattr__(self, "request", replace(self.request, guard=()))
        checked(self)

    monkeypatch.setattr(claim.Claim, "__post_init__", unguarded)
    _broken(contract.refused_guard_makes_no_call, rig, subject, _cases(subject, CONTROL + contract.GUARD))


@guarded_handlers
def test_control_takeover_refused_without_releasing_the_abandoned_claim(
    rig: Rig, subject: Subject, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Release, "abandoned", lambda self, table: False)
    cases = _cases(subject, CONTROL + contract.TAKEOVER_REFUSED)
    _broken(contract.refused_takeover_leaves_nothing, rig, subject, cases)


@guarded_handlers
def test_control_busy_read_as_refused(rig: Rig, subject: Subject, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "held_by_another", lambda write, reason, holder: False)
    _broken(contract.busy_waits, rig, subject, _cases(subject, CONTROL + contract.BUSY))


@every_handler
def test_control_schema_check_bypassed(rig: Rig, subject: Subject, monkeypatch: pytest.MonkeyPatch) -> None:
    # The processor no longer recognises the model's refusal: the record fails unread instead.
    monkeypatch.setattr(prepared, "ValidationError", type("NeverRaised", (Exception,), {}))
    _broken(contract.refused_payload_writes_nothing, rig, subject, _invalid(subject))


@every_handler
def test_control_declared_tables_misnamed(rig: Rig, subject: Subject, monkeypatch: pytest.MonkeyPatch) -> None:
    def misnamed(self: MessageHandler[Any], settings: Settings) -> None:
        # The core hands the handler the idempotency table for each table it declared.
        self.table_names = {table: settings.idempotency_table_name for table in self.tables}

    monkeypatch.setattr(MessageHandler, "__init__", misnamed)
    _broken(contract.writes_target_declared_tables, rig, subject, _cases(subject, CONTROL + contract.TABLES)[:1])


@emitting_handlers
def test_control_emitted_under_keys_not_derived_as_documented(
    rig: Rig, subject: Subject, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox, "derived_key", lambda record_id, position: f"{record_id}/{position}")
    _broken(contract.emits_once_under_derived_keys, rig, subject, _cases(subject, CONTROL + contract.EMITS))
