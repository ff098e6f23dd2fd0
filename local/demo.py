"""``make demo``: a realistic workload through the whole local pipeline, then every invariant checked (with ``--fifo``
each group's order too); the workload's two phases and the checks: docs/local-stack.md."""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consumer.config import destination_variable
from consumer.errors import ErrorType
from consumer.handler import declared_tables
from consumer.outbox import OUTBOX_TABLE
from local import fifo
from local.function_output import command_output, outcome_counts
from local.session import running_stack
from local.stack import DeployedStack
from local.state import STATE_DIR
from testkit import dead_letters, messages, payloads
from testkit.tables import scan
from testkit.webhook import WebhookSink

DEMO_LOG = STATE_DIR / "demo-function.log"
_DRAIN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Check:
    passed: bool
    text: str


def show_checks(checks: list[Check], say: Callable[[str], None], indent: str = "") -> int:
    """One line per check; returns how many failed."""
    for check in checks:
        say(f"{indent}{'ok  ' if check.passed else 'FAIL'} {check.text}")
    return sum(not check.passed for check in checks)


def _drain(stack: DeployedStack, say: Callable[[str], None], sent: int) -> tuple[float, float]:
    """Seconds until every message was handled once (the throughput) and until the queue was empty (retried records
    wait out their backoff), showing progress."""
    sqs = stack.servers.client("sqs")
    started = time.monotonic()
    received_before, deleted_before = stack.stats.received, stack.stats.deleted
    first_pass: float | None = None
    last_shown = 0.0
    while time.monotonic() - started < _DRAIN_TIMEOUT_S:
        waiting, in_flight = messages.queue_counts(sqs, stack.queue.url)
        if first_pass is None and waiting == 0 and stack.stats.received - received_before >= sent:
            first_pass = time.monotonic() - started
        # The relay may still be sending what the outbox holds onto the queue: drained once both are.
        if waiting + in_flight == 0 and stack.outbox_items() <= stack.relay_stats.checkpointed:
            drained = time.monotonic() - started
            return first_pass or drained, drained
        if time.monotonic() - last_shown >= 1.0:
            last_shown = time.monotonic()
            say(
                f"    {stack.stats.deleted - deleted_before:>5} of {sent} done | queue: {waiting} waiting, "
                f"{in_flight} in flight or backing off | {stack.stats.invocations} invocations"
            )
        time.sleep(0.2)
    raise TimeoutError(f"the queue did not drain within {_DRAIN_TIMEOUT_S}s")


def _poison(
    event_type: str, key: str | None, payload: dict[str, Any], error: ErrorType, group: str | None = None
) -> messages.Outgoing:
    """A well-formed envelope the consumer must dead-letter for ``error``."""
    return messages.Outgoing(messages.envelope(event_type, key, payload), "poison", key, error, group=group)


def _workload(
    args: argparse.Namespace, stack: DeployedStack
) -> tuple[list[messages.Outgoing], list[messages.Outgoing]]:
    rng, run = random.Random(args.seed), f"{args.seed}"
    tables = {table: stack.table_name(table) for table in declared_tables(payloads.registered())}
    dynamodb = stack.servers.client("dynamodb")
    valid: list[messages.Outgoing] = []
    late: list[messages.Outgoing] = []
    poison = [
        messages.Outgoing('{"eventType": "Cut", "payload": ', "poison", None, ErrorType.INVALID_JSON),
        _poison("NoSuchEvent", "nobody", {}, ErrorType.UNKNOWN_EVENT_TYPE),
    ]
    for index, handler in enumerate(payloads.registered()):
        drawn = payloads.valid_payloads(handler, args.messages + 2, args.seed + index)
        ours = [messages.drawn(handler, f"{handler.event_type}-{run}-{n}", p) for n, p in enumerate(drawn[2:])]
        for message in ours:
            payloads.put_seeds(dynamodb, tables, payloads.seed_items(handler, message.payload or {}))
        valid += ours
        refused = payloads.invalid_payloads(handler, args.seed)[0].payload
        poison.append(_poison(handler.event_type, f"bad-{handler.event_type}", refused, ErrorType.SCHEMA_VIOLATION))
        # Late: two applied keys reused for another payload (drawn, so distinct from theirs).
        late += [
            _poison(handler.event_type, m.key, other, ErrorType.IDEMPOTENCY_KEY_REUSED, m.group)
            for m, other in zip(ours[:2], drawn[:2], strict=False)
        ]
    first = [*messages.with_resends(valid, args.duplicates, rng), *poison]
    rng.shuffle(first)
    late += [m for m in valid[2:] if rng.random() < 0.1]
    rng.shuffle(late)
    return first, late


