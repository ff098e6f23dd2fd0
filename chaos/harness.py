"""One run: deploy the template on the local stack, feed the workload to several pollers with
faults on, drain, wait out the leases, and check the whole history.

Everything that makes the run fast is the harness's own tuning, not the template's:
a visibility timeout of seconds (set on the queue after deploying), short leases
and backoff (``Settings``), a high ``MaxReceiveCount`` so that redrive only catches
what is really stuck.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from chaos.faults import DEFAULT_RATES, FaultKind, FaultLog
from chaos.function import ChaosFunction, ConsumerFactory, FaultPlan, InvocationHistory, chaos_functions
from chaos.invariants import Checker, EndState, Verdict, scan
from chaos.workload import Workload, WorkloadShape, build_workload
from consumer.app import wire
from consumer.config import Settings
from local.poller import Poller, PollerGroup, PollerStats
from testkit import dead_letters
from testkit.messages import Outgoing, queue_counts, send_all
from testkit.resources import FunctionSpec, LocalResources, QueueResource, SqsTrigger
from testkit.servers import LocalServers
from testkit.tables import IDEMPOTENCY_TABLE, LEDGER_TABLE
from testkit.webhook import Answer, WebhookSink


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 1
    messages: int = 1_000
    accounts: int = 20
    # The hot-item workload: this share of all payments on ``hot_accounts`` accounts.
    hot_share: float = 0.3
    hot_accounts: int = 2
    pollers: int = 3
    receipt_ratio: float = 0.25
    duplicate_ratio: float = 0.2
    poison_ratio: float = 0.02
    rates: Mapping[FaultKind, float] = field(default_factory=lambda: dict(DEFAULT_RATES))
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


@dataclass(frozen=True)
class Conflicts:
    """Transaction conflicts of the run, and what the consumer made of them."""

    injected: int  # answered in DynamoDB's place by the conflict fault
    emulated: int  # raised by the local stack's conflict emulation (overlapping transactions)
    absorbed: int  # retried in process within the record's time (the records' ``conflicts_absorbed``)
    returned: int  # records handed back to SQS with the ``conflict`` outcome

    @property
    def seen(self) -> int:
        return self.injected + self.emulated


@dataclass(frozen=True)
class ChaosReport:
    config: ChaosConfig
    workload: Workload
    sent: int
    faults: Mapping[FaultKind, int]
    zombies_without_takeover: int
    history: InvocationHistory
    pollers: PollerStats
    dead_letters: Mapping[str, int]  # reason (or "redrive") -> count
    webhook_calls: int
    # Receipts whose webhook was called more than once (each allowed only after a failed attempt).
    receipts_called_again: int
    conflicts: Conflicts
    verdicts: list[Verdict]
    duration_s: float

    @property
    def violations(self) -> int:
        return sum(verdict.violations for verdict in self.verdicts)


def _settings(function_environment: Mapping[str, str], config: ChaosConfig) -> Settings:
    overrides = {
        "lease_max_ms": config.lease_max_ms,
        "lease_min_ms": config.lease_min_ms,
        "lease_margin_ms": config.lease_margin_ms,
        "deadline_margin_ms": config.deadline_margin_ms,
        "webhook_timeout_ms": config.webhook_timeout_ms,
        "retry_backoff_base_seconds": 1,
        "retry_backoff_max_seconds": config.visibility_timeout_s,
    }
    # Validated as the function validates its environment: the cross-field rules apply.
    return Settings.model_validate({**Settings.from_env(function_environment).model_dump(), **overrides})


def _webhook_plan(config: ChaosConfig, rng: random.Random, calls: int) -> list[Answer]:
    """Answers for the sink, drawn in advance: 5xx, slow (within the timeout), or too slow (a 504 late)."""
    timeout_s = config.webhook_timeout_ms / 1000
    plan: list[Answer] = []
    for _ in range(calls):
        draw = rng.random()
        error = config.rates.get(FaultKind.WEBHOOK_ERROR, 0.0)
        slow = error + config.rates.get(FaultKind.WEBHOOK_SLOW, 0.0)
        too_slow = slow + config.rates.get(FaultKind.WEBHOOK_TIMEOUT, 0.0)
        if draw < error:
            plan.append(Answer(HTTPStatus.SERVICE_UNAVAILABLE))
        elif draw < slow:
            plan.append(Answer(HTTPStatus.OK, delay_s=rng.uniform(0.01, timeout_s / 4)))
        elif draw < too_slow:
            plan.append(Answer(HTTPStatus.GATEWAY_TIMEOUT, delay_s=timeout_s * 2.5))
        else:
            plan.append(Answer(HTTPStatus.OK))
    return plan


def _count_planned(plan: list[Answer]) -> Counter[FaultKind]:
    """The webhook faults among the answers actually given."""
    counts: Counter[FaultKind] = Counter()
    for answer in plan:
        if answer.status == HTTPStatus.SERVICE_UNAVAILABLE:
            counts[FaultKind.WEBHOOK_ERROR] += 1
        elif answer.status == HTTPStatus.GATEWAY_TIMEOUT:
            counts[FaultKind.WEBHOOK_TIMEOUT] += 1
        elif answer.delay_s:
            counts[FaultKind.WEBHOOK_SLOW] += 1
    return counts


def _wait_until_drained(sqs: Any, queue_url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    empty_in_a_row = 0
    while time.monotonic() < deadline:
        empty_in_a_row = empty_in_a_row + 1 if sum(queue_counts(sqs, queue_url)) == 0 else 0
        if empty_in_a_row >= 3:
            return True
        time.sleep(0.5)
    return False


@dataclass(frozen=True)
class _Stack:
    """The template deployed for one run, and the clients that watch it from outside the function.

    Not ``local.stack.DeployedStack``: chaos runs its own handler in Lambda's runtime
    (``chaos.runtime_handler``), to put its hooks between the consumer and its endpoints.
    """

    resources: LocalResources
    function: FunctionSpec
    sqs: Any
    dynamodb: Any

    @property
    def trigger(self) -> SqsTrigger:
        return self.function.triggers[0]

    @property
    def queue(self) -> QueueResource:
        return self.resources.queues[self.trigger.queue_logical_id]

    def end_state(self, sink: WebhookSink, drained: bool) -> EndState:
        return EndState(
            ledger=scan(self.dynamodb, self.resources.tables[LEDGER_TABLE].name),
            records=scan(self.dynamodb, self.resources.tables[IDEMPOTENCY_TABLE].name),
            dead_letters=dead_letters.peek(self.sqs, self.resources.dead_letter_queue(self.queue).url),
            webhook_calls=sink.received(),
            drained=drained,
        )


def _deploy(servers: LocalServers, config: ChaosConfig, run_id: str, webhook_url: str) -> _Stack:
    """The template's resources, the queue's visibility timeout cut to the run's."""
    resources = servers.deploy(
        # Unique even when a seed is replayed on the same servers.
        stack_name=f"chaos-{run_id}-{uuid.uuid4().hex[:6]}",
        parameter_overrides={
            "ReceiptWebhookUrl": webhook_url,
            "MaxReceiveCount": config.max_receive_count,
            "LogLevel": "CRITICAL",
        },
    )
    stack = _Stack(
        resources,
        resources.function(),
        sqs=servers.client("sqs", max_pool_connections=50, timeout_s=30.0),
        dynamodb=servers.client("dynamodb", max_pool_connections=20),
    )
    stack.sqs.set_queue_attributes(
        QueueUrl=stack.queue.url, Attributes={"VisibilityTimeout": str(config.visibility_timeout_s)}
    )
    return stack


