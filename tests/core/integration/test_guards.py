"""A lock-mode guard on DynamoDB Local (behind the conflict emulation): no call when the rule fails.

The handler is the core's own, defined here: a charge against an account's balance through
an outside call (recorded by ``Billing``), with a hold on the account, marked with the
idempotency key, as its reservation. Each path of the claim is driven: refused (no call,
first delivery and redrive), accepted (one call, hold settled by the commit), a transient
failure (hold undone with the release), a crash after the hold (taken over and settled), a
zombie's release (fenced: the newer owner's hold stays). The negative controls run the same
trials without the guard, or with the core's undo dropped, and see the checks fail.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from consumer.config import Settings
from consumer.errors import BusinessConditionFailed, ConfigurationError, ErrorType, PoisonMessage, TransientError
from consumer.handler import ID_PATTERN, Effect, Guard, MessageContext, MessageHandler, Mode
from consumer.idempotency import Claimed, Committed, IdempotencyStore, Refused
from consumer.idempotency.answers import ClaimRequest
from consumer.idempotency.calls import Table
from consumer.idempotency.claim import Claim
from consumer.idempotency.commit import Commit
from consumer.idempotency.record import IdempotencyRecord, Status, reservation_token
from consumer.idempotency.release import Release
from consumer.idempotency.writes import ConditionCheck, Update
from consumer.outcome import Outcome
from consumer.processor import ABANDONED_RELEASED, BUSY
from testkit.dynamodb_local import DynamoDBLocal
from tests.conftest import TableFactory
from tests.kit import Crash
from tests.lock_rig import REMAINING_MS, LockRig, Refusals, claim, commit, release
from tests.utils import settings_for_tests, together

LEASE_MS = 30_000


class Charge(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    accountId: str = Field(pattern=ID_PATTERN)
    amountCents: StrictInt = Field(gt=0)


class Billing:
    """The outside call: records each charge's key; ``fail_next`` scripts what the next calls do, ``fail_for`` what
    the next calls of one key do (handlers running side by side call in no set order)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._script: list[str] = []
        self._by_key: dict[str, list[str]] = {}

    def fail_next(self, *how: str) -> None:
        self._script.extend(how)

    def fail_for(self, key: str, *how: str) -> None:
        self._by_key.setdefault(key, []).extend(how)

    def charge(self, key: str) -> None:
        mine = self._by_key.get(key)
        how = mine.pop(0) if mine else self._script.pop(0) if self._script else "ok"
        if how == "crash before the call":
            raise Crash
        self.calls.append(key)
        if how == "rejected":
            raise PoisonMessage(ErrorType.WEBHOOK_REJECTED, "HTTP 422")
        if how == "transient":
            raise TransientError("billing answered 503")
        if how == "crash after the call":
            raise Crash


class ChargeHandler(MessageHandler[Charge]):
    event_type: ClassVar[str] = "ChargeRequested"
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = Charge
    tables: ClassVar[tuple[str, ...]] = ("AccountTable",)

    def __init__(
        self, settings: Settings, billing: Billing, *, guarded: bool = True, rule_always: bool = False
    ) -> None:
        super().__init__(settings)
        self.billing = billing
        self.guarded = guarded
        # The rule checked on every delivery, the takeover's too (the renewal example's shape), instead of
        # only where no hold stands.
        self.rule_always = rule_always

    def _hold_write(self, payload: Charge, token: str, expression: str, condition: str, **values: Any) -> Update:
        return Update(
            self.table_names["AccountTable"],
            {"id": payload.accountId},
            expression,
            condition=condition,
            values={":token": token, **values},
            reason=f"balance of {payload.accountId} below {payload.amountCents} cents, or held by another charge",
        )

    def guard(self, payload: Charge, context: MessageContext) -> Guard | None:
        if not self.guarded:
            return None
        token = context.reservation_token
        condition = (
            "(attribute_not_exists(holdToken) OR holdToken = :token) AND balanceCents >= :amount"
            if self.rule_always
            # Its own hold passes: the redelivery that takes a dead worker's claim over.
            else "(attribute_not_exists(holdToken) AND balanceCents >= :amount) OR holdToken = :token"
        )
        hold = replace(
            self._hold_write(
                payload,
                token,
                "SET holdToken = :token, holdCents = :amount",
                condition,
                **{":amount": payload.amountCents},
            ),
            held_by="holdToken",
        )
        undo = self._hold_write(payload, token, "REMOVE holdToken, holdCents", "holdToken = :token")
        return Guard(writes=(hold,), undo=(undo,))

    def handle(self, payload: Charge, context: MessageContext) -> Effect:
        self.billing.charge(context.idempotency_key)
        minus = {":minus": -payload.amountCents}
        if self.guarded:
            settle = self._hold_write(
                payload,
                context.reservation_token,
                "ADD balanceCents :minus REMOVE holdToken, holdCents",
                "holdToken = :token",
                **minus,
            )
        else:
            # Lock mode before guards (docs/guards.md): the rule is only checked at the commit, after the call.
            settle = Update(
                self.table_names["AccountTable"],
                {"id": payload.accountId},
                "ADD balanceCents :minus",
                condition="balanceCents >= :amount",
                values={**minus, ":amount": payload.amountCents},
            )
        return Effect(result={"charged": payload.amountCents}, writes=(settle,))


