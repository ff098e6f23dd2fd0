"""What a message costs: DynamoDB calls and capacity units by case (moto in process), and dollars per million."""

from __future__ import annotations

import functools
import itertools
import math
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from unittest import mock

import boto3
from moto import mock_aws

from bench.capacity import CapacityMeter
from bench.probe import RoundTripProbe, unobserved
from bench.systems import System
from consumer.api import ID_PATTERN
from consumer.config import Settings
from consumer.handler import MessageHandler, Mode, declared_settings, declared_tables
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.lambda_sqs import LambdaContext, sqs_event
from testkit.messages import envelope, queue_counts
from testkit.payloads import GeneratorError, Handler, put_seeds, refusal, registered, seed_items, valid_payloads
from testkit.tables import IDEMPOTENCY_TABLE, create_template_tables

NEW, DUPLICATE, DUPLICATE_IN_BATCH = "new", "duplicate", "duplicate inside one batch"
CASES = (NEW, DUPLICATE, DUPLICATE_IN_BATCH)

_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SQS", "AWS_PROFILE")

# List prices, not fetched by the run: update PRICES_AS_OF with them. How they add up: methodology.md.
REGION = "us-east-1"
PRICES_AS_OF = "2025-01-15 (AWS pricing pages; DynamoDB on-demand after the 2024-11-01 price cut)"
LAMBDA_ARM64_PER_GB_S = 0.0000133334
LAMBDA_PER_REQUEST = 0.20 / 1e6
DYNAMODB_PER_WRITE_UNIT = 0.625 / 1e6
DYNAMODB_PER_READ_UNIT = 0.125 / 1e6
SQS_PER_REQUEST = 0.40 / 1e6
MILLION = 1_000_000


@dataclass(frozen=True)
class Backend:
    # The benchmark's own client: tables, item sizes, seed items. Its calls are never counted.
    reader: Any
    dead_letter_queue_url: str
    handlers: Sequence[Handler] = field(default_factory=registered)
    # Creates the tables named (logical id -> name): the template's, or a test's own for its handlers'.
    create_tables: Callable[[Any, Mapping[str, str]], None] = create_template_tables

    def settings(self, system: str, webhook_url: str) -> Settings:
        """Fresh tables for one system (the idempotency table and the handlers'), and the settings that name
        them; each URL a handler's settings declare (``*_url``) is the webhook's."""
        prefix = f"{system.replace(' ', '-').lower()}-{uuid.uuid4().hex[:6]}"
        own = declared_settings(self.handlers)
        urls = {name.upper(): webhook_url for m in own for name in m.model_fields if name.endswith("_url")}
        settings = Settings(
            idempotency_table_name=f"{prefix}-idempotency",
            table_names={table: f"{prefix}-{table}" for table in declared_tables(self.handlers)},
            dead_letter_queue_url=self.dead_letter_queue_url,
            handler_variables=urls,
        )
        with unobserved():
            names = {IDEMPOTENCY_TABLE: settings.idempotency_table_name, **settings.table_names}
            self.create_tables(self.reader, names)
        return settings

    def seed(self, settings: Sequence[Settings], handler: Handler, payloads: list[dict[str, Any]]) -> None:
        """The items these payloads need to apply (``testkit.payloads.seed_items``), in each system's tables."""
        items = [item for payload in payloads for item in seed_items(handler, payload)]
        with unobserved():
            for each in settings:
                put_seeds(self.reader, each.table_names, items)


class Draws:
    """Bodies of one handler, payloads drawn from its model, each under a key of its own: unique across runs too,
    as DynamoDB Local's tables outlive one system's turn."""

    def __init__(self, handler: Handler, seed: Callable[[list[dict[str, Any]]], None] = lambda _: None) -> None:
        self.handler, self._seed = handler, seed
        self._run_id = uuid.uuid4().hex[:8]
        self._draw = itertools.count()
        model = handler.payload_model
        self._identifiers = [
            field.alias or name
            for name, field in model.model_fields.items()
            if any(getattr(constraint, "pattern", None) == ID_PATTERN for constraint in field.metadata)
        ]

    def bodies(self, count: int) -> list[str]:
        n = next(self._draw)
        keys = [f"{self._run_id}-{n}-{i}" for i in range(count)]
        # Drawn identifiers are short and repeat (two payments on one account in two currencies, refused): each
        # message names entities of its own, its key in every ID_PATTERN field, so that every message applies.
        payloads = [
            {**payload, **{field: f"{key}.{field}" for field in self._identifiers}}
            for key, payload in zip(keys, valid_payloads(self.handler, count, seed=n), strict=True)
        ]
        if (why := refusal(self.handler.payload_model, payloads[0])) is not None:
            raise GeneratorError(f"{self.handler.event_type}: fresh identifiers refused: {why}")
        self._seed(payloads)
        return [envelope(self.handler.event_type, key, p) for key, p in zip(keys, payloads, strict=True)]


def timed_handler(handlers: Sequence[Handler] | None = None) -> Handler:
    """What the systems are timed on: the first optimistic handler registered (no webhook in the way)."""
    optimistic = [handler for handler in handlers or registered() if handler.mode is Mode.OPTIMISTIC]
    if not optimistic:
        raise SystemExit("make bench times an optimistic handler: none is registered")
    return optimistic[0]


