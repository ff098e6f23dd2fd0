"""Unit fixtures: the core's test tables on moto in process (the kit's ``aws``, ``sqs`` and ``clock``), and the
function's wiring on the core's test handlers.

moto does not serialize concurrent writes, so nothing here claims anything about
concurrency: those tests run against DynamoDB Local (tests/core/integration).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest

from consumer import app
from consumer.config import table_variable
from consumer.handler import MessageHandler
from consumer.idempotency import IdempotencyStore
from consumer.outcome import Log
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.lambda_sqs import REGION, LambdaContext
from testkit.tables import IDEMPOTENCY_TABLE as IDEMPOTENCY
from testkit.template import REPO_ROOT
from tests import kit
from tests.core.handlers import (
    CALL_TABLE,
    TALLY_TABLE,
    CallHandler,
    TallyHandler,
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


@pytest.fixture
def function_env(dynamodb: Any, sqs: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The function's environment on moto's tables and a dead-letter queue of its own (its URL)."""
    dlq_url = sqs.create_queue(QueueName="consumer-dlq")["QueueUrl"]
    for name, value in table_environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DEAD_LETTER_QUEUE_URL", dlq_url)
    monkeypatch.setenv("MAX_WORKERS", "1")  # moto in process is not thread-safe
    yield dlq_url


# What the entry point is given here: the core's test handlers, not the application's (it builds whatever it is given).
TEST_REGISTRY = (TallyHandler, CallHandler)


def function_tables() -> dict[str, str]:
    """The function's tables by logical id (the idempotency table and the test handlers'), as the tests name them."""
    tables = settings_for_tests().every_table()
    return {table: tables[table] for table in ("IdempotencyTable", *(t for h in TEST_REGISTRY for t in h.tables))}


def table_environment() -> dict[str, str]:
    return {table_variable(table): name for table, name in function_tables().items()}


def fresh_interpreter(script: str, variables: Mapping[str, str]) -> list[str]:
    """The lines ``script`` prints in a fresh interpreter, as Lambda's runtime starts one (the repository on its path,
    dummy credentials, ``variables``): whatever a test before imported does not count."""
    env = {
        **DUMMY_CREDENTIALS_ENV,
        "PATH": os.environ["PATH"],
        "PYTHONPATH": f"{REPO_ROOT / 'src'}{os.pathsep}{REPO_ROOT}",
        **variables,
    }
    answer = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False)
    assert answer.returncode == 0, answer.stderr[-2000:]
    return answer.stdout.splitlines()


def run(
    event: dict[str, Any], capsys: pytest.CaptureFixture[str], function: Callable[[Any, Any], Any] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Invoke ``function`` (the consumer on the test handlers unless given); return the response and every JSON line:
    log records and the metrics blob."""
    # The logger's handler holds the stdout of import time; point it at a buffer.
    logs = io.StringIO()
    previous = app.logger.registered_handler.setStream(logs)  # type: ignore[attr-defined]
    try:
        response = (function or app.lambda_handler(TEST_REGISTRY))(event, LambdaContext())
    finally:
        app.logger.registered_handler.setStream(previous)  # type: ignore[attr-defined]
    output = logs.getvalue() + capsys.readouterr().out
    return response, [json.loads(line) for line in output.splitlines() if line.startswith("{")]
