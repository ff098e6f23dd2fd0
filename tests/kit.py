"""The test kit for your handlers: a pytest plugin (loaded by tests/conftest.py) and what its tests import.

A handler's tests import this module and the application, nothing of the core's own tests::

    from service.handlers.orders import OrderPlacedHandler
    from tests.kit import Clock, consumer_of, settings_for, sqs_record, create_template_tables

    def test_an_order_is_placed_once(dynamodb, sqs, clock: Clock) -> None:
        create_template_tables(dynamodb, {"OrdersTable": "orders"})
        settings = settings_for([OrderPlacedHandler], tables={"OrdersTable": "orders"})
        consumer = consumer_of(dynamodb, sqs, clock, {"OrderPlaced": OrderPlacedHandler(settings)}, settings)
        assert consumer.process([sqs_record("m-1", body), sqs_record("m-2", body)]) == {"batchItemFailures": []}

Fixtures: ``aws`` (moto in process, dummy credentials, no endpoint of the caller's), ``dynamodb`` and
``sqs`` (its clients), ``clock`` (wall time the test moves: leases and TTLs expire when it says so),
``api_sink`` (an HTTP API of the test's own on loopback, for a lock handler's ``WebhookClient``: it records each
call, ``received()``, verifies signatures with its ``secret``, and answers as scripted, ``answer_next(Answer(status=
503))`` or ``Answer(body={"labelId": "l-1"})``; unscripted, ``{"status": 200, "id": answer_id(<key>)}``). The
generic contract over every registered handler is ``tests/app/test_handler_contract.py``; drawing valid
payloads from a model is ``testkit.payloads``. moto takes one request at a time here, and no transaction of it
ever conflicts with another: a claim about concurrency is proven on DynamoDB Local (the core's proof does), never
here.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.parameters.constants import DEFAULT_PROVIDERS
from moto import mock_aws
from moto.core.botocore_stubber import BotocoreStubber

from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.handler import MessageHandler, declared_settings, declared_tables
from consumer.outcome import Log, Outcome
from consumer.wiring import wire
from testkit.dead_letters import DeadLetter, reasons, receive
from testkit.lambda_sqs import REGION, sqs_record
from testkit.messages import envelope
from testkit.tables import create_template_tables
from testkit.template import TEMPLATE_PATH, Template
from testkit.webhook import Answer, WebhookSink, answer_id

__all__ = [
    "Answer",
    "Clock",
    "Consumer",
    "Crash",
    "DeadLetter",
    "Outcome",
    "Remaining",
    "WebhookSink",
    "answer_id",
    "consumer_of",
    "create_template_tables",
    "drain",
    "envelope",
    "reasons",
    "settings_for",
    "sort_keys",
    "sqs_record",
    "table_name_for_tests",
]

DEAD_LETTER_QUEUE = "consumer-dlq"


class Clock:
    """Wall time the test controls: leases and TTLs expire when the test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Crash(BaseException):
    """A worker that dies where a test raises this (in a handler, or in a call it makes): nothing of the consumer
    catches it, so, as when a process dies mid-message, its claim and what its guard reserved stay behind for the
    lease to run out. ``Consumer.process`` raises it once the batch's other messages have ended."""


class Remaining:
    """A remaining time the test sets: fixed, or read from a script and then its last value."""

    def __init__(self, ms: int = 30_000, then: list[int] | None = None) -> None:
        self.ms = ms
        self._script = list(then or [])

    def __call__(self) -> int:
        if self._script:
            self.ms = self._script.pop(0)
        return self.ms


def table_name_for_tests(logical_id: str) -> str:
    """What the tests call a template table: LedgerTable -> ledger, InventoryTable -> inventory."""
    return logical_id.removesuffix("Table").lower()


def settings_for(
    handlers: Sequence[type[MessageHandler[Any]]], tables: Mapping[str, Any] | None = None, **overrides: Any
) -> Settings:
    """The function's settings for ``handlers``, as tests build them: each table they declare named by
    ``table_name_for_tests`` or by ``tables`` (logical id -> a name, or a resource with a ``name``); an
    override that is no field of ``Settings`` is a handler's own setting (``billing_url="http://..."``).

    A required setting of a handler's own (no default) is given here, by its name in lower case; left out, it
    takes the value template.yaml gives its variable (from its parameter's Default, or its LocalParameters value).
    """
    own = {name.upper(): str(overrides.pop(name)) for name in set(overrides) - set(Settings.model_fields)}
    declared = {name.upper() for model in declared_settings(handlers) for name in model.model_fields}
    assert set(own) <= declared, f"no setting and no handler's own setting: {sorted(set(own) - declared)}"
    required = {
        name: model
        for model in declared_settings(handlers)
        for name, f in model.model_fields.items()
        if f.is_required()
    }
    if missing := {name: model for name, model in required.items() if name.upper() not in own}:
        own |= _template_values(missing)
    given = {table: getattr(name, "name", name) for table, name in (tables or {}).items()}
    every = dict.fromkeys(("IdempotencyTable", *declared_tables(handlers), *given))
    names = {table: given.get(table, table_name_for_tests(table)) for table in every}
    values: dict[str, Any] = {
        "idempotency_table_name": names.pop("IdempotencyTable"),
        "dead_letter_queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/test-dlq",
        "table_names": names,
        "handler_variables": own,
    }
    return Settings(**(values | overrides))


class NoTestValue(AssertionError):
    """A required setting of a handler's own that neither the test nor the template gives a value."""


