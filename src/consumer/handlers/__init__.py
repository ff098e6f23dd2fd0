"""The registry of business handlers, one file each, routed by ``eventType``."""

from __future__ import annotations

from typing import Any

from consumer.config import HandlerSettings, Settings
from consumer.handler import Effect, MessageContext, MessageHandler, Mode
from consumer.handlers.payment_received import PaymentReceivedHandler
from consumer.handlers.receipt_requested import ReceiptRequestedHandler

__all__ = [
    "HANDLERS",
    "Effect",
    "MessageContext",
    "MessageHandler",
    "Mode",
    "build_handlers",
    "declared_settings",
    "declared_tables",
]

# Add yours here; a handler file left out fails tests/unit/test_handler_registry.py.
HANDLERS: tuple[type[MessageHandler[Any]], ...] = (PaymentReceivedHandler, ReceiptRequestedHandler)


def declared_tables() -> tuple[str, ...]:
    """The tables the registered handlers write, each once: what the function must be able to reach."""
    return tuple(dict.fromkeys(table for handler in HANDLERS for table in handler.tables))


def declared_settings() -> tuple[type[HandlerSettings], ...]:
    """The settings models of the registered handlers, each once: what the function reads at start."""
    return tuple(dict.fromkeys(handler.settings_model for handler in HANDLERS))


def build_handlers(settings: Settings) -> dict[str, MessageHandler[Any]]:
    return {handler.event_type: handler(settings) for handler in HANDLERS}
