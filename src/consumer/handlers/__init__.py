"""The registry of business handlers, one file each, routed by ``eventType``."""

from __future__ import annotations

from typing import Any

from consumer.config import Settings
from consumer.handlers.base import Effect, MessageContext, MessageHandler, Mode
from consumer.handlers.payment_received import PaymentReceivedHandler
from consumer.handlers.receipt_requested import ReceiptRequestedHandler

__all__ = ["Effect", "MessageContext", "MessageHandler", "Mode", "build_handlers"]


def build_handlers(settings: Settings) -> dict[str, MessageHandler[Any]]:
    handlers: list[MessageHandler[Any]] = [
        PaymentReceivedHandler(settings.ledger_table_name),
        ReceiptRequestedHandler(
            settings.ledger_table_name,
            settings.receipt_webhook_url,
            settings.webhook_timeout_ms,
            settings.webhook_secret_arn,
        ),
    ]
    return {handler.event_type: handler for handler in handlers}
