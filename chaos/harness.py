"""One run: the template deployed on the local stack, a seeded workload fed to pollers that invoke
the chaos function in Lambda's runtime with faults on, the queue drained, the history checked.

What makes it fast is the harness's own tuning, not the template's: a visibility timeout of seconds,
short leases and backoff, a high ``MaxReceiveCount`` so that redrive only catches what is stuck.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from http import HTTPStatus
from pathlib import Path
from typing import Any

from chaos.faults import DEFAULT_RATES, FaultKind
from chaos.invariants import RELAY_JOURNAL, Checker, EndState, History, Verdict, scan
from chaos.runtime_handler import PLAN_VARIABLE, WEBHOOK_VARIABLE, Plan, handler_classes
from consumer.config import Settings, destination_variable, table_variable
from consumer.errors import ErrorType
from consumer.handler import declared_destinations, declared_settings, declared_tables
from consumer.outbox import OUTBOX_TABLE
from local.demo import example_checks
from local.poller import Poller, PollerGroup
from local.stack import webhook_parameters
from local.stream_poller import StreamPoller, StreamPollerStats
from testkit import application, dead_letters, payloads
from testkit.conflict_emulation import COMMITS_PATH
from testkit.lambda_runtime import LambdaEnvironment, check_handler
from testkit.lambda_venv import venv_python
from testkit.messages import Outgoing, drawn, envelope, queue_counts, send_all, with_resends
from testkit.resources import FunctionSpec, LocalResources
from testkit.servers import LocalServers
from testkit.tables import IDEMPOTENCY_TABLE, count, create_table
from testkit.template import REPO_ROOT, Template
from testkit.webhook import Answer, WebhookSink

# The runtime's task root stands for the deployment package: links to the core, the application when its handlers
# take part, and what the fault plan needs (``tests`` for the core's handlers and the negative controls' consumers).
_PACKAGES = {
    "consumer": REPO_ROOT / "src" / "consumer",
    **{name: REPO_ROOT / name for name in ("chaos", "local", "testkit", "tests")},
}
_APPLICATION = {application.PACKAGE: application.source(REPO_ROOT)}
_HANDLER = "chaos.runtime_handler.handler"
_RELAY_HANDLER = "chaos.runtime_handler.relay_handler"
# The consumer's settings that the run sets, under the same names as in ``ChaosConfig``.
_SETTINGS_OF_THE_RUN = (
    "lease_max_ms",
    "lease_min_ms",
    "lease_margin_ms",
    "deadline_margin_ms",
    "webhook_timeout_ms",
    "group_commit",
)


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 1
    messages: int = 1_000  # distinct messages, drawn from each handler's payload model in turn
    # Hot items: this share of the messages carries another's payload under a key of its own, so that
    # they contend for the same business items (and the handler's rules refuse or accept them).
    hot_share: float = 0.3
    pollers: int = 3
    duplicate_ratio: float = 0.2  # resends: the same key and body again, with a new messageId
    poison_ratio: float = 0.02  # of ``messages``; one in four of them reuses a key with another payload
    rates: Mapping[FaultKind, float] = field(default_factory=lambda: dict(DEFAULT_RATES))
    # Per kind, faults injected at their first opportunities whatever the draws: in each execution environment,
    # and for the webhook's kinds at the head of its answers. Empty: every fault drawn at its rate.
    forced: Mapping[FaultKind, int] = field(default_factory=dict)
    consumer: str = "consumer.app:wire"  # module:callable(settings, session, *, clock) building the consumer
    # module:Class of handlers added to the registered ones (their tables, if not the template's, made by the run).
    handlers: tuple[str, ...] = ()
    # Whether the application's registered handlers take part; without them, ``handlers`` alone and nothing of the
    # application is read (the core's proof, which must hold whatever a user registers).
    registered: bool = True
    # A table the run makes, by logical id: its properties as a template gives them (keys, billing). Any other it makes
    # is shaped as the idempotency table (key ``id``).
    table_properties: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    forced_on: str | None = None  # the event type whose records take the forced crashes and zombies (None: any)
    visibility_timeout_s: int = 2
    max_receive_count: int = 30
    lease_max_ms: int = 1_500
    lease_min_ms: int = 300
    lease_margin_ms: int = 300
    deadline_margin_ms: int = 300
    max_skew_ms: int = 300
    webhook_timeout_ms: int = 400
    max_queue_depth: int = 100
    drain_timeout_s: float = 240.0
    group_commit: bool = True  # the consumer's GROUP_COMMIT: transitions ready at one moment share a transaction


@dataclass(frozen=True)
class ChaosReport:
    config: ChaosConfig
    sent: Mapping[str, Outgoing]  # by the messageId SQS gave it
    history: History
    end: EndState
    emulated_conflicts: int  # raised by the local stack's conflict emulation (overlapping transactions)
    verdicts: list[Verdict]
    duration_s: float
    relay: StreamPollerStats | None = None  # the outbox's relay, when the run's handlers emit

    @property
    def violations(self) -> int:
        return sum(verdict.violations for verdict in self.verdicts)


def chaos_handlers(config: ChaosConfig) -> tuple[payloads.Handler, ...]:
    return handler_classes(config.registered, config.handlers)


def build_workload(
    config: ChaosConfig, rng: random.Random, run_id: str, handlers: Sequence[payloads.Handler]
) -> tuple[list[Outgoing], list[payloads.SeedItem]]:
    """Messages drawn from each handler's model (some on another's payload: hot items), producer resends and
    poison, seeded; and the seed items they need."""
    originals: list[Outgoing] = []
    seeds: list[payloads.SeedItem] = []
    count = max(1, round(config.messages / len(handlers)))
    for index, handler in enumerate(handlers):
        drawn_payloads = payloads.valid_payloads(handler, count + 1, seed=config.seed * 1_000 + index)
        for n, payload in enumerate(drawn_payloads[:count]):
            hot = rng.choice(drawn_payloads[:n]) if n and rng.random() < config.hot_share else payload
            originals.append(drawn(handler, f"{run_id}-{handler.event_type}-{n}", hot))
        reused = drawn(handler, originals[-1].key or "", drawn_payloads[count])
        # The last key of each handler again with another payload: the other one dead-lettered as reused.
        poisoned = [Outgoing(reused.body, "reused", reused.key, group=reused.key)]
        seeds += [item for payload in drawn_payloads for item in payloads.seed_items(handler, payload)]
        for round_ in range(math.ceil(count * config.poison_ratio / 3)):
            invalid = payloads.invalid_payloads(handler, seed=round_)
            refused = envelope(handler.event_type, f"{run_id}-refused-{round_}", invalid[round_ % len(invalid)].payload)
            unknown = envelope("NoSuchEvent", f"{run_id}-{round_}", {})
            poisoned += [
                Outgoing(body, "poison", expected_error=error)
                for body, error in ((refused[:-1], ErrorType.INVALID_JSON), (unknown, ErrorType.UNKNOWN_EVENT_TYPE))
            ] + [Outgoing(refused, "poison", expected_error=ErrorType.SCHEMA_VIOLATION)]
        originals += poisoned
    return with_resends(originals, config.duplicate_ratio, rng), seeds


def _webhook_plan(config: ChaosConfig, rng: random.Random, calls: int) -> list[tuple[FaultKind | None, Answer]]:
    """Answers for the sink, in advance: the forced faults first, then drawn: 5xx, slow (within the timeout), or
    too slow (a 504 late)."""
    timeout_s = config.webhook_timeout_ms / 1000
    answers: dict[FaultKind | None, Callable[[], Answer]] = {
        FaultKind.WEBHOOK_ERROR: lambda: Answer(HTTPStatus.SERVICE_UNAVAILABLE),
        FaultKind.WEBHOOK_SLOW: lambda: Answer(HTTPStatus.OK, delay_s=rng.uniform(0.01, timeout_s / 4)),
        FaultKind.WEBHOOK_TIMEOUT: lambda: Answer(HTTPStatus.GATEWAY_TIMEOUT, delay_s=timeout_s * 2.5),
        None: Answer,
    }
    kinds = [kind for kind in answers if kind is not None]
    forced = [kind for kind in kinds for _ in range(config.forced.get(kind, 0))]
    bands = list(itertools.accumulate(config.rates.get(kind, 0.0) for kind in kinds))
    plan: list[tuple[FaultKind | None, Answer]] = []
    for index in range(calls):
        draw = rng.random()
        drawn = next((kind for kind, band in zip(kinds, bands, strict=True) if draw < band), None)
        kind = forced[index] if index < len(forced) else drawn
        plan.append((kind, answers[kind]()))
    return plan


def _settings(
    function_environment: Mapping[str, str], config: ChaosConfig, handlers: Sequence[payloads.Handler]
) -> Settings:
    overrides = {name.upper(): str(getattr(config, name)) for name in _SETTINGS_OF_THE_RUN} | {
        "RETRY_BACKOFF_BASE_SECONDS": "1",
        "RETRY_BACKOFF_MAX_SECONDS": str(config.visibility_timeout_s),
    }
    # Validated as the function validates its environment: the cross-field rules apply.
    return Settings.from_env(
        {**function_environment, **overrides}, declared_tables(handlers), declared_settings(handlers)
    )


def _plans(
    config: ChaosConfig, function_environment: Mapping[str, str], run_dir: Path, seeds: Sequence[int]
) -> list[Plan]:
    """What each execution environment's runtime reads at its cold starts, one per seed."""
    settings = _settings(function_environment, config, chaos_handlers(config)).model_dump_json()
    # Until a key held past its lease comes back to another runtime and is claimed there.
    taken_over_s = config.visibility_timeout_s + (config.lease_max_ms + 2 * config.max_skew_ms) / 1000
    return [
        Plan(
            run_dir=str(run_dir),
            journal=RELAY_JOURNAL if index == config.pollers else f"env-{index}.jsonl",
            seed=seed,
            settings=settings,
            rates={kind.value: rate for kind, rate in config.rates.items()},
            consumer=config.consumer,
            max_skew_ms=config.max_skew_ms,
            # A paused worker holds its poller; some must stay free to take the key over.
            max_paused=config.pollers - 1,
            max_pause_s=taken_over_s + 5,
            deadline_margin_ms=config.deadline_margin_ms,
            slow_handler_s=taken_over_s + 1,
            forced={kind.value: count for kind, count in config.forced.items()},
            forced_on=config.forced_on,
            handlers=list(config.handlers),
            registered=config.registered,
        )
        for index, seed in enumerate(seeds)
    ]


