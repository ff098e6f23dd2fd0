"""The three systems measured, each a Lambda handler over the same records and table shapes.

- ``this_consumer``: ``consumer.app.handler`` itself, as deployed.
- ``powertools``: Powertools' ``BatchProcessor`` with ``idempotent_function`` on DynamoDB.
- ``seed_pattern``: the seed articles' put, get-on-conflict, write, mark-completed loop.

The baselines run the consumer's own handlers for the business logic (schema, webhook,
ledger writes) and apply the writes one call each, as their users would: only the
idempotency mechanism differs between the three.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from bench.systems.powertools import PowertoolsBaseline
from bench.systems.seed_pattern import SeedPattern
from bench.systems.this_consumer import ThisConsumer
from consumer.config import Settings
from testkit.lambda_sqs import LambdaContext

if TYPE_CHECKING:  # the function's own process has no moto: only the harness creates tables
    from bench.backends import Backend

# Which system a benchmark function runs (bench.function reads it at init).
SYSTEM_ENV = "BENCH_SYSTEM"

__all__ = [
    "SYSTEM_ENV",
    "LambdaSystem",
    "PowertoolsBaseline",
    "SeedPattern",
    "ThisConsumer",
    "build_systems",
    "system_settings",
]


class LambdaSystem(Protocol):
    name: str
    settings: Settings

    def handle(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        """Process one SQS batch; return the partial batch response."""


def system_settings(backend: Backend, prefix: str, webhook_url: str) -> Settings:
    """Fresh tables of the template's shapes for one system, and the settings that name them."""
    tables = backend.create_tables(prefix)
    return Settings(
        idempotency_table_name=tables.idempotency,
        ledger_table_name=tables.ledger,
        dead_letter_queue_url=backend.dead_letter_queue_url,
        receipt_webhook_url=webhook_url,
    )


def build_systems(backend: Backend, webhook_url: str) -> list[LambdaSystem]:
    """The three systems, each on tables of its own, clients created now (inside the hooks)."""
    return [
        ThisConsumer(system_settings(backend, "consumer", webhook_url)),
        PowertoolsBaseline(system_settings(backend, "powertools", webhook_url)),
        SeedPattern(system_settings(backend, "seed", webhook_url)),
    ]
