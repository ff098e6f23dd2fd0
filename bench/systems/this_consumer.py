"""This consumer: the deployed Lambda entry point, ``consumer.app.handler``, unchanged."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from consumer import app
from consumer.config import Settings
from testkit.lambda_sqs import LambdaContext


@contextmanager
def scoped_environment(values: Mapping[str, str], *, unset: tuple[str, ...] = ()) -> Iterator[None]:
    """Set and unset environment variables for the block, then put everything back."""
    saved = {name: os.environ.get(name) for name in (*values, *unset)}
    for name in unset:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class ThisConsumer:
    name = "this consumer"

    def __init__(self, settings: Settings, *, log_level: str = "INFO") -> None:
        self.settings = settings
        environment = {
            "IDEMPOTENCY_TABLE_NAME": settings.idempotency_table_name,
            "LEDGER_TABLE_NAME": settings.ledger_table_name,
            "DEAD_LETTER_QUEUE_URL": settings.dead_letter_queue_url,
            "RECEIPT_WEBHOOK_URL": settings.receipt_webhook_url,
            "IDEMPOTENCY_TTL_SECONDS": str(settings.idempotency_ttl_seconds),
        }
        # build_consumer() reads the environment once and is cached for the container's
        # life; one ThisConsumer at a time, so the cache is rebuilt for these tables.
        with scoped_environment(environment):
            app.build_consumer.cache_clear()
            app.build_consumer()
        self.set_log_level(log_level)

    @staticmethod
    def set_log_level(level: str | int) -> None:
        """What ``POWERTOOLS_LOG_LEVEL`` sets at import; INFO as deployed logs each record."""
        app.logger.setLevel(level)

    def handle(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        return app.handler(event, context)
