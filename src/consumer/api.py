"""Everything a handler author imports, from one place: ``from consumer.api import ...``.

See ``MessageHandler`` for a complete handler, and README "Writing your own handler".
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from consumer.config import HandlerSettings, SecretArn, Settings
from consumer.errors import ConfigurationError, ErrorType, PoisonMessage, TransientError
from consumer.idempotency.writes import ConditionCheck, Delete, Put, Update
from consumer.webhook import SigningKey, WebhookClient

if TYPE_CHECKING:
    from consumer.handlers.base import ID_PATTERN, Effect, Guard, MessageContext, MessageHandler, Mode

__all__ = [
    "ID_PATTERN",
    "ConditionCheck",
    "ConfigurationError",
    "Delete",
    "Effect",
    "ErrorType",
    "Guard",
    "HandlerSettings",
    "MessageContext",
    "MessageHandler",
    "Mode",
    "PoisonMessage",
    "Put",
    "SecretArn",
    "Settings",
    "SigningKey",
    "TransientError",
    "Update",
    "WebhookClient",
]

_FROM_BASE = frozenset({"ID_PATTERN", "Effect", "Guard", "MessageContext", "MessageHandler", "Mode"})


def __getattr__(name: str) -> Any:
    # The handler base lives in consumer.handlers, whose registry imports the handlers, which import
    # this module: read on first use, it is found whichever of the two is imported first.
    if name in _FROM_BASE:
        return getattr(importlib.import_module("consumer.handlers.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
