"""The renewal example's trial, on DynamoDB Local and a billing sink on loopback.

A renewal whose period would move backwards charges nothing, on delivery or redrive; an
accepted one charges once and commits; a transient failure releases the claim and the pending
mark together; a crash after the mark is taken over and settled. The negative control runs
the refused renewal with the guard switched off and sees billing called.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from consumer.handler import MessageHandler
from consumer.idempotency.record import Status
from consumer.outcome import Outcome
from examples.subscription_renewed import SubscriptionRenewedHandler
from testkit.dynamodb_local import DynamoDBLocal
from testkit.webhook import Answer, WebhookSink
from tests.conftest import TableFactory
from tests.lock_rig import Crash, LockRig
from tests.utils import settings_for_tests


@pytest.fixture(scope="module")
def subscriptions(dynamodb_local: DynamoDBLocal) -> Iterator[str]:
    name = f"subscriptions-{uuid.uuid4().hex[:8]}"
    client = dynamodb_local.client()
    client.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "subscriptionId", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "subscriptionId", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    yield name
    client.delete_table(TableName=name)


class Trial:
    def __init__(self, dynamodb_local: DynamoDBLocal, records: str, subscriptions: str, billing: WebhookSink) -> None:
        self.table = subscriptions
        settings = settings_for_tests(table_names={"SubscriptionTable": self.table}).model_copy(
            update={"handler_variables": {"BILLING_WEBHOOK_URL": f"{billing.url}/billing"}}
        )
        self.handler = SubscriptionRenewedHandler(settings)
        self.rig = LockRig(dynamodb_local, records, self.handler, settings)
        self.billing = billing
        self.subscription = f"sub-{uuid.uuid4().hex[:8]}"
        self.rig.dynamodb.put_item(
            TableName=self.table,
            Item={"subscriptionId": {"S": self.subscription}, "paidThrough": {"N": "202406"}},
        )

    def renew(self, key: str, through: int, receive_count: int = 1) -> Outcome:
        payload = {"subscriptionId": self.subscription, "paidThrough": through, "amountCents": 990}
        return self.rig.deliver(key, payload, receive_count).outcome

    def state(self) -> tuple[int, bool]:
        """The paid-up period, and whether a renewal is pending on it."""
        item = self.rig.item(self.table, {"subscriptionId": {"S": self.subscription}})
        assert item is not None
        return int(item["paidThrough"]["N"]), "pendingToken" in item

    def record_status(self, key: str) -> Status | None:
        record = self.rig.store.get(f"SubscriptionRenewed#{key}")
        return None if record is None else record.status


@pytest.fixture
def trial(
    dynamodb_local: DynamoDBLocal,
    id_table: TableFactory,
    subscriptions: str,
    webhook: WebhookSink,
) -> Trial:
    # Records of their own: every trial uses the same keys.
    return Trial(dynamodb_local, id_table("renewal-records"), subscriptions, webhook)


def refused_renewal(trial: Trial) -> list[str | None]:
    """A renewal back to 202405 of a subscription paid through 202406, delivered and redriven."""
    assert trial.renew("renew-back", 202405) is Outcome.POISON
    assert trial.renew("renew-back", 202405) is Outcome.POISON
    letters = trial.rig.dead_letters.sent
    assert [letter["ErrorType"] for letter in letters] == ["BusinessConditionFailed"] * 2
    assert trial.state() == (202406, False)
    assert trial.record_status("renew-back") is None
    return trial.billing.keys()


def test_a_renewal_that_would_move_the_period_back_charges_nothing(trial: Trial) -> None:
    assert refused_renewal(trial) == []
    reason = trial.rig.dead_letters.sent[0]["ErrorMessage"]
    assert f"renewal of {trial.subscription} through 202405 would not move its paid-up period forward" in reason


def test_negative_control_without_the_guard_the_refused_renewal_is_charged(
    trial: Trial, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SubscriptionRenewedHandler, "guard", MessageHandler.guard)
    assert refused_renewal(trial) == ["renew-back", "renew-back"]


def test_an_accepted_renewal_charges_once_and_commits(trial: Trial) -> None:
    assert trial.renew("renew-07", 202407) is Outcome.APPLIED
    assert trial.billing.keys() == ["renew-07"]
    assert trial.state() == (202407, False)
    assert trial.record_status("renew-07") is Status.COMPLETED
    assert trial.renew("renew-07", 202407) is Outcome.DUPLICATE
    assert trial.billing.keys() == ["renew-07"]


def test_a_transient_failure_releases_the_claim_and_the_pending_mark_together(trial: Trial) -> None:
    trial.billing.answer_next(Answer(status=503))
    assert trial.renew("renew-07", 202407) is Outcome.RETRIED
    assert trial.record_status("renew-07") is None
    assert trial.state() == (202406, False)

    assert trial.renew("renew-07", 202407, receive_count=2) is Outcome.APPLIED
    assert trial.billing.keys() == ["renew-07", "renew-07"]
    assert trial.state() == (202407, False)


def test_a_crash_after_the_mark_is_taken_over_and_settled(trial: Trial, monkeypatch: pytest.MonkeyPatch) -> None:
    post = trial.handler._billing.post

    def charge_then_die(*args: Any, **kwargs: Any) -> int:
        post(*args, **kwargs)
        raise Crash

    monkeypatch.setattr(trial.handler._billing, "post", charge_then_die)
    with pytest.raises(Crash):
        trial.renew("renew-07", 202407)
    assert trial.state() == (202406, True)
    monkeypatch.undo()

    assert trial.renew("renew-07", 202407, receive_count=2) is Outcome.IN_FLIGHT
    trial.rig.advance_past_the_lease()
    assert trial.renew("renew-07", 202407, receive_count=3) is Outcome.APPLIED
    # At-least-once across the crash: charged again, with the same key for billing to recognise.
    assert trial.billing.keys() == ["renew-07", "renew-07"]
    assert trial.state() == (202407, False)
    assert trial.record_status("renew-07") is Status.COMPLETED


def test_a_renewal_meeting_another_pending_one_waits_and_applies_once_it_is_settled(
    trial: Trial, monkeypatch: pytest.MonkeyPatch
) -> None:
    def die(*args: Any, **kwargs: Any) -> int:
        raise Crash

    monkeypatch.setattr(trial.handler._billing, "post", die)
    with pytest.raises(Crash):
        trial.renew("renew-07", 202407)
    monkeypatch.undo()

    assert trial.renew("renew-08", 202408) is Outcome.RETRIED
    assert trial.rig.dead_letters.sent == []
    assert trial.billing.keys() == []

    trial.rig.advance_past_the_lease()
    assert trial.renew("renew-07", 202407, receive_count=2) is Outcome.APPLIED
    assert trial.renew("renew-08", 202408, receive_count=2) is Outcome.APPLIED
    assert trial.billing.keys() == ["renew-07", "renew-08"]
    assert trial.state() == (202408, False)
