"""SubscriptionRenewed (lock): charge a renewal through a billing endpoint, only if the paid-up period moves forward.

The charge leaves DynamoDB, so the rule must hold before it, not only at the commit: the guard,
committed in one transaction with the claim, requires the new period to be later than the paid
one and marks the renewal pending with this message's reservation token. A renewal that would
move the period backwards is dead-lettered (``BusinessConditionFailed``) and billing is never
called, on its first delivery or a redrive. The commit sets the period and clears the mark; a
failure before it clears the mark with the release; a worker that dies leaves the mark, and the
redelivery that takes its claim over passes the guard with it (same message, same token) and
settles it.

What stays at-least-once: a crash after the charge and before the commit charges again, with
the same ``Idempotency-Key``, which billing must honour. While one renewal of a subscription is
pending, another waits: it comes back with the retry backoff (``held_by``) rather than being
refused, so renewals of one subscription are serial.

Not registered: to use it, add it to ``HANDLERS``, a ``SubscriptionTable`` keyed by
``subscriptionId`` (S) to template.yaml with its variable and grants (the checklist in
docs/tables.md), and its settings (``BillingSettings``: ``BILLING_WEBHOOK_URL``, and
``BILLING_SECRET_ARN`` beyond loopback; docs/settings.md). Tests:
``tests/app/test_subscription_renewed.py``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, StrictInt

from consumer.api import (
    ID_PATTERN,
    Effect,
    Guard,
    HandlerSettings,
    MessageContext,
    MessageHandler,
    Mode,
    SecretArn,
    Settings,
    SigningKey,
    Update,
    WebhookClient,
)


class SubscriptionRenewed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    subscriptionId: str = Field(pattern=ID_PATTERN)
    # The period paid up to after this renewal, e.g. 202407 for July 2024.
    paidThrough: StrictInt = Field(gt=0, le=999_999)
    amountCents: StrictInt = Field(gt=0, le=10**9)


class BillingSettings(HandlerSettings):
    # Where renewals are charged (BILLING_WEBHOOK_URL): required, a renewal has nowhere else to go.
    billing_webhook_url: str = Field(min_length=1)
    # The whole charge's deadline (BILLING_TIMEOUT_MS), never beyond the lease.
    billing_timeout_ms: PositiveInt = 5_000
    # The secret that signs the charges (BILLING_SECRET_ARN): beyond loopback the client refuses to start without it.
    billing_secret_arn: SecretArn = ""


class SubscriptionRenewedHandler(MessageHandler[SubscriptionRenewed]):
    event_type: ClassVar[str] = "SubscriptionRenewed"
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = SubscriptionRenewed
    tables: ClassVar[tuple[str, ...]] = ("SubscriptionTable",)
    settings_model: ClassVar[type[HandlerSettings]] = BillingSettings

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        own = settings.of(BillingSettings)
        self._timeout_ms = own.billing_timeout_ms
        key = SigningKey(own.billing_secret_arn) if own.billing_secret_arn else None
        self._billing = WebhookClient(own.billing_webhook_url, "BILLING_WEBHOOK_URL", signing_key=key)

    def contention_key(self, payload: SubscriptionRenewed) -> str:
        return f"SubscriptionTable/{payload.subscriptionId}"

    def _write(self, payload: SubscriptionRenewed, context: MessageContext, expression: str, condition: str) -> Update:
        values = {":token": context.reservation_token, ":through": payload.paidThrough}
        return Update(
            table=self.table_names["SubscriptionTable"],
            key={"subscriptionId": payload.subscriptionId},
            expression=expression,
            condition=condition,
            # DynamoDB refuses a value the expressions do not use.
            values={name: value for name, value in values.items() if name in expression + condition},
            reason=(
                f"renewal of {payload.subscriptionId} through {payload.paidThrough} would not move its paid-up"
                " period forward, or another renewal of it is pending"
            ),
        )

    def guard(self, payload: SubscriptionRenewed, context: MessageContext) -> Guard:
        reserve = replace(
            self._write(
                payload,
                context,
                "SET pendingToken = :token, pendingThrough = :through",
                # The rule where nothing is pending; its own mark passes whatever the period says now: the
                # redelivery that takes a dead worker's claim over settles the mark it left.
                "(attribute_not_exists(pendingToken) AND (attribute_not_exists(paidThrough) OR paidThrough < :through))"
                " OR pendingToken = :token",
            ),
            # Another renewal's mark: busy, so this one comes back later instead of being refused.
            held_by="pendingToken",
        )
        undo = self._write(payload, context, "REMOVE pendingToken, pendingThrough", "pendingToken = :token")
        return Guard(writes=(reserve,), undo=(undo,))

    def handle(self, payload: SubscriptionRenewed, context: MessageContext) -> Effect:
        # Never outlive the lease: past it another worker may already be charging.
        deadline_s = max(0.1, min(self._timeout_ms, context.remaining_ms()) / 1000)
        body = json.dumps(payload.model_dump(mode="json")).encode("utf-8")
        status = self._billing.post(body, context.idempotency_key, deadline_s).status
        settle = self._write(
            payload,
            context,
            "SET paidThrough = :through REMOVE pendingToken, pendingThrough",
            "pendingToken = :token",
        )
        return Effect(result={"paidThrough": payload.paidThrough, "billingStatus": status}, writes=(settle,))
