"""Lambda entry point: observability, clients once per container, then delegate.

Handler: ``consumer.app.handler``. All logic lives in ``consumer.batch`` (the batch),
``consumer.processor`` (one record) and ``consumer.idempotency`` (the state machine).
Endpoints come from boto3's own ``AWS_ENDPOINT_URL*`` variables: there is no local
code path.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config

from consumer.backoff import VisibilityBackoff
from consumer.batch import BatchProcessor
from consumer.config import Settings
from consumer.dead_letter import DeadLetterQueue
from consumer.handlers import build_handlers
from consumer.idempotency.store import IdempotencyStore
from consumer.processor import Outcome, RecordProcessor

logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME", "idempotent-consumer"))
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "IdempotentConsumer"))


class LazyClient:
    """A boto3 client created on first use (thread-safe), then used as is."""

    def __init__(self, create: Callable[[], Any]) -> None:
        self._create = create
        self._client: Any = None
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._create()
        return getattr(self._client, name)


def wire(settings: Settings, session: boto3.session.Session, clock: Callable[[], float] = time.time) -> BatchProcessor:
    """Build the consumer from settings, a boto3 session and a clock.

    Tests and the fault-injection harness pass their own session (to hook its events)
    and clock (to skew it); the function itself always uses the defaults.
    """
    client_config = Config(
        # One connection per worker thread, or threads queue for a socket.
        max_pool_connections=settings.max_workers + 2,
        connect_timeout=2,
        read_timeout=5,
        retries={"mode": "standard", "max_attempts": 3},
        # Requests are built by this code, and DynamoDB validates them anyway: skipping the
        # client-side pass saves about a fifth of each call's CPU.
        parameter_validation=False,
    )
    store = IdempotencyStore(
        session.client("dynamodb", config=client_config),
        settings.idempotency_table_name,
        ttl_seconds=settings.idempotency_ttl_seconds,
        result_max_bytes=settings.result_max_bytes,
        clock=clock,
    )
    # SQS is only needed for poison and retries: create it then, not on every cold start.
    sqs = LazyClient(lambda: session.client("sqs", config=client_config))
    dead_letters = DeadLetterQueue(sqs, settings.dead_letter_queue_url)
    processor = RecordProcessor(store, build_handlers(settings), dead_letters, settings, logger, clock=clock)
    backoff = VisibilityBackoff(
        sqs,
        base_seconds=settings.retry_backoff_base_seconds,
        max_seconds=settings.retry_backoff_max_seconds,
        logger=logger,
        clock=clock,
    )
    return BatchProcessor(
        processor, max_workers=settings.max_workers, deadline_margin_ms=settings.deadline_margin_ms, backoff=backoff
    )


@lru_cache(maxsize=1)
def build_consumer() -> BatchProcessor:
    """The consumer of this container, built on first use and kept while the container lives."""
    return wire(Settings.from_env(), boto3.session.Session())


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    batch = build_consumer().process(event.get("Records"), context.get_remaining_time_in_millis)
    counts = batch.counts()
    for outcome in Outcome:
        metrics.add_metric(name=outcome.value, unit=MetricUnit.Count, value=counts.get(outcome, 0))
    response = batch.response()
    logger.info(
        "batch done",
        extra={
            "records": len(batch.results),
            "failures": len(response["batchItemFailures"]),
            **{outcome.value: counts.get(outcome, 0) for outcome in Outcome},
        },
    )
    return response
