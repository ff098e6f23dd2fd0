"""The one place tests build Settings: a new required setting gets its test value here."""

from __future__ import annotations

from typing import Any

from consumer.config import Settings

TEST_REQUIRED = {
    "idempotency_table_name": "idempotency",
    "ledger_table_name": "ledger",
    "dead_letter_queue_url": "consumer-dlq",
}


def make_settings(**overrides: Any) -> Settings:
    """Settings with a test value for each required field; ``overrides`` name real resources where needed."""
    return Settings(**{**TEST_REQUIRED, **overrides})


def make_env(**overrides: str) -> dict[str, str]:
    """The function's environment for those settings: each field's variable is its name in upper case."""
    return {name.upper(): value for name, value in {**TEST_REQUIRED, **overrides}.items()}