def _template_values(settings: Mapping[str, type[Any]]) -> dict[str, str]:
    """The value template.yaml gives each required setting's variable, at its parameters' Defaults and local values."""
    template = Template.from_file(TEMPLATE_PATH)
    (function,) = template.resources_of_type("AWS::Serverless::Function")
    variables = template.properties(function).get("Environment", {}).get("Variables", {})
    for name, model in settings.items():
        if not str(variables.get(name.upper(), "")):
            raise NoTestValue(
                f"{name.upper()} ({model.__name__}.{name}) is required and has no value for the tests: give the"
                f' function "{name.upper()}: !Ref <its parameter>" in {TEMPLATE_PATH.name} (the parameter with a'
                f" Default or a value under the Metadata's LocalParameters), or pass it here: {name}=<value>"
            )
    return {name.upper(): str(variables[name.upper()]) for name in settings}


@dataclass
class Consumer:
    """The function's consumer on moto, and what a test reads back."""

    batch: BatchRunner
    dynamodb: Any
    sqs: Any
    dlq_url: str
    settings: Settings
    remaining: Remaining = field(default_factory=Remaining)

    def process(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return self.batch.process(records, self.remaining).response()

    def outcomes(self, records: list[dict[str, Any]]) -> list[Outcome]:
        """How each record ended, in order: ``APPLIED``, ``DUPLICATE``, ``POISON`` (dead-lettered), or one SQS delivers
        again (``RETRIED``, ``IN_FLIGHT`` under another delivery's lease, ``CONFLICT``)."""
        return [result.outcome for result in self.batch.process(records, self.remaining).results]

    def failed_ids(self, records: list[dict[str, Any]]) -> list[str]:
        return [failure["itemIdentifier"] for failure in self.process(records)["batchItemFailures"]]

    def dead_letters(self) -> list[DeadLetter]:
        return drain(self.sqs, self.dlq_url)


def drain(sqs: Any, queue_url: str) -> list[DeadLetter]:
    """Every message in the dead-letter queue, taken out of it (a test reads each letter once)."""
    taken: list[DeadLetter] = []
    while letters := receive(sqs, queue_url, WaitTimeSeconds=0):
        taken += letters
        for letter in letters:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=letter.receipt_handle)
    return taken


def consumer_of(
    dynamodb: Any,
    sqs: Any,
    clock: Clock,
    handlers: Mapping[str, MessageHandler[Any]],
    settings: Settings,
    *,
    dlq_url: str | None = None,
    session: boto3.session.Session | None = None,
    logger: Log | None = None,
) -> Consumer:
    """The consumer of ``handlers`` (built, by event type) wired as the function wires it, on moto (the
    ``dynamodb`` fixture's idempotency table), with a dead-letter queue of its own unless ``dlq_url`` names one
    (the settings' is replaced)."""
    dlq_url = dlq_url or sqs.create_queue(QueueName=DEAD_LETTER_QUEUE)["QueueUrl"]
    settings = settings.model_copy(update={"dead_letter_queue_url": dlq_url})
    batch = wire(
        settings,
        # A boto3 session is one (its ``client``); the stubs' per-service overloads hide that from mypy.
        session or boto3.session.Session(region_name=REGION),
        clock=clock,
        logger=logger or _quiet_logger(),
        handlers=handlers,
    )
    return Consumer(batch, dynamodb, sqs, dlq_url, settings)


def sort_keys(dynamodb: Any, table: str, partition: str, value: str, sort: str = "entryId") -> list[str]:
    """The sort keys under one partition key value, sorted, read consistently."""
    items = dynamodb.query(
        TableName=table,
        KeyConditionExpression="#p = :v",
        ExpressionAttributeNames={"#p": partition},
        ExpressionAttributeValues={":v": {"S": value}},
        ConsistentRead=True,
    )["Items"]
    return sorted(item[sort]["S"] for item in items)


def _quiet_logger() -> Any:
    logger = logging.getLogger("consumer.tests")
    logger.addHandler(logging.NullHandler())
    return logger


# -- the fixtures (a pytest plugin: tests/conftest.py loads it) ------------------------------------


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
    # One request at a time: moto's backends are not thread-safe, and a batch runs its lanes on threads. This makes
    # each call whole, not moto a proof of concurrency: that is DynamoDB Local's (tests/core/integration).
    serialized = threading.Lock()
    process = BotocoreStubber.process_request

    def one_at_a_time(stubber: BotocoreStubber, request: Any) -> Any:
        with serialized:
            return process(stubber, request)

    monkeypatch.setattr(BotocoreStubber, "process_request", one_at_a_time)
    with mock_aws():
        yield
    DEFAULT_PROVIDERS.clear()


@pytest.fixture
def dynamodb(aws: None) -> Any:
    """A DynamoDB client on moto with the idempotency table as ``settings_for`` names it; a handler's tables are
    the test's to make (``create_template_tables``)."""
    client = boto3.client("dynamodb", region_name=REGION)
    create_template_tables(client, {"IdempotencyTable": table_name_for_tests("IdempotencyTable")})
    return client


@pytest.fixture
def sqs(aws: None) -> Any:
    return boto3.client("sqs", region_name=REGION)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def api_sink() -> Iterator[WebhookSink]:
    """An HTTP API of this test's own on loopback: point a URL setting at ``api_sink.url``."""
    with WebhookSink() as sink:
        yield sink