def guarded(handler: Handler) -> bool:
    """Its claim is a transaction with its guard (2 write units per item) rather than a single ``UpdateItem``."""
    return handler.guard is not MessageHandler.guard


def handler_name(handler: Handler) -> str:
    return f"{handler.event_type} ({handler.mode.value}{', guarded' if guarded(handler) else ''})"


@contextmanager
def moto_backend() -> Iterator[Backend]:
    """moto in process, no endpoint or profile of the caller's in the way; the environment restored after."""
    with mock.patch.dict(os.environ, DUMMY_CREDENTIALS_ENV):
        for name in _ENDPOINT_VARIABLES:
            os.environ.pop(name, None)
        with mock_aws():
            session = boto3.session.Session()
            sqs = session.client("sqs")
            with unobserved():
                queue_url = sqs.create_queue(QueueName="bench-dead-letters")["QueueUrl"]
            yield Backend(session.client("dynamodb"), queue_url)
            # A refused message is dead-lettered, not failed: its cost is not an applied message's.
            if refused := sum(queue_counts(sqs, queue_url)):
                raise RuntimeError(f"{refused} measured messages were dead-lettered: see the consumer's log")


class Cost(NamedTuple):
    calls: float
    write_units: float
    read_units: float


def run_batch(system: System, bodies: list[str]) -> None:
    """One batch in process; a benchmark over failed records would measure nothing."""
    if failures := system.handle(sqs_event(bodies), LambdaContext(timeout_s=60.0)).get("batchItemFailures") or []:
        raise RuntimeError(f"{system.name}: {len(failures)} of {len(bodies)} records failed")


def batch_cost(system: System, bodies: list[str], probe: RoundTripProbe, meter: CapacityMeter, count: int) -> Cost:
    """One batch's calls and request units, per ``count`` messages."""
    before = (probe.calls, meter.write_units, meter.read_units)
    run_batch(system, bodies)
    after = (probe.calls, meter.write_units, meter.read_units)
    return Cost(*((end - start) / count for start, end in zip(before, after, strict=True)))


def message_costs(
    system: System, draws: Draws, probe: RoundTripProbe, meter: CapacityMeter, count: int
) -> dict[str, Cost]:
    """Each case a batch of ``count`` fresh messages of one handler; a duplicate inside one batch is what a batch
    of pairs costs beyond its new messages, so only the copies are left."""
    per_message = functools.partial(batch_cost, system, probe=probe, meter=meter, count=count)

    bodies, paired = draws.bodies(count), draws.bodies(count)
    # Redelivered bodies under new messageIds: the keys are already COMPLETED.
    costs = {NEW: per_message(bodies), DUPLICATE: per_message(bodies)}
    with_copies = per_message([body for body in paired for _ in range(2)])
    costs[DUPLICATE_IN_BATCH] = Cost(*(a - b for a, b in zip(with_copies, costs[NEW], strict=True)))
    return costs


def sqs_requests(batch_size: int) -> dict[str, float]:
    """SQS requests per message, happy path, for a batch of ``batch_size`` through the event source mapping."""
    return {
        "send (the producer's)": 1.0,
        "receive": 1 / batch_size,
        "delete": 1 / batch_size,  # the mapping deletes a batch's successes in one DeleteMessageBatch
        # New messages on distinct keys: none fails, none goes to the DLQ, no visibility change.
        "visibility changes": 0.0,
        "DLQ sends": 0.0,
    }


@dataclass(frozen=True)
class CostPerMillion:
    lambda_usd: float
    dynamodb_usd: float
    sqs_usd: float

    @property
    def total_usd(self) -> float:
        return self.lambda_usd + self.dynamodb_usd + self.sqs_usd


def billed_s(wall_s: float) -> float:
    """Lambda's billed duration: rounded up to the millisecond."""
    return math.ceil(wall_s * 1000) / 1000


def cost_per_million(batch_wall_s: float, batch_size: int, memory_mb: int, units: Cost) -> CostPerMillion:
    """A million messages in batches of ``batch_size`` taking ``batch_wall_s`` each, ``units`` per message."""
    per_batch = billed_s(batch_wall_s) * memory_mb / 1024 * LAMBDA_ARM64_PER_GB_S + LAMBDA_PER_REQUEST
    return CostPerMillion(
        lambda_usd=per_batch / batch_size * MILLION,
        dynamodb_usd=(units.write_units * DYNAMODB_PER_WRITE_UNIT + units.read_units * DYNAMODB_PER_READ_UNIT)
        * MILLION,
        sqs_usd=sum(sqs_requests(batch_size).values()) * SQS_PER_REQUEST * MILLION,
    )


PRICE_TABLE = [
    ("Lambda, arm64, per GB-second (first 6 billion GB-s a month)", f"${LAMBDA_ARM64_PER_GB_S:.10f}"),
    ("Lambda, per million requests", f"${LAMBDA_PER_REQUEST * MILLION:.2f}"),
    ("DynamoDB on-demand, per million write request units", f"${DYNAMODB_PER_WRITE_UNIT * MILLION:.3f}"),
    ("DynamoDB on-demand, per million read request units", f"${DYNAMODB_PER_READ_UNIT * MILLION:.3f}"),
    ("SQS standard queue, per million requests (after the free million)", f"${SQS_PER_REQUEST * MILLION:.2f}"),
]