def example_checks(
    dynamodb: Any, table_name: Callable[[str], str], applied: Callable[[str], list[dict[str, Any]]]
) -> list[Check]:
    """The registered examples' own checks (``tests/app/<event type>_checks.py``) on the payloads each applied."""
    registered, checks = {h.event_type for h in payloads.registered()}, []
    for path in sorted((Path(__file__).resolve().parent.parent / "tests").rglob("*_checks.py")):
        event_type = "".join(part.title() for part in path.stem.removesuffix("_checks").split("_"))
        if event_type not in registered:
            checks.append(Check(True, f"{event_type} not registered: its own checks ({path.name}) not run"))
            continue
        got = payloads.load_module(path).demo_checks(dynamodb, table_name, applied(event_type))
        checks += [Check(passed, f"{event_type}: {text}") for passed, text in got]
    return checks


def _checks(
    stack: DeployedStack, sink: WebhookSink, by_id: dict[str, messages.Outgoing], parked: list[dead_letters.DeadLetter]
) -> tuple[list[Check], set[str]]:
    sent = list(by_id.values())
    dynamodb = stack.servers.client("dynamodb")
    valid = [m for m in sent if m.kind == "drawn"]
    keys = {m.key for m in valid if m.key}
    records = scan(dynamodb, stack.table_name("IdempotencyTable"))
    applied = {r["id"]["S"].split("#", 1)[1] for r in records if r["status"]["S"] == "COMPLETED"}
    by_body = {letter.body: letter for letter in parked}
    refused = {m.key for m in valid if m.body in by_body and by_body[m.body].error_type}
    lost = keys - applied - refused
    expected_errors = Counter(str(m.expected_error) for m in sent if m.kind == "poison")
    # One per original message: SQS may deliver a poison message twice, and each copy is parked.
    parked_errors = Counter(
        str(error) for sent_id, error in dead_letters.reasons(parked).items() if by_id[sent_id].kind == "poison"
    )
    reasons = Counter(by_body[m.body].error_type for m in valid if m.key in refused)
    waiting, in_flight = messages.queue_counts(stack.servers.client("sqs"), stack.queue.url)
    return [
        Check(
            not lost and not applied & refused,
            f"every key applied once ({len(applied & keys)}) or dead-lettered with a reason "
            f"({dict(reasons)}); neither: {sorted(lost)[:3]}",
        ),
        Check(not [r for r in records if r["status"]["S"] != "COMPLETED"], "no record left in progress"),
        Check(
            parked_errors == expected_errors,
            f"poison dead-lettered as expected: {dict(sorted(expected_errors.items()))}",
        ),
        Check(not sink.unverified(), f"every webhook call signed and verified ({len(sink.unverified())} failed)"),
        Check(waiting + in_flight == 0, "nothing left in the queue"),
        _chain_check(stack, {r["id"]["S"] for r in records if r["status"]["S"] == "COMPLETED"}),
    ], applied


def _chain_check(stack: DeployedStack, completed: set[str]) -> Check:
    """Every message the outbox holds for the consumer's own queue was relayed and applied there, once."""
    relay = stack.relay_fleet.function.environment
    outbox = scan(stack.servers.client("dynamodb"), stack.table_name(OUTBOX_TABLE))
    ours = [item for item in outbox if relay.get(destination_variable(item["destination"]["S"])) == stack.queue.url]
    # Each is applied under its derived key, the record named by its event type (the envelope's).
    missing = [
        i["id"]["S"]
        for i in ours
        if messages.Outgoing(i["body"]["S"], messages.EMITTED, i["id"]["S"]).record_id not in completed
    ]
    return Check(
        not missing,
        f"every message emitted onto the queue ({len(ours)}) relayed and applied once; not applied: {missing[:3]}",
    )


def _fifo_checks(sent: dict[str, messages.Outgoing], log: fifo.CompletionLog) -> list[Check]:
    groups = len({message.group_id for message in sent.values()})
    disorder = fifo.out_of_order(sent, log.positions())
    first = f": {len(disorder)} violations, first: {disorder[0]}" if disorder else ""
    return [Check(not disorder, f"every message group completed in the order sent ({groups} groups){first}")]