def _environments(
    servers: LocalServers,
    function: FunctionSpec,
    config: ChaosConfig,
    run_dir: Path,
    seeds: list[int],
    relay: FunctionSpec | None = None,
) -> list[LambdaEnvironment]:
    """One execution environment per poller, chaos's handler in place of the function's, then the relay's if one is
    given. Each has a seed and a journal of its own, so that its n-th cold start draws the same faults whatever the
    others do."""
    task_root = run_dir / "task"
    task_root.mkdir()
    for name, source in (_PACKAGES | (_APPLICATION if config.registered else {})).items():
        (task_root / name).symlink_to(source, target_is_directory=True)
    python = venv_python()
    plans = _plans(config, function.environment, run_dir, seeds)
    functions = [(function, _HANDLER, f"chaos-{index}") for index in range(config.pollers)]
    functions += [(relay, _RELAY_HANDLER, "chaos-relay")] if relay is not None else []
    environments: list[LambdaEnvironment] = []
    for (spec, handler, name), plan in zip(functions, plans, strict=False):
        packaged = replace(spec, handler=handler, code_dir=task_root)
        # The function's environment puts its clients on the local endpoints (AWS_ENDPOINT_URL_*).
        shared = {**servers.function_environment(spec), "PYTHONPATH": str(task_root)}
        if not environments or spec is relay:
            check_handler(packaged, shared, python)
        variables = {**shared, PLAN_VARIABLE: json.dumps(asdict(plan))}
        environments.append(LambdaEnvironment(packaged, variables, python=python, name=name))
    return environments