def _emulated_conflicts(servers: LocalServers) -> int:
    """Conflicts the local stack's emulation has raised so far (its proxy counts for every run on it)."""
    proxy = servers.dynamodb.proxy
    if proxy is None:
        return 0
    stats = proxy.stats()
    return stats.get("transactions_cancelled", 0) + stats.get("writes_refused", 0)


def _drive(
    config: ChaosConfig,
    stack: _Stack,
    functions: list[ChaosFunction],
    workload: Workload,
    stats: PollerStats,
) -> tuple[dict[str, Outgoing], bool]:
    """Feed the workload to the pollers until the queue drains (or the time limit); then stop them."""
    sqs = stack.sqs
    pollers = [Poller(sqs, stack.queue, stack.trigger, function, on_batch=stats.add) for function in functions]
    with PollerGroup(pollers):
        sent = send_all(sqs, stack.queue.url, workload.messages, max_depth=config.max_queue_depth)
        drained = _wait_until_drained(sqs, stack.queue.url, config.drain_timeout_s)
    return sent, drained


def run(config: ChaosConfig, servers: LocalServers, consumer_factory: ConsumerFactory = wire) -> ChaosReport:
    """One run on running ``servers``; a fresh stack (queues, tables) of its own."""
    started = time.monotonic()
    rng = random.Random(config.seed)
    run_id = uuid.UUID(int=rng.getrandbits(128)).hex[:8]
    shape = WorkloadShape(
        config.messages,
        config.accounts,
        config.receipt_ratio,
        config.duplicate_ratio,
        config.poison_ratio,
        config.hot_share,
        config.hot_accounts,
    )
    workload = build_workload(shape, rng, run_id)
    log = FaultLog()
    history = InvocationHistory()
    stats = PollerStats()
    # Long enough for a zombie's message to come back and another container to claim it.
    lease_slack_s = (config.lease_max_ms + 2 * config.max_skew_ms) / 1000
    max_pause_s = config.visibility_timeout_s + lease_slack_s + 5
    with WebhookSink() as sink:
        plan = _webhook_plan(config, rng, calls=4 * max(1, round(config.messages * config.receipt_ratio)))
        sink.answer_next(*plan)
        stack = _deploy(servers, config, run_id, sink.receipts_url)
        fault_plan = FaultPlan(
            settings=_settings(stack.function.environment, config),
            consumer_factory=consumer_factory,
            rates=config.rates,
            max_skew_ms=config.max_skew_ms,
            # A paused worker holds its poller; some must stay free to take the key over.
            max_paused=config.pollers - 1,
            max_pause_s=max_pause_s,
            deadline_margin_ms=config.deadline_margin_ms,
        )
        seeds = [rng.getrandbits(32) for _ in range(config.pollers)]
        # The function's environment puts the consumer's clients on the local endpoints (AWS_ENDPOINT_URL_*).
        environment = servers.function_environment(stack.function)
        emulated_before = _emulated_conflicts(servers)
        with chaos_functions(stack.function, environment, fault_plan, seeds, history, log) as functions:
            sent, drained = _drive(config, stack, functions, workload, stats)
        emulated = _emulated_conflicts(servers) - emulated_before
        # Leases run out; nothing may stay IN_PROGRESS whatever the clocks said.
        time.sleep(lease_slack_s)
        end = stack.end_state(sink, drained)
    for kind, count in _count_planned(plan[: len(end.webhook_calls)]).items():
        log.counts[kind] += count
    parked = Counter(letter.error_type or "redrive (no reason)" for letter in end.dead_letters)
    return ChaosReport(
        config=config,
        workload=workload,
        sent=len(sent),
        faults=dict(log.counts),
        zombies_without_takeover=log.zombies_without_takeover,
        history=history,
        pollers=stats,
        dead_letters=parked,
        webhook_calls=len(end.webhook_calls),
        receipts_called_again=sum(
            1 for count in Counter(call.idempotency_key for call in end.webhook_calls).values() if count > 1
        ),
        conflicts=Conflicts(
            injected=log.counts[FaultKind.TRANSACTION_CONFLICT],
            emulated=emulated,
            absorbed=history.conflicts_absorbed,
            returned=history.outcomes["conflict"],
        ),
        verdicts=Checker(sent, end, history, log).all(),
        duration_s=time.monotonic() - started,
    )
