"""Unit fixtures: moto in process, a clock the test moves, and the function's wiring.

moto does not serialize concurrent writes, so nothing here claims anything about
concurrency: those tests run against DynamoDB Local (tests/integration).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.parameters.constants import DEFAULT_PROVIDERS
from moto import mock_aws

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.handler import MessageHandler
from consumer.idempotency.store import IdempotencyStore
from consumer.outcome import Log
from testkit.dead_letters import DeadLetter, drain
from testkit.lambda_sqs import REGION
from testkit.tables import IDEMPOTENCY_TABLE as IDEMPOTENCY
from tests.handlers import CALL_TABLE, TALLY_TABLE, create_test_tables, handlers_for_tests, tally_entries, tally_total
from tests.utils import IDEMPOTENCY_TABLE, Remaining, settings_for_tests, table_name_for_tests

# The test handlers' tables, as settings_for_tests names them.
TALLIES = table_name_for_tests(TALLY_TABLE)
CALLS = table_name_for_tests(CALL_TABLE)


class Clock:
    """Wall time the test controls: leases and TTLs expire when the test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in [name for name in os.environ if name.startswith("AWS_ENDPOINT_URL")] + ["AWS_PROFILE"]:
        monkeypatch.delenv(name, raising=False)
    # Powertools keeps one Secrets Manager client per process: one made by an earlier test on the local stack
    # would read this test's secrets from the stack's server instead of moto in process.
    DEFAULT_PROVIDERS.clear()
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield
    DEFAULT_PROVIDERS.clear()


@pytest.fixture
def dynamodb(aws: None) -> Any:
    client = boto3.client("dynamodb", region_name=REGION)
    create_test_tables(client, {IDEMPOTENCY: IDEMPOTENCY_TABLE, TALLY_TABLE: TALLIES, CALL_TABLE: CALLS})
    return client


@pytest.fixture
def sqs(aws: None) -> Any:
    return boto3.client("sqs", region_name=REGION)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(dynamodb: Any, clock: Clock) -> IdempotencyStore:
    return IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)


def total(dynamodb: Any, tally_id: str) -> int:
    return tally_total(dynamodb, TALLIES, tally_id)


def entries(dynamodb: Any, tally_id: str) -> list[str]:
    return tally_entries(dynamodb, TALLIES, tally_id)


@dataclass
class Consumer:
    batch: BatchRunner
    store: IdempotencyStore
    dynamodb: Any
    sqs: Any
    dlq_url: str
    settings: Settings
    remaining: Remaining = field(default_factory=Remaining)

    def process(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return self.batch.process(records, self.remaining).response()

    def failed_ids(self, records: list[dict[str, Any]]) -> list[str]:
        return [failure["itemIdentifier"] for failure in self.process(records)["batchItemFailures"]]

    def dead_letters(self) -> list[DeadLetter]:
        return drain(self.sqs, self.dlq_url)


def make_consumer(
    dynamodb: Any,
    sqs: Any,
    clock: Clock,
    webhook_url: str = "",
    dlq_url: str | None = None,
    extra_handlers: dict[str, MessageHandler[Any]] | None = None,
    session: boto3.session.Session | None = None,
    webhook_timeout_ms: int = 5_000,
    logger: Log | None = None,
    **overrides: Any,
) -> Consumer:
    """The consumer on the test handlers (tests/handlers.py) and ``extra_handlers``; never the registered ones."""
    dlq_url = dlq_url or sqs.create_queue(QueueName="consumer-dlq")["QueueUrl"]
    # moto in process is not thread-safe (it raises or loses updates under threads), so
    # unit tests run lanes one at a time; parallel lanes are tested on DynamoDB Local.
    overrides.setdefault("max_workers", 1)
    settings = settings_for_tests(dead_letter_queue_url=dlq_url, **overrides)
    handlers = {**handlers_for_tests(settings, webhook_url, webhook_timeout_ms), **(extra_handlers or {})}
    batch = wire(
        settings,
        # A boto3 session is one (its ``client``); the stubs' per-service overloads hide that from mypy.
        session or boto3.session.Session(region_name=REGION),
        clock=clock,
        logger=logger or _quiet_logger(),
        handlers=handlers,
    )
    # The test's own view of the same table, to read records and play other workers.
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=settings.idempotency_ttl_seconds, clock=clock)
    return Consumer(batch, store, dynamodb, sqs, dlq_url, settings)


def _quiet_logger() -> Any:
    logger = logging.getLogger("consumer.tests")
    logger.addHandler(logging.NullHandler())
    return logger


@pytest.fixture
def consumer(dynamodb: Any, sqs: Any, clock: Clock) -> Consumer:
    return make_consumer(dynamodb, sqs, clock)


os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "IdempotentConsumerTests")