class Accounts:
    def __init__(self, rig: LockRig, table: str) -> None:
        self.rig = rig
        self.table = table

    def open(self, balance: int) -> str:
        account = f"acc-{uuid.uuid4().hex[:8]}"
        self.rig.dynamodb.put_item(
            TableName=self.table, Item={"id": {"S": account}, "balanceCents": {"N": str(balance)}}
        )
        return account

    def state(self, account: str) -> tuple[int, bool]:
        """The balance, and whether a hold stands on it."""
        item = self.rig.item(self.table, {"id": {"S": account}})
        assert item is not None
        return int(item["balanceCents"]["N"]), "holdToken" in item

    def clear_hold(self, account: str) -> None:
        """A hold taken off by hand (an operator's fix)."""
        self.rig.dynamodb.update_item(
            TableName=self.table, Key={"id": {"S": account}}, UpdateExpression="REMOVE holdToken, holdCents"
        )

    def debit(self, account: str, cents: int) -> None:
        """Another writer's debit, which knows nothing of holds."""
        self.rig.dynamodb.update_item(
            TableName=self.table,
            Key={"id": {"S": account}},
            UpdateExpression="ADD balanceCents :minus",
            ExpressionAttributeValues={":minus": {"N": str(-cents)}},
        )


Make = Callable[..., tuple[LockRig, Billing, Accounts]]


@pytest.fixture(scope="module")
def tables(id_table: TableFactory) -> tuple[str, str]:
    return id_table("guard-records"), id_table("guard-accounts")


@pytest.fixture
def make(dynamodb_local: DynamoDBLocal, tables: tuple[str, str]) -> Make:
    def build(
        *, handler: type[ChargeHandler] = ChargeHandler, guarded: bool = True, rule_always: bool = False
    ) -> tuple[LockRig, Billing, Accounts]:
        records, accounts = tables
        settings = settings_for_tests(table_names={"AccountTable": accounts})
        billing = Billing()
        charges = handler(settings, billing, guarded=guarded, rule_always=rule_always)
        rig = LockRig(dynamodb_local, records, charges, settings)
        return rig, billing, Accounts(rig, accounts)

    return build


def key() -> str:
    return f"charge-{uuid.uuid4().hex[:8]}"


def refused_trial(make: Make, *, guarded: bool) -> list[str]:
    """A charge over the balance, delivered and redriven: the calls billing received."""
    rig, billing, accounts = make(guarded=guarded)
    account = accounts.open(500)
    charge = {"accountId": account, "amountCents": 1000}
    first = rig.deliver(k := key(), charge)
    redrive = rig.deliver(k, charge)
    assert (first.outcome, redrive.outcome) == (Outcome.POISON, Outcome.POISON)
    assert [letter["ErrorType"] for letter in rig.dead_letters.sent] == ["BusinessConditionFailed"] * 2
    assert accounts.state(account) == (500, False)
    assert rig.store.get(rig.handler.event_type + "#" + k) is None
    return billing.calls


def test_a_refused_charge_makes_no_call_on_delivery_or_redrive(make: Make) -> None:
    assert refused_trial(make, guarded=True) == []


def test_negative_control_without_the_guard_the_refused_charge_calls_each_time(make: Make) -> None:
    assert len(refused_trial(make, guarded=False)) == 2


def test_the_refusal_says_the_guards_reason(make: Make) -> None:
    rig, _, accounts = make()
    account = accounts.open(10)
    rig.deliver(key(), {"accountId": account, "amountCents": 11})
    assert f"balance of {account} below 11 cents, or held by another charge" in rig.dead_letters.sent[0]["ErrorMessage"]


def test_an_accepted_charge_calls_once_and_the_commit_settles_its_hold(make: Make) -> None:
    rig, billing, accounts = make()
    account = accounts.open(5000)
    charge = {"accountId": account, "amountCents": 3000}

    k = key()
    assert rig.deliver(k, charge).outcome is Outcome.APPLIED
    assert billing.calls == [k]
    assert accounts.state(account) == (2000, False)
    record = rig.store.get(f"ChargeRequested#{k}")
    assert record is not None and record.status is Status.COMPLETED

    # The guard now fails (2000 < 3000), but the key is completed: a duplicate, not a refusal.
    assert rig.deliver(k, charge).outcome is Outcome.DUPLICATE
    assert billing.calls == [k]
    assert rig.dead_letters.sent == []


