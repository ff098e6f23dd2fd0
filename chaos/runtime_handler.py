"""The chaos function as Lambda's runtime loads it (``_HANDLER=chaos.runtime_handler.handler``): at a
cold start, the run's fault plan from ``CHAOS_PLAN``, a skewed clock, the fault hooks on a boto3
session and on the lock-mode handlers, and the consumer built on them (``consumer.app.wire``, or a
negative control's factory). ``relay_handler`` is the outbox's relay, with the fault hooks on its sends."""

from __future__ import annotations

import contextlib
import json
import os
import pkgutil
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import boto3

from chaos.faults import FaultKind, FaultPolicy, Zombies
from chaos.journal import Journal
from chaos.transport_faults import install_faults
from consumer.config import Settings
from consumer.handler import MessageHandler, Mode, build_handlers
from consumer.idempotency.record import Attr
from testkit import application

PLAN_VARIABLE = "CHAOS_PLAN"
# The run's webhook sink, for a handler the run adds that calls out (its URL: any path under it).
WEBHOOK_VARIABLE = "CHAOS_WEBHOOK_URL"


@dataclass(frozen=True)
class Plan:
    """What every runtime process of a run shares, as JSON in ``CHAOS_PLAN``."""

    run_dir: str  # the journals and the zombies' pause slots
    journal: str  # this environment's journal, in ``run_dir``
    seed: int  # this environment's: each cold start draws from it and the number of cold starts before it
    settings: str  # the consumer's Settings as JSON (the harness's short leases)
    rates: dict[str, float]  # fault kind -> rate
    # module:callable(settings, session, *, clock), whose ``process(records, remaining_ms)``
    # returns a ``consumer.batch.BatchResult``.
    consumer: str
    max_skew_ms: int
    max_paused: int
    max_pause_s: float
    deadline_margin_ms: int
    slow_handler_s: float  # how long a slow lock-mode handler holds on once its call is made
    forced: dict[str, int]  # fault kind -> the faults each environment injects at their first opportunities
    forced_on: str | None  # the event type whose records take the forced crashes and zombies (None: any)
    # module:Class of handlers the run adds to the registered ones (a core test's own, its tables made by the run).
    handlers: list[str]
    registered: bool  # whether the application's registered handlers take part


def handler_classes(registered: bool, added: Sequence[str]) -> tuple[type[MessageHandler[Any]], ...]:
    """The application's registered handlers if ``registered``, then those ``added`` (``module:Class``)."""
    classes = tuple(pkgutil.resolve_name(name) for name in added)
    if not registered:
        return classes
    # Only here: a run on added handlers alone (the core's proof) never reads the application, which a user replaces.
    return (*application.registered(), *classes)


def _policy(
    plan: Plan, journal: Journal, rng: random.Random, table: str, zombies: Zombies, *, relay: bool = False
) -> FaultPolicy:
    """The runtime's faults: the plan's rates, and what it still owes of the forced ones after its earlier lives."""
    rates = {FaultKind(kind): rate for kind, rate in plan.rates.items()}
    forced = Counter({FaultKind(kind): count - journal.paid[kind] for kind, count in plan.forced.items()})
    return FaultPolicy(rates, random.Random(rng.random()), journal, table, zombies, +forced, plan.forced_on, relay)


