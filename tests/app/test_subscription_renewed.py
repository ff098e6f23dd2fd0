"""The renewal example's trial, with the test kit alone: moto, a clock the test moves, and a billing API on loopback.

A renewal whose period would move backwards charges nothing, on delivery or redrive; an
accepted one charges once and commits; a transient failure releases the claim and the pending
mark together; a crash after the mark is taken over and settled. The negative control runs
the refused renewal with the guard switched off and sees billing called.
"""

from __future__ import annotations

from typing import Any

import pytest

from consumer.api import MessageHandler
from examples.subscription_renewed import SubscriptionRenewedHandler
from tests.kit import (
    Answer,
    Clock,
    Consumer,
    Crash,
    Outcome,
    WebhookSink,
    consumer_of,
    envelope,
    settings_for,
    sqs_record,
)

TABLE = "subscriptions"
SUBSCRIPTION = "sub-1"


class Trial:
    def __init__(self, dynamodb: Any, sqs: Any, clock: Clock, billing: WebhookSink) -> None:
        # Not in template.yaml (the example is not registered), so made here with the keys the handler writes.
        dynamodb.create_table(
            TableName=TABLE,
            AttributeDefinitions=[{"AttributeName": "subscriptionId", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "subscriptionId", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        dynamodb.put_item(TableName=TABLE, Item={"subscriptionId": {"S": SUBSCRIPTION}, "paidThrough": {"N": "202406"}})
        settings = settings_for(
            [SubscriptionRenewedHandler],
            tables={"SubscriptionTable": TABLE},
            billing_webhook_url=f"{billing.url}/billing",
        )
        self.handler = SubscriptionRenewedHandler(settings)
        self.consumer: Consumer = consumer_of(dynamodb, sqs, clock, {"SubscriptionRenewed": self.handler}, settings)
        self.dynamodb = dynamodb
        self.clock = clock
        self.billing = billing

    def renew(self, key: str, through: int, receive_count: int = 1) -> Outcome:
        payload = {"subscriptionId": SUBSCRIPTION, "paidThrough": through, "amountCents": 990}
        body = envelope("SubscriptionRenewed", key, payload)
        (outcome,) = self.consumer.outcomes([sqs_record(f"m-{key}", body, receive_count=receive_count)])
        return outcome

    def past_the_lease(self) -> None:
        # A claim's lease ends before the invocation's remaining time (the kit's Remaining) does.
        self.clock.advance(self.consumer.remaining.ms / 1000 + 1)

    def state(self) -> tuple[int, bool]:
        """The paid-up period, and whether a renewal is pending on it."""
        key = {"subscriptionId": {"S": SUBSCRIPTION}}
        item = self.dynamodb.get_item(TableName=TABLE, Key=key, ConsistentRead=True)["Item"]
        return int(item["paidThrough"]["N"]), "pendingToken" in item


@pytest.fixture
def trial(dynamodb: Any, sqs: Any, clock: Clock, api_sink: WebhookSink) -> Trial:
    return Trial(dynamodb, sqs, clock, api_sink)


def refused_renewal(trial: Trial) -> list[str | None]:
    """A renewal back to 202405 of a subscription paid through 202406, delivered and redriven: dead-lettered both
    times (a claim left behind would make the redrive wait instead), nothing pending. The letters' reasons."""
    assert trial.renew("renew-back", 202405) is Outcome.POISON
    assert trial.renew("renew-back", 202405, receive_count=2) is Outcome.POISON
    letters = trial.consumer.dead_letters()
    assert [letter.error_type for letter in letters] == ["BusinessConditionFailed"] * 2
    assert trial.state() == (202406, False)
    return [letter.error_message for letter in letters]


def test_a_renewal_that_would_move_the_period_back_charges_nothing(trial: Trial) -> None:
    reason = refused_renewal(trial)[0]
    assert trial.billing.keys() == []
    assert f"renewal of {SUBSCRIPTION} through 202405 would not move its paid-up period forward" in str(reason)


def test_negative_control_without_the_guard_the_refused_renewal_is_charged(
    trial: Trial, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SubscriptionRenewedHandler, "guard", MessageHandler.guard)
    refused_renewal(trial)
    assert trial.billing.keys() == ["renew-back", "renew-back"]


def test_an_accepted_renewal_charges_once_and_commits(trial: Trial) -> None:
    assert trial.renew("renew-07", 202407) is Outcome.APPLIED
    assert trial.billing.keys() == ["renew-07"]
    assert trial.state() == (202407, False)
    assert trial.renew("renew-07", 202407, receive_count=2) is Outcome.DUPLICATE
    assert trial.billing.keys() == ["renew-07"]


def test_a_transient_failure_releases_the_claim_and_the_pending_mark_together(trial: Trial) -> None:
    trial.billing.answer_next(Answer(status=503))
    assert trial.renew("renew-07", 202407) is Outcome.RETRIED
    assert trial.state() == (202406, False)

    # Released, not left to its lease: the redelivery applies at once.
    assert trial.renew("renew-07", 202407, receive_count=2) is Outcome.APPLIED
    assert trial.billing.keys() == ["renew-07", "renew-07"]
    assert trial.state() == (202407, False)


def test_a_crash_after_the_mark_is_taken_over_and_settled(trial: Trial, monkeypatch: pytest.MonkeyPatch) -> None:
    post = trial.handler._billing.post

    def charge_then_die(*args: Any, **kwargs: Any) -> Any:
        post(*args, **kwargs)
        raise Crash

    monkeypatch.setattr(trial.handler._billing, "post", charge_then_die)
    with pytest.raises(Crash):
        trial.renew("renew-07", 202407)
    assert trial.state() == (202406, True)
    monkeypatch.undo()

    assert trial.renew("renew-07", 202407, receive_count=2) is Outcome.IN_FLIGHT
    trial.past_the_lease()
    assert trial.renew("renew-07", 202407, receive_count=3) is Outcome.APPLIED
    # At-least-once across the crash: charged again, with the same key for billing to recognise.
    assert trial.billing.keys() == ["renew-07", "renew-07"]
    assert trial.state() == (202407, False)
    assert trial.renew("renew-07", 202407, receive_count=4) is Outcome.DUPLICATE


def test_a_renewal_meeting_another_pending_one_waits_and_applies_once_it_is_settled(
    trial: Trial, monkeypatch: pytest.MonkeyPatch
) -> None:
    def die(*args: Any, **kwargs: Any) -> Any:
        raise Crash

    monkeypatch.setattr(trial.handler._billing, "post", die)
    with pytest.raises(Crash):
        trial.renew("renew-07", 202407)
    monkeypatch.undo()

    assert trial.renew("renew-08", 202408) is Outcome.RETRIED
    assert trial.consumer.dead_letters() == []
    assert trial.billing.keys() == []

    trial.past_the_lease()
    assert trial.renew("renew-07", 202407, receive_count=2) is Outcome.APPLIED
    assert trial.renew("renew-08", 202408, receive_count=2) is Outcome.APPLIED
    assert trial.billing.keys() == ["renew-07", "renew-08"]
    assert trial.state() == (202408, False)
