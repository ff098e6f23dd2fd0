"""Lambda entry point: observability, clients once per container, then delegate.

Handler: ``consumer.app.handler``. All logic lives in ``consumer.batch`` (the batch),
``consumer.processor`` (one record) and ``consumer.idempotency`` (the state machine).
Endpoints come from boto3's own ``AWS_ENDPOINT_URL*`` variables: there is no local
code path.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import botocore.session
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config

from consumer.backoff import VisibilityBackoff
from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.conflicts import ConflictRetry
from consumer.dead_letter import DeadLetterQueue
from consumer.errors import ConfigurationError
from consumer.handlers import MessageHandler, build_handlers, declared_settings, declared_tables
from consumer.idempotency.store import IdempotencyStore
from consumer.outcome import Outcome
from consumer.processor import RecordProcessor
from consumer.sdk import require_botocore, require_tables

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME", "idempotent-consumer"))
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "IdempotentConsumer"))

ClientT = TypeVar("ClientT")


class LazyClient(Generic[ClientT]):
    """A boto3 client created on first use (thread-safe), then kept."""

    def __init__(self, create: Callable[[], ClientT]) -> None:
        self._create = create
        self._client: ClientT | None = None
        self._lock = threading.Lock()

    def get(self) -> ClientT:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._create()
        return self._client


def _client(session: Any, service: str, config: Config) -> Any:
    """A client from botocore's session, or from a boto3 session (tests and tools hook its events)."""
    if isinstance(session, botocore.session.Session):
        return session.create_client(service, config=config)
    return session.client(service, config=config)


def wire(
    settings: Settings,
    session: Any,
    clock: Callable[[], float] = time.time,
    *,
    logger: Any = logger,
    handlers: Mapping[str, MessageHandler[Any]] | None = None,
    check_tables: bool = False,
) -> BatchRunner:
    """Build the consumer from settings, a session and a clock.

    The function uses botocore's session: importing boto3 would add its S3 transfer
    manager to every cold start for nothing.

    Tests and the fault-injection harness pass their own session (to hook its events),
    clock (to skew it), logger and handlers (which then replace the registered ones: those
    are not built, so their settings and tables need not exist); the function itself uses
    the defaults, and checks its tables (tests that made their own tables skip the round trips).
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
    dynamodb = cast("DynamoDBClient", _client(session, "dynamodb", client_config))
    if check_tables:
        require_tables(dynamodb, settings.every_table())
    conflicts = ConflictRetry(
        base_ms=settings.conflict_retry_base_ms,
        max_ms=settings.conflict_retry_max_ms,
        attempts=settings.conflict_retry_attempts,
        margin_ms=settings.deadline_margin_ms,
    )
    store = IdempotencyStore(
        dynamodb,
        settings.idempotency_table_name,
        ttl_seconds=settings.idempotency_ttl_seconds,
        result_max_bytes=settings.result_max_bytes,
        clock=clock,
        conflicts=conflicts,
    )
    # SQS is only needed for poison and retries: create it then, not on every cold start.
    sqs: LazyClient[SQSClient] = LazyClient(lambda: cast("SQSClient", _client(session, "sqs", client_config)))
    dead_letters = DeadLetterQueue(sqs.get, settings.dead_letter_queue_url)
    processor = RecordProcessor(
        store,
        dict(handlers) if handlers is not None else build_handlers(settings),
        dead_letters,
        settings,
        logger,
        clock=clock,
    )
    backoff = VisibilityBackoff(
        sqs.get,
        base_seconds=settings.retry_backoff_base_seconds,
        max_seconds=settings.retry_backoff_max_seconds,
        logger=logger,
        clock=clock,
    )
    return BatchRunner(
        processor,
        max_workers=settings.max_workers,
        deadline_margin_ms=settings.deadline_margin_ms,
        backoff=backoff,
        clock=clock,
    )


@lru_cache(maxsize=1)
def build_consumer() -> BatchRunner:
    """The consumer of this container, built once after its checks (in Lambda, during init).

    Settings, the runtime's SDK and the tables are checked first, so a misconfigured
    function fails its first invocation with the cause named, before any record is touched.
    """
    settings = Settings.from_env(tables=declared_tables(), handler_settings=declared_settings())
    session = botocore.session.get_session()
    require_botocore(session)
    return wire(settings, session, check_tables=True)


# Lambda runs an on-demand function's init phase on a full vCPU and its invocations at the memory
# size's share (bench/methodology.md): in Lambda's runtime the consumer is built during init. A
# setting or SDK that fails its check is left to fail the first invocation with its cause, as it
# does without this; code that imports this module elsewhere builds the consumer when it means to.
if "AWS_LAMBDA_FUNCTION_NAME" in os.environ:
    with contextlib.suppress(ConfigurationError):
        build_consumer()


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    consumer = build_consumer()
    records = event.get("Records") if isinstance(event, Mapping) else None
    batch = consumer.process(records, context.get_remaining_time_in_millis)
    counts = batch.counts()
    for outcome in Outcome:
        metrics.add_metric(name=outcome.value, unit=MetricUnit.Count, value=counts.get(outcome, 0))
    absorbed = batch.conflicts_absorbed()
    metrics.add_metric(name="conflicts_absorbed", unit=MetricUnit.Count, value=absorbed)
    response = batch.response()
    logger.info(
        "batch done",
        extra={
            "records": len(batch.results),
            "failures": len(response["batchItemFailures"]),
            "conflicts_absorbed": absorbed,
            **{outcome.value: counts.get(outcome, 0) for outcome in Outcome},
        },
    )
    return response
