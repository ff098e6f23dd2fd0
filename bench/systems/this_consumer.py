"""This consumer: the deployed Lambda entry point, ``consumer.app.handler``, unchanged."""

from __future__ import annotations

from typing import Any

from bench.backends import scoped_environment
from consumer import app
from consumer.config import Settings
from testkit.lambda_sqs import LambdaContext


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


class ThisConsumerQuiet:
    """This consumer with POWERTOOLS_LOG_LEVEL=WARNING: what its per-record INFO logs cost.

    The level is module-wide, so it is lowered only for the length of each invocation,
    and this variant can take turns with the ordinary one in the same measurement.
    """

    name = "this consumer, logs at WARNING"

    def __init__(self, consumer: ThisConsumer) -> None:
        self.settings = consumer.settings
        self._consumer = consumer

    def handle(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        level = app.logger.log_level
        ThisConsumer.set_log_level("WARNING")
        try:
            return self._consumer.handle(event, context)
        finally:
            ThisConsumer.set_log_level(level)
