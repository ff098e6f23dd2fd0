"""Unit fixtures: the core's test tables on moto in process (the kit's ``aws``, ``sqs`` and ``clock``), and the
function's wiring on the core's test handlers.

moto does not serialize concurrent writes, so nothing here claims anything about
concurrency: those tests run against DynamoDB Local (tests/core/integration).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest

from consumer.handler import MessageHandler
from consumer.idempotency.store import IdempotencyStore
from consumer.outcome import Log
from testkit.lambda_sqs import REGION
from testkit.tables import IDEMPOTENCY_TABLE as IDEMPOTENCY
from tests import kit
from tests.core.handlers import (
    CALL_TABLE,
    TALLY_TABLE,
    create_test_tables,
    handlers_for_tests,
    tally_entries,
    tally_total,
)
from tests.kit import Clock, table_name_for_tests
from tests.utils import IDEMPOTENCY_TABLE, settings_for_tests

# The test handlers' tables, as settings_for_tests names them.
TALLIES = table_name_for_tests(TALLY_TABLE)
CALLS = table_name_for_tests(CALL_TABLE)


@pytest.fixture
def dynamodb(aws: None) -> Any:
    client = boto3.client("dynamodb", region_name=REGION)
    create_test_tables(client, {IDEMPOTENCY: IDEMPOTENCY_TABLE, TALLY_TABLE: TALLIES, CALL_TABLE: CALLS})
    return client


@pytest.fixture
def store(dynamodb: Any, clock: Clock) -> IdempotencyStore:
    return IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)


def total(dynamodb: Any, tally_id: str) -> int:
    return tally_total(dynamodb, TALLIES, tally_id)


def entries(dynamodb: Any, tally_id: str) -> list[str]:
    return tally_entries(dynamodb, TALLIES, tally_id)


@dataclass
class Consumer(kit.Consumer):
    # The test's own view of the same table, to read records and play other workers.
    store: IdempotencyStore = field(kw_only=True)


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
    """The consumer on the test handlers (tests/core/handlers.py) and ``extra_handlers``; never the registered ones."""
    # moto in process is not thread-safe (it raises or loses updates under threads), so
    # unit tests run lanes one at a time; parallel lanes are tested on DynamoDB Local.
    overrides.setdefault("max_workers", 1)
    settings = settings_for_tests(**overrides)
    handlers = {**handlers_for_tests(settings, webhook_url, webhook_timeout_ms), **(extra_handlers or {})}
    wired = kit.consumer_of(dynamodb, sqs, clock, handlers, settings, dlq_url=dlq_url, session=session, logger=logger)
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=settings.idempotency_ttl_seconds, clock=clock)
    return Consumer(wired.batch, wired.dynamodb, wired.sqs, wired.dlq_url, wired.settings, store=store)


@pytest.fixture
def consumer(dynamodb: Any, sqs: Any, clock: Clock) -> Consumer:
    return make_consumer(dynamodb, sqs, clock)


os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "IdempotentConsumerTests")