def _summary(
    say: Callable[[str], None],
    sent: list[messages.Outgoing],
    outcomes: Counter[str],
    parked: list[dead_letters.DeadLetter],
    sink: WebhookSink,
    throughput: str,
) -> None:
    kinds = Counter(m.event_type if m.kind == "drawn" else m.kind for m in sent)
    resends = len(sent) - kinds["poison"] - len({m.key for m in sent if m.kind == "drawn"})
    reasons = Counter(letter.error_type or "redrive policy" for letter in parked)
    posts = sink.received()
    say("\nSummary")
    say(f"  sent                   {len(sent)} messages: {dict(kinds)} ({resends} of them producer resends)")
    say(f"  applied                {outcomes['applied']}")
    say(f"  duplicates suppressed  {outcomes['duplicate']}")
    say(
        f"  retried                {outcomes['retried'] + outcomes['in_flight'] + outcomes['conflict']} "
        f"({outcomes['retried']} transient failures, {outcomes['in_flight']} in flight elsewhere, "
        f"{outcomes['conflict']} still in conflict)"
    )
    say(
        f"  transaction conflicts  {outcomes['conflicts_absorbed']} absorbed in process, "
        f"{outcomes['conflict']} records handed back to SQS"
    )
    say(f"  dead-lettered          {len(parked)}: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())))
    say(f"  webhook                {len(posts)} POSTs, answers {dict(Counter(r.status for r in posts))}")
    say(f"  throughput             {throughput}")


def run_demo(args: argparse.Namespace) -> int:
    say = command_output(DEMO_LOG)
    say("1/4 starting DynamoDB Local, the moto SQS server and the webhook sink; creating template.yaml's resources")
    overrides = {"QueueType": "fifo"} if args.fifo else {}
    completions = fifo.CompletionLog()
    name = f"demo-{int(time.time())}"
    with running_stack(stack_name=name, parameter_overrides=overrides, memory_mb=args.memory) as (stack, sink):
        first, late = _workload(args, stack)
        sqs = stack.servers.client("sqs")
        grouped = " in one message group per key" if stack.queue.fifo else ""
        handlers = ", ".join(h.event_type for h in payloads.registered())
        say(f"2/4 sending {len(first)} messages ({handlers}, producer resends, poison) to {stack.queue.name}")
        by_id = messages.send_all(sqs, stack.queue.url, first)
        say(f"3/4 consuming with {args.pollers} pollers (BatchSize {stack.trigger.batch_size}){grouped}")
        say(f"    the function's logs and metrics: {DEMO_LOG}")
        pollers = stack.pollers(args.pollers, on_batch=completions.record)
        relays = stack.relays()
        first_pass, drained = _drain(stack, say, len(first))
        throughput = (
            f"{len(first)} messages handled in {first_pass:.1f}s = {len(first) / first_pass:.0f} msg/s "
            f"with {args.pollers} pollers (BatchSize {stack.trigger.batch_size}); "
            f"queue empty after {drained:.1f}s (retries wait out their backoff)"
        )
        say(f"    {throughput}")
        say(f"4/4 late resends of applied messages and key reuse: {len(late)} messages")
        by_id.update(messages.send_all(sqs, stack.queue.url, late))
        _drain(stack, say, len(late))
        pollers.stop()
        relays.stop()
        sent = [*first, *late]
        parked = dead_letters.peek(sqs, stack.dead_letter_queue.url)
        _summary(say, sent, outcome_counts(DEMO_LOG), parked, sink, throughput)
        checks, applied = _checks(stack, sink, by_id, parked)
        ours = [m for m in sent if m.kind == "drawn" and m.key in applied]
        checks += example_checks(
            stack.servers.client("dynamodb"),
            stack.table_name,
            lambda event: [m.payload for m in ours if m.event_type == event and m.payload],
        )
        if stack.queue.fifo:
            checks += _fifo_checks(by_id, completions)
    say("\nChecks")
    failed = show_checks(checks, say, indent="  ")
    say(f"\n{'all checks passed' if not failed else f'{failed} check(s) FAILED'}; every process started has stopped")
    return 1 if failed else 0