def transient_trial(make: Make) -> tuple[LockRig, Billing, Accounts, str, str]:
    rig, billing, accounts = make()
    account = accounts.open(5000)
    billing.fail_next("transient")
    k = key()
    assert rig.deliver(k, {"accountId": account, "amountCents": 1000}).outcome is Outcome.RETRIED
    return rig, billing, accounts, account, k


def test_a_transient_failure_releases_the_claim_and_its_hold_together(make: Make) -> None:
    rig, billing, accounts, account, k = transient_trial(make)
    assert rig.store.get(f"ChargeRequested#{k}") is None
    assert accounts.state(account) == (5000, False)
    # Another charge is not blocked by a hold left behind, and the retry applies at once.
    assert rig.deliver(key(), {"accountId": account, "amountCents": 100}).outcome is Outcome.APPLIED
    assert rig.deliver(k, {"accountId": account, "amountCents": 1000}).outcome is Outcome.APPLIED
    assert accounts.state(account) == (3900, False)
    assert billing.calls.count(k) == 2


def test_negative_control_a_release_without_the_undo_leaves_the_hold(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_all = IdempotencyStore.run_all

    def release_without_undo(store: IdempotencyStore, transitions: Sequence[Any], *args: Any) -> list[object]:
        bare = [replace(t, undo=()) if isinstance(t, Release) else t for t in transitions]
        return run_all(store, bare, *args)

    monkeypatch.setattr(IdempotencyStore, "run_all", release_without_undo)
    rig, _, accounts, account, k = transient_trial(make)
    assert rig.store.get(f"ChargeRequested#{k}") is None
    assert accounts.state(account) == (5000, True)  # what the test above refuses


@pytest.mark.parametrize(("crash", "calls"), [("crash before the call", 1), ("crash after the call", 2)])
def test_a_crash_after_the_hold_is_taken_over_and_settled(make: Make, crash: str, calls: int) -> None:
    rig, billing, accounts = make()
    account = accounts.open(5000)
    charge = {"accountId": account, "amountCents": 1000}
    billing.fail_next(crash)
    rig.crash(k := key(), charge)
    assert accounts.state(account) == (5000, True)

    # While the dead worker's lease runs, the key is in flight: no second call.
    assert rig.deliver(k, charge, receive_count=2).outcome is Outcome.IN_FLIGHT
    rig.advance_past_the_lease()
    # The takeover passes its own hold; the commit settles it. At-least-once: a crash after
    # the call calls again, with the same key.
    assert rig.deliver(k, charge, receive_count=3).outcome is Outcome.APPLIED
    assert billing.calls == [k] * calls
    assert accounts.state(account) == (4000, False)


def test_a_guard_writing_an_undeclared_table_is_retried_before_any_claim(make: Make) -> None:
    rig, billing, accounts = make()
    account = accounts.open(5000)
    stray = Update("NotDeclared", {"id": "x"}, "SET a = :a", values={":a": 1})
    rig.handler.guard = lambda payload, context: Guard(writes=(stray,))  # type: ignore[method-assign]

    result = rig.deliver(k := key(), {"accountId": account, "amountCents": 1000})

    assert result.outcome is Outcome.RETRIED
    assert "NotDeclared" in (result.reason or "")
    assert billing.calls == []
    assert rig.store.get(f"ChargeRequested#{k}") is None


# -- the store, transition by transition ------------------------------------------------------


def hold(rig: LockRig, account: str, k: str) -> Guard:
    guard = rig.handler.guard(Charge(accountId=account, amountCents=1000), context(k))
    assert guard is not None
    return guard


def context(k: str) -> MessageContext:
    """As the core builds it for a message of key ``k`` whose payload hash is "h" (the claims below say so)."""
    token = reservation_token(f"ChargeRequested#{k}", "h")
    return MessageContext("m", k, 1, lambda: LEASE_MS, reservation_token=token)


def test_a_zombies_release_leaves_the_newer_owners_claim_and_hold(make: Make) -> None:
    rig, _, accounts = make()
    account = accounts.open(5000)
    guard = hold(rig, account, k := key())
    record_id = f"ChargeRequested#{k}"
    zombie = rig.store.claim(record_id, "h", LEASE_MS, guard.writes)
    assert isinstance(zombie, Claimed) and zombie.attempts is None
    rig.advance_past_the_lease()
    owner = rig.store.claim(record_id, "h", LEASE_MS, guard.writes)
    assert isinstance(owner, Claimed)

    assert rig.store.release(zombie, guard.undo) is False
    assert accounts.state(account) == (5000, True)
    current = rig.store.get(record_id)
    assert current is not None and current.owner_token == owner.owner_token

    assert rig.store.release(owner, guard.undo) is True
    assert accounts.state(account) == (5000, False)
    assert rig.store.get(record_id) is None


def test_a_guard_refusal_on_a_free_key_writes_nothing(make: Make) -> None:
    rig, _, accounts = make()
    account = accounts.open(999)
    guard = hold(rig, account, k := key())

    result = rig.store.claim(f"ChargeRequested#{k}", "h", LEASE_MS, guard.writes)

    assert result == Refused(guard.writes[0])
    assert rig.store.get(f"ChargeRequested#{k}") is None
    assert accounts.state(account) == (999, False)


def test_an_undo_whose_condition_fails_releases_nothing(make: Make) -> None:
    rig, _, accounts = make()
    account = accounts.open(5000)
    guard = hold(rig, account, k := key())
    claim = rig.store.claim(f"ChargeRequested#{k}", "h", LEASE_MS, guard.writes)
    assert isinstance(claim, Claimed)
    other = hold(rig, account, "someone-else")

    with pytest.raises(BusinessConditionFailed):
        rig.store.release(claim, other.undo)

    record = rig.store.get(f"ChargeRequested#{k}")
    assert record is not None and record.owner_token == claim.owner_token
    assert accounts.state(account) == (5000, True)


def test_an_optimistic_handler_with_a_guard_is_refused_at_start(make: Make, dynamodb_local: DynamoDBLocal) -> None:
    class Optimistic(ChargeHandler):
        mode: ClassVar[Mode] = Mode.OPTIMISTIC

    rig, billing, _ = make()
    settings = settings_for_tests(table_names=dict(rig.handler.table_names))
    with pytest.raises(ConfigurationError, match="defines a guard, which only lock mode runs"):
        LockRig(dynamodb_local, "unused", Optimistic(settings, billing), settings)


# -- no hold outlives its message --------------------------------------------------------------


def crashed_holding(make: Make, balance: int = 5000, **options: Any) -> tuple[LockRig, Billing, Accounts, str, str]:
    """A charge of 1000 whose worker died after its hold and before the call: the claim abandoned, the hold standing."""
    rig, billing, accounts = make(**options)
    account = accounts.open(balance)
    billing.fail_next("crash before the call")
    rig.crash(k := key(), {"accountId": account, "amountCents": 1000})
    assert accounts.state(account) == (balance, True)
    return rig, billing, accounts, account, k


def test_a_takeover_refused_by_its_guard_releases_the_abandoned_claim_and_its_hold(make: Make) -> None:
    rig, billing, accounts, account, k = crashed_holding(make, rule_always=True)
    accounts.debit(account, 4500)
    rig.advance_past_the_lease()

    result = rig.deliver(k, {"accountId": account, "amountCents": 1000}, receive_count=2)

    # The rule fails on the takeover; the dead worker's claim and hold go with the refusal, fenced, together.
    assert accounts.state(account) == (500, False)
    assert rig.store.get(f"ChargeRequested#{k}") is None
    assert result.outcome is Outcome.POISON
    assert ABANDONED_RELEASED in (result.reason or "")
    assert [letter["ErrorType"] for letter in rig.dead_letters.sent] == ["BusinessConditionFailed"]
    assert billing.calls == []
    # Nothing is left to refuse the account's other charges.
    assert rig.deliver(key(), {"accountId": account, "amountCents": 100}).outcome is Outcome.APPLIED


def test_a_takeover_refused_in_a_group_claim_releases_the_abandoned_claim_and_its_hold(make: Make) -> None:
    rig, billing, accounts, account, k = crashed_holding(make, rule_always=True)
    accounts.debit(account, 4500)
    rig.advance_past_the_lease()
    other = accounts.open(5000)

    refused, applied = rig.deliver_together(
        (k, {"accountId": account, "amountCents": 1000}, 2), (k2 := key(), {"accountId": other, "amountCents": 100}, 1)
    )

    # Grouped as alone: the refusal releases the dead worker's claim and hold; the other charge is its own.
    assert (refused.outcome, ABANDONED_RELEASED in (refused.reason or "")) == (Outcome.POISON, True)
    assert accounts.state(account) == (500, False)
    assert rig.store.get(f"ChargeRequested#{k}") is None
    assert applied.outcome is Outcome.APPLIED
    assert (billing.calls, accounts.state(other)) == ([k2], (4900, False))


def test_a_refused_takeover_whose_reservation_is_already_gone_still_releases_the_abandoned_claim(make: Make) -> None:
    rig, _, accounts, account, k = crashed_holding(make, rule_always=True)
    accounts.clear_hold(account)
    accounts.debit(account, 4500)
    rig.advance_past_the_lease()

    result = rig.deliver(k, {"accountId": account, "amountCents": 1000}, receive_count=2)

    assert rig.store.get(f"ChargeRequested#{k}") is None
    assert (result.outcome, ABANDONED_RELEASED in (result.reason or "")) == (Outcome.POISON, True)
    assert accounts.state(account) == (500, False)


def test_a_refused_takeover_releases_what_is_left_of_a_reservation_on_two_items(make: Make) -> None:
    rig, billing, accounts = make(rule_always=True)
    account, second = accounts.open(5000), accounts.open(0)
    guard = rig.handler.guard

    def on_two_accounts(payload: Any, context: MessageContext) -> Guard:
        built = guard(payload, context)
        assert built is not None
        table, token = rig.handler.table_names["AccountTable"], {":token": context.reservation_token}
        also = Update(table, {"id": second}, "SET holdToken = :token", condition="attribute_not_exists(holdToken)")
        undo = Update(table, {"id": second}, "REMOVE holdToken", condition="holdToken = :token")
        return Guard((*built.writes, replace(also, values=token)), (*built.undo, replace(undo, values=token)))

    rig.handler.guard = on_two_accounts  # type: ignore[method-assign]
    billing.fail_next("crash before the call")
    rig.crash(k := key(), charge := {"accountId": account, "amountCents": 1000})
    assert (accounts.state(account), accounts.state(second)) == ((5000, True), (0, True))
    accounts.clear_hold(account)
    accounts.debit(account, 4500)
    rig.advance_past_the_lease()

    result = rig.deliver(k, charge, receive_count=2)

    # The first account's part is gone already; the second's is released with the claim, not left behind.
    assert (accounts.state(account), accounts.state(second)) == ((500, False), (0, False))
    assert rig.store.get(f"ChargeRequested#{k}") is None
    assert (result.outcome, ABANDONED_RELEASED in (result.reason or "")) == (Outcome.POISON, True)


def test_a_refused_takeover_leaves_alone_a_claim_another_worker_took_over_meanwhile(
    make: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig, _, accounts, account, k = crashed_holding(make, rule_always=True)
    accounts.debit(account, 4500)
    rig.advance_past_the_lease()
    record_id = f"ChargeRequested#{k}"
    abandoned = rig.store.get(record_id)
    assert abandoned is not None
    newer: list[object] = []

    def read_then_lose_the_race(table: Table, found_id: str) -> IdempotencyRecord | None:
        # The record as this worker read it; another takes the key over before the release is sent.
        newer.append(IdempotencyStore.claim(rig.store, record_id, abandoned.payload_hash, LEASE_MS))
        return abandoned

    # The claim's own read of the abandoned record (``Table`` is frozen: patched on its class, undone below).
    monkeypatch.setattr(Table, "get", read_then_lose_the_race)

    result = rig.deliver(k, {"accountId": account, "amountCents": 1000}, receive_count=2)

    monkeypatch.undo()
    (owner,) = newer
    assert isinstance(owner, Claimed)
    current = rig.store.get(record_id)
    assert current is not None and current.owner_token == owner.owner_token
    assert accounts.state(account) == (500, True)
    assert result.outcome is Outcome.POISON and ABANDONED_RELEASED not in (result.reason or "")


def test_a_refused_takeover_whose_release_is_throttled_is_retried_with_its_reservation_standing(make: Make) -> None:
    rig, _, accounts, account, k = crashed_holding(make, rule_always=True)
    accounts.debit(account, 4500)
    rig.advance_past_the_lease()
    Refusals(rig, release, 1, error="ProvisionedThroughputExceededException")

    result = rig.deliver(k, {"accountId": account, "amountCents": 1000}, receive_count=2)

    assert result.outcome is Outcome.RETRIED
    assert rig.dead_letters.sent == []
    assert accounts.state(account) == (500, True)
    # The next delivery settles it.
    assert rig.deliver(k, {"accountId": account, "amountCents": 1000}, receive_count=3).outcome is Outcome.POISON
    assert accounts.state(account) == (500, False)


def test_a_refused_takeover_whose_release_meets_conflicts_until_out_of_time_is_retried(make: Make) -> None:
    rig, _, accounts, account, k = crashed_holding(make, rule_always=True)
    accounts.debit(account, 4500)
    rig.advance_past_the_lease()
    conflicts = Refusals(rig, release, 5, reasons=("None", "TransactionConflict"))

    # No time beyond the margin: the first conflict is the last try.
    result = rig.deliver(k, {"accountId": account, "amountCents": 1000}, receive_count=2, remaining_ms=1_000)

    assert conflicts.left == 4
    assert result.outcome is Outcome.RETRIED
    assert "could not be released" in (result.reason or "")
    assert rig.dead_letters.sent == []
    assert accounts.state(account) == (500, True)


def test_a_poison_whose_release_meets_conflicts_past_the_attempt_limit_is_released_before_its_dead_letter(
    make: Make,
) -> None:
    rig, billing, accounts = make()
    account = accounts.open(5000)
    billing.fail_next("rejected")
    # More than the rig's 10 attempts: the release keeps trying while the invocation lasts, as the commit does.
    conflicts = Refusals(rig, release, 12, reasons=("None", "TransactionConflict"))

    result = rig.deliver(k := key(), {"accountId": account, "amountCents": 1000})

    assert conflicts.left == 0
    assert accounts.state(account) == (5000, False)
    assert rig.store.get(f"ChargeRequested#{k}") is None
    assert result.outcome is Outcome.POISON
    assert [letter["ErrorType"] for letter in rig.dead_letters.sent] == ["WebhookRejected"]


def test_a_poison_whose_release_fails_is_retried_with_its_reason_until_a_release_lands(make: Make) -> None:
    rig, billing, accounts = make()
    account = accounts.open(5000)
    charge = {"accountId": account, "amountCents": 1000}
    billing.fail_next("rejected", "rejected")
    Refusals(rig, release, 1, error="ProvisionedThroughputExceededException")

    first = rig.deliver(k := key(), charge)

    # Its hold stands: the message stays in the queue, the only one that can settle it.
    assert first.outcome is Outcome.RETRIED
    assert "release failed" in (first.reason or "") and "WebhookRejected: HTTP 422" in (first.reason or "")
    assert rig.dead_letters.sent == []
    assert accounts.state(account) == (5000, True)

    rig.advance_past_the_lease()
    assert rig.deliver(k, charge, receive_count=2).outcome is Outcome.POISON
    assert accounts.state(account) == (5000, False)
    assert rig.store.get(f"ChargeRequested#{k}") is None
    assert [letter["ErrorType"] for letter in rig.dead_letters.sent] == ["WebhookRejected"]
    assert billing.calls == [k, k]


def test_a_charge_meeting_the_hold_of_another_message_waits_and_is_not_dead_lettered(make: Make) -> None:
    rig, billing, accounts, account, k = crashed_holding(make)

    waiting = {"accountId": account, "amountCents": 100}
    result = rig.deliver(later := key(), waiting)

    assert result.outcome is Outcome.RETRIED
    assert (result.reason or "").startswith(f"{BUSY}: balance of {account} below 100 cents, or held by another charge")
    assert rig.dead_letters.sent == []
    assert billing.calls == []
    assert accounts.state(account) == (5000, True)
    # Once the hold is settled (the first charge's takeover), the waiting charge applies.
    rig.advance_past_the_lease()
    assert rig.deliver(k, {"accountId": account, "amountCents": 1000}, receive_count=2).outcome is Outcome.APPLIED
    assert rig.deliver(later, waiting, receive_count=2).outcome is Outcome.APPLIED
    assert accounts.state(account) == (3900, False)
    assert billing.calls == [k, later]


def test_the_same_key_with_other_content_after_its_record_expired_does_not_pass_the_old_hold(make: Make) -> None:
    rig, billing, accounts, account, k = crashed_holding(make)
    rig.advance_past_the_record()

    result = rig.deliver(k, {"accountId": account, "amountCents": 9000})

    assert billing.calls == []
    assert accounts.state(account) == (5000, True)
    assert result.outcome is not Outcome.APPLIED


class ChargeRetried(ChargeHandler):
    """Another event type on the same accounts, its keys chosen by another producer."""

    event_type: ClassVar[str] = "ChargeRetried"


def test_another_event_type_reusing_a_held_key_does_not_pass_the_hold(make: Make) -> None:
    rig, billing, accounts, account, k = crashed_holding(make)
    other, other_billing, _ = make(handler=ChargeRetried)

    result = other.deliver(k, {"accountId": account, "amountCents": 1000})

    assert other_billing.calls == []
    assert accounts.state(account) == (5000, True)
    assert result.outcome is not Outcome.APPLIED
    # The hold's own message still settles it.
    rig.advance_past_the_lease()
    assert rig.deliver(k, {"accountId": account, "amountCents": 1000}, receive_count=2).outcome is Outcome.APPLIED
    assert accounts.state(account) == (4000, False)
    assert billing.calls == [k]


def test_a_conflict_on_the_record_beside_a_failed_guard_condition_is_retried_not_refused(make: Make) -> None:
    rig, billing, accounts = make()
    account = accounts.open(5000)
    mixed = Refusals(rig, claim, 1, reasons=("TransactionConflict", "ConditionalCheckFailed"))

    result = rig.deliver(k := key(), {"accountId": account, "amountCents": 1000})

    assert mixed.left == 0
    assert result.outcome is Outcome.APPLIED
    assert billing.calls == [k]
    assert rig.dead_letters.sent == []


def test_a_guard_with_two_actions_on_one_item_is_dead_lettered_at_once_as_the_handlers_mistake(make: Make) -> None:
    rig, billing, accounts = make()
    account = accounts.open(5000)
    guard = rig.handler.guard
    twice = ConditionCheck(rig.handler.table_names["AccountTable"], {"id": account}, "attribute_exists(id)")

    def doubled(payload: Any, context: MessageContext) -> Guard:
        built = guard(payload, context)
        assert built is not None
        return Guard((*built.writes, twice), built.undo)

    rig.handler.guard = doubled  # type: ignore[method-assign]

    result = rig.deliver(k := key(), {"accountId": account, "amountCents": 1000})

    assert result.outcome is Outcome.POISON
    assert [letter["ErrorType"] for letter in rig.dead_letters.sent] == ["InvalidHandlerTransaction"]
    assert "one item" in rig.dead_letters.sent[0]["ErrorMessage"]
    assert billing.calls == []
    assert rig.store.get(f"ChargeRequested#{k}") is None


def test_another_rejection_of_a_guarded_claim_is_retried_not_blamed_on_the_handler(make: Make) -> None:
    rig, billing, accounts = make()
    account = accounts.open(5000)
    Refusals(rig, claim, 1, error="ValidationException")

    result = rig.deliver(k := key(), {"accountId": account, "amountCents": 1000})

    # Not a shape DynamoDB can never take: it may be the core's own request (or a proxy's), so it is retried.
    assert result.outcome is Outcome.RETRIED
    assert rig.dead_letters.sent == []
    assert rig.deliver(k, {"accountId": account, "amountCents": 1000}, receive_count=2).outcome is Outcome.APPLIED
    assert billing.calls == [k]


def test_an_effect_over_the_item_limit_is_dead_lettered_at_once_and_its_claim_released(make: Make) -> None:
    rig, billing, accounts = make()
    account = accounts.open(5000)
    handle = rig.handler.handle
    table = rig.handler.table_names["AccountTable"]

    def too_many(payload: Any, context: MessageContext) -> Effect:
        effect = handle(payload, context)
        extra = [Update(table, {"id": f"extra-{n}"}, "SET n = :n", values={":n": n}) for n in range(99)]
        return Effect(effect.result, (*effect.writes, *extra))

    rig.handler.handle = too_many  # type: ignore[method-assign]

    result = rig.deliver(k := key(), {"accountId": account, "amountCents": 1000})

    assert result.outcome is Outcome.POISON
    assert [letter["ErrorType"] for letter in rig.dead_letters.sent] == ["InvalidHandlerTransaction"]
    assert "at most 99" in rig.dead_letters.sent[0]["ErrorMessage"]
    assert billing.calls == [k]
    assert accounts.state(account) == (5000, False)
    assert rig.store.get(f"ChargeRequested#{k}") is None


# -- the lanes' first messages as a group ------------------------------------------------------
#
# Each delivery runs on a thread of its own, all joined to the store's group commit before any starts: their claims
# share one transaction by construction. Each commits as soon as its own handler ends, with whichever others are
# ready then (or alone), so the commits' grouping is the scheduler's: it is tested at the store, transition by
# transition, where every commit is ready at once.


def charges(accounts: Accounts, count: int) -> list[tuple[str, dict[str, Any], int]]:
    """``count`` first deliveries of a charge of 1000, each on an account of its own holding 5000."""
    return [(key(), {"accountId": accounts.open(5000), "amountCents": 1000}, 1) for _ in range(count)]


def sizes(rig: LockRig) -> list[int]:
    """The number of items of each TransactWriteItems the rig's store sends (a planted answer's too)."""
    seen: list[int] = []
    event = "before-parameter-build.dynamodb.TransactWriteItems"
    rig.dynamodb.meta.events.register(event, lambda params, **_: seen.append(len(params["TransactItems"])))
    return seen


def all_charged(
    rig: LockRig, billing: Billing, accounts: Accounts, sent: list[tuple[str, dict[str, Any], int]]
) -> None:
    assert sorted(billing.calls) == sorted(k for k, _, _ in sent)
    assert [accounts.state(charge["accountId"]) for _, charge, _ in sent] == [(4000, False)] * len(sent)
    assert rig.dead_letters.sent == []


def claims_then_commits(seen: list[int], claims: list[int], messages: int) -> None:
    """The claims' transactions first, as planted (every commit waits for the claims still in flight), the group's
    first and then the others in either order (one settled alone goes at once, beside the rest sent again); then the
    commits', in whatever grouping their handlers' ends made: a record and a settled hold each, in as many
    transactions as messages at most."""
    assert seen[0] == claims[0] and sorted(seen[1 : len(claims)]) == sorted(claims[1:])
    commits = seen[len(claims) :]
    assert sum(commits) == 2 * messages and len(commits) <= messages


@pytest.mark.parametrize(
    ("planted", "claims"),
    [
        # The second message's record met a conflict: it is claimed alone, the other two again together.
        (("None", "None", "TransactionConflict", "None", "None", "None"), [6, 4, 2]),
        # Cancelled with no item named: the same group would be cancelled again, so each is claimed alone.
        (("None",) * 6, [6, 2, 2, 2]),
    ],
    ids=["conflict-named", "nothing-named"],
)
def test_a_cancelled_group_claim_claims_the_named_alone_and_the_rest_again(
    make: Make, planted: tuple[str, ...], claims: list[int]
) -> None:
    rig, billing, accounts = make()
    sent = charges(accounts, 3)
    seen = sizes(rig)
    Refusals(rig, claim, 1, reasons=planted)

    assert [result.outcome for result in rig.deliver_together(*sent)] == [Outcome.APPLIED] * 3

    all_charged(rig, billing, accounts, sent)
    claims_then_commits(seen, claims, 3)


def test_a_throttled_group_claim_sends_each_message_alone(make: Make) -> None:
    rig, billing, accounts = make()
    sent = charges(accounts, 3)
    seen = sizes(rig)
    Refusals(rig, claim, 1, error="ProvisionedThroughputExceededException")

    assert [result.outcome for result in rig.deliver_together(*sent)] == [Outcome.APPLIED] * 3

    all_charged(rig, billing, accounts, sent)
    claims_then_commits(seen, [6, 2, 2, 2], 3)


class Ready:
    """A charge of 1000 on an account of its own (holding 5000), claimed with its hold: its commit, as its
    handler's effect makes it."""

    def __init__(self, account: str, commit: Commit) -> None:
        self.account = account
        self.commit = commit


def claimed_together(rig: LockRig, accounts: Accounts, count: int) -> list[Ready]:
    """``count`` charges claimed with their holds as the processor claims them when all are ready at once: in one
    shared transaction."""
    charged = [(accounts.open(5000), key()) for _ in range(count)]
    requests = []
    for account, k in charged:
        guard = hold(rig, account, k)
        requests.append(ClaimRequest(f"ChargeRequested#{k}", "h", LEASE_MS, tuple(guard.writes), tuple(guard.undo)))
    answers = together(rig.store, [Claim(request, str(uuid.uuid4())) for request in requests], lambda: REMAINING_MS)
    ready = []
    for (account, k), answer in zip(charged, answers, strict=True):
        assert isinstance(answer, Claimed), answer
        effect = rig.handler.handle(Charge(accountId=account, amountCents=1000), context(k))
        ready.append(Ready(account, Commit(answer, effect.result, tuple(effect.writes))))
    return ready


def committed_together(rig: LockRig, accounts: Accounts, ready: list[Ready]) -> list[object]:
    """The commits run together, as handlers ending at once commit them: each one's answer, once each charge is
    seen settled (its record completed, its account charged and its hold gone)."""
    answers = together(rig.store, [charge.commit for charge in ready], lambda: REMAINING_MS)
    for charge in ready:
        record = rig.store.get(charge.commit.claim.record_id)
        assert record is not None and record.status is Status.COMPLETED
        assert accounts.state(charge.account) == (4000, False)
    return answers


def test_a_throttled_group_commit_commits_each_message_alone(make: Make) -> None:
    rig, _, accounts = make()
    seen = sizes(rig)
    claimed = claimed_together(rig, accounts, 3)
    Refusals(rig, commit, 1, error="ProvisionedThroughputExceededException")

    assert committed_together(rig, accounts, claimed) == [Committed()] * 3
    assert seen == [6, 6, 2, 2, 2]


def test_a_group_commit_cancelled_by_a_conflict_commits_the_named_alone_and_the_rest_again(make: Make) -> None:
    rig, _, accounts = make()
    seen = sizes(rig)
    claimed = claimed_together(rig, accounts, 3)
    Refusals(rig, commit, 1, reasons=("None", "None", "TransactionConflict", "None", "None", "None"))

    assert committed_together(rig, accounts, claimed) == [Committed()] * 3
    # The named one alone at once, beside the rest sent again: in either order.
    assert seen[:2] == [6, 6] and sorted(seen[2:]) == [2, 4]


def test_a_guard_failing_in_a_group_is_its_messages_alone(make: Make) -> None:
    rig, billing, accounts = make()
    sent = charges(accounts, 3)
    guard = rig.handler.guard
    stray = Update("NotDeclared", {"id": "x"}, "SET a = :a", values={":a": 1})

    def stray_for_the_second(payload: Charge, context: MessageContext) -> Guard | None:
        return Guard(writes=(stray,)) if context.idempotency_key == sent[1][0] else guard(payload, context)

    rig.handler.guard = stray_for_the_second  # type: ignore[method-assign]

    results = rig.deliver_together(*sent)

    assert [result.outcome for result in results] == [Outcome.APPLIED, Outcome.RETRIED, Outcome.APPLIED]
    assert "NotDeclared" in (results[1].reason or "")
    assert sorted(billing.calls) == sorted([sent[0][0], sent[2][0]])
    assert rig.store.get(f"ChargeRequested#{sent[1][0]}") is None


def test_a_rejected_call_in_a_group_dead_letters_its_message_once_released_and_the_others_commit(make: Make) -> None:
    rig, billing, accounts = make()
    sent = charges(accounts, 3)
    billing.fail_for(sent[0][0], "rejected")  # by key: the handlers run side by side, in no set order

    results = rig.deliver_together(*sent)

    assert [result.outcome for result in results] == [Outcome.POISON, Outcome.APPLIED, Outcome.APPLIED]
    assert [letter["ErrorType"] for letter in rig.dead_letters.sent] == ["WebhookRejected"]
    assert accounts.state(sent[0][1]["accountId"]) == (5000, False)
    assert rig.store.get(f"ChargeRequested#{sent[0][0]}") is None
    assert [accounts.state(charge["accountId"]) for _, charge, _ in sent[1:]] == [(4000, False)] * 2
