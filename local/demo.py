"""``make demo``: a realistic workload through the whole local pipeline, then every invariant checked.

Phase 1 sends payments (a quarter on one hot account), receipt requests, producer resends and
poison of each kind; the webhook answers 503 twice for one receipt (retried) and 422 for another
(dead-lettered). Phase 2, once the queue has drained, resends some applied payments late and
reuses two of their keys with another payload. With ``--fifo`` the queue is FIFO, one message
group per account, and each group's order is checked too (``local.fifo``).
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from consumer.errors import ErrorType
from local import fifo
from local.function_output import command_output, outcome_counts
from local.session import running_stack
from local.stack import DeployedStack
from local.state import STATE_DIR
from testkit import dead_letters, messages
from testkit.webhook import Answer, WebhookSink

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
    """Wait until the queue is empty, showing progress.

    Returns the seconds until every message had been handled once (the throughput) and until
    the queue was empty (retried records wait out their backoff).
    """
    sqs = stack.servers.client("sqs")
    started = time.monotonic()
    received_before, deleted_before = stack.stats.received, stack.stats.deleted
    first_pass: float | None = None
    last_shown = 0.0
    while time.monotonic() - started < _DRAIN_TIMEOUT_S:
        waiting, in_flight = messages.queue_counts(sqs, stack.queue.url)
        if first_pass is None and waiting == 0 and stack.stats.received - received_before >= sent:
            first_pass = time.monotonic() - started
        if waiting + in_flight == 0:
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


def _workload(args: argparse.Namespace, sink: WebhookSink) -> tuple[list[messages.Outgoing], list[messages.Outgoing]]:
    rng = random.Random(args.seed)
    # A hot account: a share of all payments on one account, as a busy merchant's would be.
    hot_count = round(args.payments * args.hot_share)
    payments = [
        *messages.payments(args.payments - hot_count, args.accounts, rng),
        *messages.payments(hot_count, 1, rng, prefix="hot"),
    ]
    receipts = messages.receipts(args.receipts, args.accounts, rng)
    flaky, rejected = receipts[0], receipts[1]
    sink.answer_next(Answer(503), Answer(503), key=flaky.key)
    # Twice: a second delivery of the same message must be rejected too, not accepted.
    sink.answer_next(Answer(422), Answer(422), key=rejected.key)
    rejected_poison = messages.Outgoing(rejected.body, "poison", rejected.key, ErrorType.WEBHOOK_REJECTED)
    resent = messages.with_resends([*payments, *receipts[2:]], args.duplicates, rng)
    first = [*resent, flaky, rejected_poison, *messages.poison(2)]
    rng.shuffle(first)
    # Late: resends of applied payments, and two of their keys reused for another payload.
    late = [m for m in payments if rng.random() < 0.1]
    late += [
        o
        for reused in payments[:2]
        for o in messages.poison(1, reused)
        if o.expected_error == ErrorType.IDEMPOTENCY_KEY_REUSED
    ]
    rng.shuffle(late)
    return first, late


def _checks(
    stack: DeployedStack,
    sink: WebhookSink,
    sent: list[messages.Outgoing],
    outcomes: Counter[str],
    parked: list[dead_letters.DeadLetter],
) -> list[Check]:
    valid = [m for m in sent if m.kind in ("payment", "receipt")]
    distinct_keys = {m.key for m in valid}
    receipt_keys = {m.key for m in valid if m.kind == "receipt"}
    expected_errors = Counter(m.expected_error for m in sent if m.kind == "poison")
    # One per original message: SQS may deliver a poison message twice, and each copy is parked.
    parked_errors = Counter(dead_letters.reasons(parked).values())
    expected = messages.expected_balances(sent)
    balances, payment_entries, receipt_entries = stack.ledger_totals()
    distinct_payments = len({m.payload["paymentId"] for m in valid if m.kind == "payment" and m.payload})
    accepted = {r.idempotency_key for r in sink.received() if r.status == 200}
    waiting, in_flight = messages.queue_counts(stack.servers.client("sqs"), stack.queue.url)
    expected_by_name = {str(error): count for error, count in sorted(expected_errors.items(), key=lambda e: str(e[0]))}
    total = sum(expected.values())
    return [
        Check(
            balances == expected,
            f"every balance is the sum of its distinct payments ({len(expected)} accounts, {total} cents)",
        ),
        Check(payment_entries == distinct_payments, f"{payment_entries} ledger payment entries, one per payment"),
        Check(outcomes["applied"] == len(distinct_keys), f"applied once per idempotency key ({len(distinct_keys)})"),
        # At least: SQS itself may deliver a message twice, and that copy is suppressed too.
        Check(
            outcomes["duplicate"] >= len(valid) - len(distinct_keys),
            f"every producer resend suppressed ({len(valid) - len(distinct_keys)})",
        ),
        Check(parked_errors == expected_errors, f"dead-lettered as expected: {expected_by_name}"),
        Check(
            receipt_entries == len(receipt_keys) and accepted == receipt_keys,
            f"{len(receipt_keys)} receipts accepted by the webhook and recorded once",
        ),
        Check(all(r.idempotency_key for r in sink.received()), "every webhook call carried an Idempotency-Key header"),
        Check(not sink.unverified(), f"every webhook call signed and verified ({len(sink.unverified())} failed)"),
        Check(waiting + in_flight == 0, "nothing left in the queue"),
    ]


def _fifo_checks(stack: DeployedStack, sent: dict[str, messages.Outgoing], log: fifo.CompletionLog) -> list[Check]:
    groups = len({message.group_id for message in sent.values()})
    disorder = fifo.out_of_order(sent, log.positions())
    applied_by = fifo.payment_entries(stack.servers.client("dynamodb"), stack.table_name("LedgerTable"))
    overtaken = fifo.not_first_copies(sent, applied_by)
    return [
        Check(not disorder, f"every message group completed in the order sent ({groups} groups)" + _first(disorder)),
        Check(
            not overtaken, "every payment applied by its first copy sent (the ledger's messageId)" + _first(overtaken)
        ),
    ]


def _first(problems: list[str]) -> str:
    return f": {len(problems)} violations, first: {problems[0]}" if problems else ""


def _summary(
    say: Callable[[str], None],
    sent: list[messages.Outgoing],
    outcomes: Counter[str],
    parked: list[dead_letters.DeadLetter],
    sink: WebhookSink,
    throughput: str,
) -> None:
    kinds = Counter(m.kind for m in sent)
    resends = len(sent) - kinds["poison"] - len({m.key for m in sent if m.kind in ("payment", "receipt")})
    reasons = Counter(letter.error_type or "redrive policy" for letter in parked)
    posts = sink.received()
    say("\nSummary")
    say(
        f"  sent                   {len(sent)} messages: {kinds['payment']} payments, {kinds['receipt']} receipt "
        f"requests ({resends} of them producer resends), {kinds['poison']} poison"
    )
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
        first, late = _workload(args, sink)
        sqs = stack.servers.client("sqs")
        grouped = " in one message group per account" if stack.queue.fifo else ""
        say(f"2/4 sending {len(first)} messages (payments, receipts, producer resends, poison) to {stack.queue.name}")
        by_id = messages.send_all(sqs, stack.queue.url, first)
        say(f"3/4 consuming with {args.pollers} pollers (BatchSize {stack.trigger.batch_size}){grouped}")
        say(f"    the function's logs and metrics: {DEMO_LOG}")
        pollers = stack.pollers(args.pollers, on_batch=completions.record)
        first_pass, drained = _drain(stack, say, len(first))
        throughput = (
            f"{len(first)} messages handled in {first_pass:.1f}s = {len(first) / first_pass:.0f} msg/s "
            f"with {args.pollers} pollers (BatchSize {stack.trigger.batch_size}); "
            f"queue empty after {drained:.1f}s (retries wait out their backoff)"
        )
        say(f"    {throughput}")
        say(f"4/4 late resends of applied payments and key reuse: {len(late)} messages")
        by_id.update(messages.send_all(sqs, stack.queue.url, late))
        _drain(stack, say, len(late))
        pollers.stop()
        sent = [*first, *late]
        outcomes = outcome_counts(DEMO_LOG)
        parked = dead_letters.peek(sqs, stack.dead_letter_queue.url)
        _summary(say, sent, outcomes, parked, sink, throughput)
        checks = _checks(stack, sink, sent, outcomes, parked)
        if stack.queue.fifo:
            checks += _fifo_checks(stack, by_id, completions)
    say("\nChecks")
    failed = show_checks(checks, say, indent="  ")
    say(f"\n{'all checks passed' if not failed else f'{failed} check(s) FAILED'}; every process started has stopped")
    return 1 if failed else 0
