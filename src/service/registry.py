"""The handlers this function routes to, by the ``eventType`` each declares: add yours here."""

from __future__ import annotations

from typing import Any

from consumer.api import MessageHandler
from service.handlers.payment_received import PaymentReceivedHandler
from service.handlers.receipt_requested import ReceiptRequestedHandler

# A handler file left out of this list fails the application's registry test.
HANDLERS: tuple[type[MessageHandler[Any]], ...] = (PaymentReceivedHandler, ReceiptRequestedHandler)
