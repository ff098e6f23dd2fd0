"""WebhookClient is secure by default: beyond loopback, no unsigned call, unless the handler says so by name."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

from consumer.api import (
    ConfigurationError,
    Effect,
    HandlerSettings,
    MessageContext,
    MessageHandler,
    Mode,
    Settings,
    WebhookClient,
)

BEYOND_LOOPBACK = "https://billing.example.com/charge"
ENV = {"IDEMPOTENCY_TABLE_NAME": "i", "DEAD_LETTER_QUEUE_URL": "https://q"}


def test_beyond_loopback_without_a_signing_key_is_refused_at_construction() -> None:
    with pytest.raises(ConfigurationError, match=r"BILLING_URL beyond loopback needs a signing key .*allow_unsigned"):
        WebhookClient(BEYOND_LOOPBACK, "BILLING_URL")


@pytest.mark.parametrize(
    "made",
    [
        lambda: WebhookClient(BEYOND_LOOPBACK, "BILLING_URL", signing_key=lambda: (bytes(32),)),
        lambda: WebhookClient(BEYOND_LOOPBACK, "BILLING_URL", allow_unsigned=True),
        lambda: WebhookClient("http://127.0.0.1:8080/hook", "BILLING_URL"),
        lambda: WebhookClient("http://localhost/hook", "BILLING_URL"),
    ],
    ids=["signed", "opted-out", "loopback-ip", "localhost"],
)
def test_a_signed_client_an_explicit_opt_out_or_loopback_is_accepted(made: Any) -> None:
    assert isinstance(made(), WebhookClient)


class Charge(BaseModel):
    amountCents: int


class BillingSettings(HandlerSettings):
    billing_url: str
    billing_unsigned: bool = False


class BillingHandler(MessageHandler[Charge]):
    """A handler of a user's own that builds its client at start, as docs/writing-a-handler.md shows."""

    event_type: ClassVar[str] = "ChargeRequested"
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = Charge
    settings_model: ClassVar[type[HandlerSettings]] = BillingSettings

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        own = settings.of(BillingSettings)
        self.client = WebhookClient(own.billing_url, "BILLING_URL", allow_unsigned=own.billing_unsigned)

    def handle(self, payload: Charge, context: MessageContext) -> Effect:
        raise NotImplementedError


def _start(**variables: str) -> BillingHandler:
    return BillingHandler(Settings.from_env({**ENV, **variables}, handler_settings=(BillingSettings,)))


def test_a_handler_building_an_unsigned_client_beyond_loopback_fails_at_start() -> None:
    with pytest.raises(ConfigurationError, match="BILLING_URL beyond loopback needs a signing key"):
        _start(BILLING_URL=BEYOND_LOOPBACK)


def test_a_handler_that_opts_out_by_name_starts() -> None:
    assert isinstance(_start(BILLING_URL=BEYOND_LOOPBACK, BILLING_UNSIGNED="true").client, WebhookClient)
