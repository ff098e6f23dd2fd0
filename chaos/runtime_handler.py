"""The chaos function as Lambda's runtime loads it (``_HANDLER=chaos.runtime_handler.handler``).

At init (the first invocation of a runtime process: a cold start), the environment reads its fault plan from
its variables (``PlanVariable``), installs the transport fault hooks on a boto3 session,
draws its clock skew and builds the consumer with ``consumer.app.wire(settings, session,
clock)``, or the factory the plan names (the negative controls). Each invocation then
delegates to that consumer. A crash fault ends the process with ``os._exit``, as Lambda's
runtime dies: the emulator reports the invocation as failed and the next one cold-starts
a new process, with a new clock skew.

Everything the harness needs to know afterwards (faults, cold starts, each record's
outcome) goes to the environment's journal, since the process may not live to answer.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any

import boto3

from chaos import journal as journal_file
from chaos.faults import ContainerFaults, FaultKind, FaultLog, Zombies, ZombieSettings
from chaos.journal import Journal
from chaos.transport_faults import install_faults
from consumer.config import Settings
from consumer.idempotency.record import Attr


class PlanVariable(StrEnum):
    """The environment variables that carry an environment's fault plan; set by ``chaos.function``."""

    SETTINGS = "CHAOS_SETTINGS"  # the consumer's Settings as JSON (the harness's short leases)
    RATES = "CHAOS_RATES"  # {fault kind: rate}
    SEED = "CHAOS_SEED"  # this environment's seed; each cold start draws from it anew
    MAX_SKEW_MS = "CHAOS_MAX_SKEW_MS"
    JOURNAL = "CHAOS_JOURNAL"  # the file this environment reports to
    PAUSE_SLOTS = "CHAOS_PAUSE_SLOTS"  # the directory of the run's zombie pause slots
    MAX_PAUSED = "CHAOS_MAX_PAUSED"
    MAX_PAUSE_S = "CHAOS_MAX_PAUSE_S"
    DEADLINE_MARGIN_MS = "CHAOS_DEADLINE_MARGIN_MS"
    CONSUMER = "CHAOS_CONSUMER"  # module:callable(settings, session, *, clock)


def _load(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


class Environment:
    """One cold start's worth of state: its faults, its clock, its consumer."""

    def __init__(self, variables: Mapping[str, str]) -> None:
        journal = Journal(Path(variables[PlanVariable.JOURNAL]))
        cold_starts = sum(1 for entry in journal_file.read([journal.path]) if entry.get("event") == "init")
        self._rng = random.Random(f"{variables[PlanVariable.SEED]}:{cold_starts}")
        self.skew_s = self._rng.uniform(-1, 1) * int(variables[PlanVariable.MAX_SKEW_MS]) / 1000
        journal.write({"event": "init", "skew_ms": round(self.skew_s * 1000)})
        self.journal = journal
        self.log = FaultLog(journal=journal)
        settings = Settings.model_validate_json(variables[PlanVariable.SETTINGS])
        rates = {FaultKind(kind): rate for kind, rate in json.loads(variables[PlanVariable.RATES]).items()}
        # Outside the fault hooks: the zombie watches the record as an operator would.
        watcher = boto3.session.Session().client("dynamodb")
        table = settings.idempotency_table_name

        def owner_of(record_id: str) -> str | None:
            item = watcher.get_item(TableName=table, Key={Attr.ID: {"S": record_id}}, ConsistentRead=True).get("Item")
            return item[Attr.OWNER_TOKEN]["S"] if item else None

        zombie_settings = ZombieSettings(
            owner_of, float(variables[PlanVariable.MAX_PAUSE_S]), max_paused=int(variables[PlanVariable.MAX_PAUSED])
        )
        zombies = Zombies(zombie_settings, self.log, Path(variables[PlanVariable.PAUSE_SLOTS]))
        self.faults = ContainerFaults(rates, random.Random(self._rng.random()), self.log, table, zombies)
        self._deadline_margin_ms = int(variables[PlanVariable.DEADLINE_MARGIN_MS])
        session = boto3.session.Session()
        install_faults(session, self.faults, services=("dynamodb", "sqs"))
        self.consumer = _load(variables[PlanVariable.CONSUMER])(settings, session, clock=self.clock)

    def clock(self) -> float:
        return time.time() + self.skew_s

    def remaining_ms(self, context: Any) -> Callable[[], int]:
        """The runtime's own deadline; or, for a deadline fault, one that runs out partway through the batch."""
        if not self.faults.roll(FaultKind.DEADLINE):
            return context.get_remaining_time_in_millis
        ends = time.monotonic() + (self._deadline_margin_ms + self._rng.uniform(0, 400)) / 1000

        def remaining() -> int:
            return min(context.get_remaining_time_in_millis(), int((ends - time.monotonic()) * 1000))

        return remaining

    def invoke(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        self.faults.new_invocation()
        batch = self.consumer.process(event.get("Records"), self.remaining_ms(context))
        results = [
            [result.message_id, str(result.outcome), result.reason, getattr(result, "conflicts_absorbed", 0)]
            for result in getattr(batch, "results", ())
        ]
        self.journal.write({"event": "results", "results": results})
        response: dict[str, Any] = batch.response()
        return response


@lru_cache(maxsize=1)
def _environment() -> Environment:
    # On the first invocation, not at import: the fleet's handler check imports this module too.
    return Environment(os.environ)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _environment().invoke(event, context)
