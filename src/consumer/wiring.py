"""How the consumer is put together from settings, a session and a clock (``wire``).

The function wires itself once per container (``consumer.app.LambdaHandler.build_consumer``) with
the application's handlers; tests, tools and the fault-injection harness call ``wire`` with their own
session, clock, logger and handlers.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import botocore.session
from aws_lambda_powertools import Logger
from botocore.config import Config

from consumer.backoff import VisibilityBackoff
from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.conflicts import ConflictRetry
from consumer.dead_letter import DeadLetterQueue
from consumer.handler import MessageHandler
from consumer.idempotency.observer import Tally
from consumer.idempotency.store import IdempotencyStore
from consumer.outcome import Log
from consumer.processor import MessageProcessor
from consumer.sdk import require_tables

if TYPE_CHECKING:
    import boto3.session
    from types_boto3_dynamodb import DynamoDBClient
    from types_boto3_sqs import SQSClient

    # botocore's in the function (importing boto3 would add its S3 transfer manager to every
    # cold start for nothing); boto3's from tests and tools, which hook its events.
    Session = botocore.session.Session | boto3.session.Session

logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME", "idempotent-consumer"))

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


def _client(session: Session, service: str, config: Config) -> Any:  # boto3's own clients are untyped here
    if isinstance(session, botocore.session.Session):
        return session.create_client(service, config=config)
    return session.client(service, config=config)  # type: ignore[call-overload]


def wire(
    settings: Settings,
    session: Session,
    clock: Callable[[], float] = time.time,
    *,
    handlers: Mapping[str, MessageHandler[Any]],
    logger: Log = logger,
    check_tables: bool = False,
) -> BatchRunner:
    """Build the consumer of ``handlers`` (built, by event type) from settings, a session and a clock.

    Tests and the fault-injection harness pass their own session (to hook its events), clock (to
    skew it) and logger; the function itself uses the defaults, and checks its tables (tests that
    made their own tables skip the round trips).
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
        margin_ms=settings.deadline_margin_ms,
    )
    # What the store sent, told per invocation (the batch takes it): metrics and the summary line.
    tally = Tally()
    store = IdempotencyStore(
        dynamodb,
        settings.idempotency_table_name,
        ttl_seconds=settings.idempotency_ttl_seconds,
        result_max_bytes=settings.result_max_bytes,
        clock=clock,
        conflicts=conflicts,
        group_commit_wait_ms=settings.group_commit_wait_ms if settings.group_commit else None,
        observer=tally,
    )
    # SQS is only needed for poison and retries: create it then, not on every cold start.
    sqs: LazyClient[SQSClient] = LazyClient(lambda: cast("SQSClient", _client(session, "sqs", client_config)))
    dead_letters = DeadLetterQueue(sqs.get, settings.dead_letter_queue_url)
    processor = MessageProcessor(
        store,
        dict(handlers),
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
        tally=tally,
    )
