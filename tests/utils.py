"""Helpers shared by the test suites."""

from __future__ import annotations

from typing import Any

from consumer.config import Settings

IDEMPOTENCY_TABLE = "idempotency"
LEDGER_TABLE = "ledger"


def settings_for_tests(**overrides: Any) -> Settings:
    """The function's settings as tests build them: the one place a new required setting is given a value."""
    values: dict[str, Any] = {
        "idempotency_table_name": IDEMPOTENCY_TABLE,
        "ledger_table_name": LEDGER_TABLE,
        "dead_letter_queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/test-dlq",
    }
    return Settings(**(values | overrides))
