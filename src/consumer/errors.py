"""The two ways a message can fail, and what each means for the batch.

A ``PoisonMessage`` will never succeed however often it is retried: it goes to the
dead-letter queue with its reason and counts as handled. A ``TransientError`` may
succeed later: the record is reported in ``batchItemFailures`` and SQS redelivers it.
"""

from __future__ import annotations


class PoisonMessage(Exception):
    """The message can never be applied (bad JSON, schema, unknown type, key reuse...)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}")
        self.error_type = error_type
        self.message = message


class TransientError(Exception):
    """The message may be applied on a later delivery (throttling, 5xx, timeout...)."""


class ConfigurationError(Exception):
    """The function's environment is missing or has an invalid setting."""
