"""Everything a handler author imports, from one place: ``from consumer.api import ...``.

See ``MessageHandler`` for a complete handler, and docs/writing-a-handler.md.
"""

from __future__ import annotations

from consumer.config import ApiUrl, HandlerSettings, SecretArn, Settings
from consumer.errors import ConfigurationError, ErrorType, PoisonMessage, TransientError
from consumer.handler import ID_PATTERN, Effect, Guard, MessageContext, MessageHandler, Mode
from consumer.idempotency.writes import ConditionCheck, Delete, Put, Update
from consumer.outbox import BusEvent, QueueMessage, TopicMessage
from consumer.webhook import SigningKey, WebhookClient, WebhookResponse

__all__ = [
    "ID_PATTERN",
    "ApiUrl",
    "BusEvent",
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
    "QueueMessage",
    "SecretArn",
    "Settings",
    "SigningKey",
    "TopicMessage",
    "TransientError",
    "Update",
    "WebhookClient",
    "WebhookResponse",
]