class Environment:
    """One runtime process: its journal, its clock, its faults, its consumer."""

    def __init__(self, plan: Plan) -> None:
        run_dir = Path(plan.run_dir)
        self.journal = Journal(run_dir / plan.journal)
        self._rng = random.Random(f"{plan.seed}:{self.journal.cold_starts}")
        self._skew_s = self._rng.uniform(-1, 1) * plan.max_skew_ms / 1000
        self.journal.write("init", skew_ms=round(self._skew_s * 1000))
        settings = Settings.model_validate_json(plan.settings)
        table = settings.idempotency_table_name
        # Outside the fault hooks: the zombie watches the record as an operator would.
        watcher = boto3.session.Session().client("dynamodb")

        def owner_of(record_id: str) -> str | None:
            item = watcher.get_item(TableName=table, Key={Attr.ID: {"S": record_id}}, ConsistentRead=True).get("Item")
            return item[Attr.OWNER_TOKEN]["S"] if item else None

        self.faults = _policy(
            plan, self.journal, self._rng, table, Zombies(run_dir, plan.max_paused, plan.max_pause_s, owner_of)
        )
        self._deadline_margin_ms = plan.deadline_margin_ms
        session = boto3.session.Session()
        install_faults(session, self.faults, services=("dynamodb", "sqs"))
        # Built as the function builds them.
        handlers = build_handlers(handler_classes(plan.registered, plan.handlers), settings)
        for built in handlers.values():
            if built.mode is Mode.LOCK:
                built.handle = self.faults.slowed(built.handle, built.event_type, plan.slow_handler_s)  # type: ignore[method-assign,assignment]
        self.consumer = pkgutil.resolve_name(plan.consumer)(settings, session, clock=self.clock, handlers=handlers)

    def clock(self) -> float:
        return time.time() + self._skew_s

    def early_deadline(self, context: Any) -> Callable[[], int]:
        """For a deadline fault, a remaining time that runs out partway through the batch (the runtime's own stays)."""
        self.faults.inject(FaultKind.DEADLINE)
        ends = time.monotonic() + (self._deadline_margin_ms + self._rng.uniform(0, 400)) / 1000

        def remaining() -> int:
            return min(context.get_remaining_time_in_millis(), int((ends - time.monotonic()) * 1000))

        return remaining

    def invoke(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        records = event.get("Records") or []
        receives = [int((record.get("attributes") or {}).get("ApproximateReceiveCount", "1")) for record in records]
        # Each delivery's key: the only name the harness has for a message the relay sent.
        keys = {record.get("messageId"): _key(record.get("body")) for record in records}
        self.journal.write("invoked", redelivered=sum(count > 1 for count in receives), keys=keys)
        self.faults.new_invocation()
        early = self.faults.roll(FaultKind.DEADLINE)
        batch = self.consumer.process(
            records, self.early_deadline(context) if early else context.get_remaining_time_in_millis
        )
        results = [[result.message_id, result.outcome, result.reason] for result in batch.results]
        self.journal.write(
            "results", results=results, deadline=early, conflicts_absorbed=batch.grouping.conflicts_absorbed
        )
        response: dict[str, Any] = batch.response()
        return response


def _key(body: object) -> str | None:
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return str(json.loads(str(body))["metadata"]["idempotencyKey"])
    return None


@lru_cache(maxsize=1)
def _environment() -> Environment:
    # On the first invocation, not at import: the fleet's handler check imports this module too.
    return Environment(Plan(**json.loads(os.environ[PLAN_VARIABLE])))


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return _environment().invoke(event, context)


@lru_cache(maxsize=1)
def _relay() -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    from consumer.relay import RelayHandler  # noqa: PLC0415 (the consumer's runtimes never build a relay)

    plan = Plan(**json.loads(os.environ[PLAN_VARIABLE]))
    run_dir = Path(plan.run_dir)
    journal = Journal(run_dir / plan.journal)
    rng = random.Random(f"{plan.seed}:{journal.cold_starts}")
    journal.write("init", skew_ms=0)
    # No table: the relay writes no record, and its faults are the transport's and the crash after a send.
    faults = _policy(plan, journal, rng, "", Zombies(run_dir, 0, 0, lambda _: None), relay=True)
    session = boto3.session.Session()
    install_faults(session, faults, services=("sqs", "sns", "events"))
    relay = RelayHandler(session=session._session)
    return lambda event, context: dict(relay(event, context))


def relay_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The outbox's relay (``consumer.relay``) with the run's faults on its sends (``_HANDLER`` of the relay's
    environment)."""
    return _relay()(event, context)
