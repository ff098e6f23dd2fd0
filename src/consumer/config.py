"""Settings read once per container from the function's environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from consumer.errors import ConfigurationError


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigurationError(f"environment variable {name} is required and is empty or unset")
    return value


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be an integer, got {raw!r}") from None
    if value <= 0:
        raise ConfigurationError(f"{name} must be greater than 0, got {value}")
    return value


@dataclass(frozen=True)
class Settings:
    idempotency_table_name: str
    ledger_table_name: str
    dead_letter_queue_url: str
    receipt_webhook_url: str
    # Must outlive every redelivery and producer resend you want caught: SQS keeps
    # messages up to 14 days, producers may resend later still.
    idempotency_ttl_seconds: int = 7 * 24 * 3600
    # The lease is the invocation's remaining time minus this margin, capped below.
    lease_margin_ms: int = 2_000
    lease_max_ms: int = 15 * 60 * 1000
    # A lease is never shorter than this, even when the invocation is nearly out of
    # time: a zero lease would let a second worker take the key over at once.
    lease_min_ms: int = 1_000
    # No new record is started with less than this left of the invocation.
    deadline_margin_ms: int = 3_000
    max_workers: int = 10
    # Results bigger than this are stored as a digest to stay far below the 400 KB item limit.
    result_max_bytes: int = 64 * 1024
    webhook_timeout_ms: int = 5_000
    # A transiently failed record comes back after base x 2^(receives - 1) seconds, capped.
    retry_backoff_base_seconds: int = 2
    retry_backoff_max_seconds: int = 300

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        return cls(
            idempotency_table_name=_required(env, "IDEMPOTENCY_TABLE_NAME"),
            ledger_table_name=_required(env, "LEDGER_TABLE_NAME"),
            dead_letter_queue_url=_required(env, "DEAD_LETTER_QUEUE_URL"),
            receipt_webhook_url=env.get("RECEIPT_WEBHOOK_URL", "").strip(),
            idempotency_ttl_seconds=_positive_int(env, "IDEMPOTENCY_TTL_SECONDS", cls.idempotency_ttl_seconds),
            lease_margin_ms=_positive_int(env, "LEASE_MARGIN_MS", cls.lease_margin_ms),
            lease_max_ms=_positive_int(env, "LEASE_MAX_MS", cls.lease_max_ms),
            lease_min_ms=_positive_int(env, "LEASE_MIN_MS", cls.lease_min_ms),
            deadline_margin_ms=_positive_int(env, "DEADLINE_MARGIN_MS", cls.deadline_margin_ms),
            max_workers=_positive_int(env, "MAX_WORKERS", cls.max_workers),
            result_max_bytes=_positive_int(env, "RESULT_MAX_BYTES", cls.result_max_bytes),
            webhook_timeout_ms=_positive_int(env, "WEBHOOK_TIMEOUT_MS", cls.webhook_timeout_ms),
            retry_backoff_base_seconds=_positive_int(env, "RETRY_BACKOFF_BASE_SECONDS", cls.retry_backoff_base_seconds),
            retry_backoff_max_seconds=_positive_int(env, "RETRY_BACKOFF_MAX_SECONDS", cls.retry_backoff_max_seconds),
        )