def _relay_of(resources: LocalResources, handlers: Sequence[payloads.Handler], address: str) -> FunctionSpec | None:
    """The template's relay when the run's handlers emit, every destination they declare being the run's queue: what
    they emit comes back to the consumer, a chain of two consumers through the outbox."""
    destinations = declared_destinations(handlers)
    if not destinations:
        return None
    (relay,) = [function for function in resources.functions.values() if function.streams]
    addresses = {destination_variable(destination): address for destination in destinations}
    return replace(relay, environment={**relay.environment, **addresses})


def _relayed(pollers: Sequence[Poller | StreamPoller], dynamodb: Any, outbox: str) -> bool:
    """Every outbox item's stream record sent or given up (each item is one record); True with no relay."""
    relays = [poller.stats for poller in pollers if isinstance(poller, StreamPoller)]
    return not relays or sum(each.checkpointed + each.given_up for each in relays) >= count(dynamodb, outbox)


def _wait_until_drained(sqs: Any, queue_url: str, timeout_s: float, relayed: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    empty_in_a_row = 0
    while time.monotonic() < deadline:
        empty = sum(queue_counts(sqs, queue_url)) == 0 and relayed()
        empty_in_a_row = empty_in_a_row + 1 if empty else 0
        if empty_in_a_row >= 3:
            return True
        time.sleep(0.5)
    return False


def _emulated_conflicts(servers: LocalServers) -> int:
    """Conflicts the local stack's emulation has raised so far (its proxy counts for every run on it)."""
    assert servers.dynamodb.proxy is not None
    stats = servers.dynamodb.proxy.stats()
    return stats.get("transactions_cancelled", 0) + stats.get("writes_refused", 0)


def _handler_tables(
    dynamodb: Any,
    resources: LocalResources,
    handlers: Sequence[payloads.Handler],
    prefix: str,
    properties: Mapping[str, Mapping[str, Any]],
) -> dict[str, str]:
    """Every handler's tables by logical id: the stack's, and for a table the template lacks (a core test's
    handler), one made here in its shape from ``properties``, else in the idempotency table's (key ``id``)."""
    tables = declared_tables(handlers)
    ours = {table: f"{prefix}-{table}" for table in tables if table not in resources.tables}
    for table, name in ours.items():
        create_table(dynamodb, name, properties.get(table) or Template.from_file().properties(IDEMPOTENCY_TABLE))
    return {table: ours.get(table) or resources.tables[table].name for table in tables}


def run(config: ChaosConfig, servers: LocalServers) -> ChaosReport:
    """One run on running ``servers``; a fresh stack (queues, tables) of its own."""
    started = time.monotonic()
    rng = random.Random(config.seed)
    run_id = uuid.UUID(int=rng.getrandbits(128)).hex[:8]
    handlers = chaos_handlers(config)
    workload, seeds_items = build_workload(config, rng, run_id, handlers)
    history = History()
    # The pollers share it, as they did the harness's: a pool for them all.
    sqs = servers.client("sqs", max_pool_connections=50, timeout_s=30.0)
    dynamodb = servers.client("dynamodb")
    with WebhookSink() as sink, tempfile.TemporaryDirectory(prefix="chaos-run-", ignore_cleanup_errors=True) as run_dir:
        webhook_plan = _webhook_plan(config, rng, calls=4 * max(1, config.messages))
        sink.answer_next(*(answer for _, answer in webhook_plan))
        resources = servers.deploy(
            # Unique even when a seed is replayed on the same servers.
            stack_name=f"chaos-{run_id}-{uuid.uuid4().hex[:6]}",
            parameter_overrides={
                **webhook_parameters(sink),
                "MaxReceiveCount": config.max_receive_count,
                "LogLevel": "CRITICAL",
            },
        )
        prefix = f"chaos-{run_id}-{uuid.uuid4().hex[:6]}"
        tables = _handler_tables(dynamodb, resources, handlers, prefix, config.table_properties)
        payloads.put_seeds(dynamodb, tables, seeds_items)
        function = resources.function()
        # The tables of the handlers the run adds reach them as the template's reach the registered ones.
        variables = {table_variable(table): name for table, name in tables.items()} | {WEBHOOK_VARIABLE: sink.url}
        function = replace(function, environment=function.environment | variables)
        trigger = function.triggers[0]
        queue = resources.queues[trigger.queue_logical_id]
        sqs.set_queue_attributes(QueueUrl=queue.url, Attributes={"VisibilityTimeout": str(config.visibility_timeout_s)})
        relay = _relay_of(resources, handlers, queue.url)
        outbox = resources.tables[OUTBOX_TABLE].name
        # The relay's seed drawn last: a run whose handlers emit nothing draws as it did before the outbox.
        seeds = [rng.getrandbits(32) for _ in range(config.pollers + (relay is not None))]
        environments = _environments(servers, function, config, Path(run_dir), seeds, relay)
        emulated_before = _emulated_conflicts(servers)
        try:
            pollers: list[Poller | StreamPoller] = [
                Poller(sqs, queue, trigger, env.start(), on_batch=history.settled)
                for env in environments[: config.pollers]
            ]
            if relay is not None:
                streams = servers.client("dynamodbstreams")
                pollers.append(StreamPoller(streams, sqs, relay.streams[0], environments[-1].start()))
            # Stopped before the runtimes: an invocation under way settles its batch first.
            with PollerGroup(pollers):
                sent = send_all(sqs, queue.url, workload, max_depth=config.max_queue_depth)
                relayed = partial(_relayed, pollers, dynamodb, outbox)
                drained = _wait_until_drained(sqs, queue.url, config.drain_timeout_s, relayed)
        finally:
            for environment in environments:
                environment.stop()
        emulated = _emulated_conflicts(servers) - emulated_before
        history.read_journals(Path(run_dir))
        records_table = resources.tables[IDEMPOTENCY_TABLE].name
        assert servers.dynamodb.proxy is not None
        commits = servers.dynamodb.proxy.stats(COMMITS_PATH)
        end = EndState(
            records=scan(dynamodb, records_table),
            commits={
                record.partition("/")[2]: n for record, n in commits.items() if record.startswith(f"{records_table}/")
            },
            dead_letters=dead_letters.peek(sqs, resources.dead_letter_queue(queue).url),
            webhook_calls=sink.received(),
            drained=drained,
            outbox=scan(dynamodb, outbox),
        )
        checker = Checker(sent, end, history)
        # The examples' own checks are the application's: run only with its handlers.
        own = example_checks(dynamodb, tables.__getitem__, checker.applied_payloads) if config.registered else []
        verdicts = [*checker.all(), *(Verdict(check.text, int(not check.passed), []) for check in own)]
    history.faults.update(kind for kind, _ in webhook_plan[: len(end.webhook_calls)] if kind is not None)
    return ChaosReport(
        config=config,
        sent=sent,
        history=history,
        end=end,
        emulated_conflicts=emulated,
        verdicts=verdicts,
        duration_s=time.monotonic() - started,
        relay=next((p.stats for p in pollers if isinstance(p, StreamPoller)), None),
    )
