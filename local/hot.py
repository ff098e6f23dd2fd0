"""``make hot``: a hot account through the conflict emulation, measured against its serial limit.

For each spread of payments (all on ONE account, then over 100 accounts), with a latency added
to every DynamoDB call: the serial limit (ONE poller, one account's payments, same pipeline) and
the item's ceiling (payment-shaped transactions straight to DynamoDB, one after another), then
the pipeline: payments and a share of receipt requests on those accounts, all sent at once while
the pollers consume them. Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local.function_output import command_output, outcome_counts
from local.poller import BatchReport, PollerGroup
from local.stack import DeployedStack, deploy_stack
from local.state import STATE_DIR
from testkit import messages as outgoing
from testkit.conflict_emulation import DEFAULT_HOLD_MS, ConflictEmulation
from testkit.dynamodb_local import DynamoDBLocal
from testkit.servers import LocalServers
from testkit.webhook import WebhookSink

HOT_LOG = STATE_DIR / "hot-function.log"
THROUGHPUT_TARGET = 0.80
RETURNED_TARGET = 0.01


@dataclass
class Tracker:
    """When each message was sent and first completed, and how many deliveries went back to SQS."""

    sent_at: dict[str, float] = field(default_factory=dict)
    messages: dict[str, outgoing.Outgoing] = field(default_factory=dict)
    done_at: dict[str, float] = field(default_factory=dict)
    deliveries: int = 0
    returned: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sent(self, messages: Mapping[str, outgoing.Outgoing], at: float) -> None:
        """``messages`` by the ``messageId`` SQS gave each."""
        with self._lock:
            self.sent_at.update(dict.fromkeys(messages, at))
            self.messages.update(messages)

    def applied(self) -> list[outgoing.Outgoing]:
        with self._lock:
            return [self.messages[message_id] for message_id in self.done_at if message_id in self.messages]

    def finished(self, report: BatchReport) -> None:
        """Pass as a poller's ``on_batch``: a record not completed (deleted) goes back to SQS."""
        at = time.time()
        with self._lock:
            self.deliveries += report.received
            self.returned += report.received - len(report.completed_ids)
            for message_id in report.completed_ids:
                self.done_at.setdefault(message_id, at)

    def all_done(self) -> bool:
        with self._lock:
            return len(self.done_at) >= len(self.sent_at)


@dataclass(frozen=True)
class Figures:
    accounts: int
    messages: int
    serial_per_s: float
    ceiling_per_s: float
    throughput_per_s: float
    p50_s: float
    p99_s: float
    deliveries: int
    returned: int
    not_done: int
    dead_lettered: int
    webhook_repeats: int
    proxy: dict[str, int]
    outcomes: dict[str, int]
    wrong_balances: int

    @property
    def share_of_serial(self) -> float:
        return self.throughput_per_s / self.serial_per_s if self.serial_per_s else 0.0

    @property
    def returned_share(self) -> float:
        return self.returned / self.messages if self.messages else 0.0

    def misses(self) -> list[str]:
        checks = [
            (self.share_of_serial >= THROUGHPUT_TARGET, f"throughput >= {THROUGHPUT_TARGET:.0%} of the serial limit"),
            (self.returned_share < RETURNED_TARGET, f"fewer than {RETURNED_TARGET:.0%} of records returned to SQS"),
            (self.dead_lettered == 0, "0 healthy messages in the DLQ"),
            (self.webhook_repeats == 0, "0 webhook calls repeated"),
            (self.not_done == 0, "every message applied before the timeout"),
            (self.wrong_balances == 0, "every balance the sum of its distinct applied payments"),
        ]
        return [text for passed, text in checks if not passed]


def _messages(count: int, accounts: int, receipt_share: float, rng: random.Random, run: str) -> list[outgoing.Outgoing]:
    receipts = round(count * receipt_share)
    made = [
        *outgoing.payments(count - receipts, accounts, rng, prefix=f"{run}-pay"),
        *outgoing.receipts(receipts, accounts, rng, prefix=f"{run}-rcpt"),
    ]
    rng.shuffle(made)
    return made


def serial_limit(
    stack: DeployedStack, payments: int, rng: random.Random, timeout_s: float, say: Callable[[str], None]
) -> float:
    """Payments per second ONE poller applies to one account: the same pipeline, batches in one lane each."""
    run = f"serial-{uuid.uuid4().hex[:6]}"
    # An account of its own, so the measured pipeline's balances stay the sums of its own payments.
    messages = [
        outgoing.payment(f"{run}-{index}", f"{run}-p{index}", run, rng.randrange(100, 100_000))
        for index in range(payments)
    ]
    tracker, first_sent, last_done = _pipeline(stack, messages, 1, timeout_s, say)
    if not tracker.all_done():
        raise RuntimeError(f"the serial run applied {len(tracker.done_at)} of {payments} payments in {timeout_s:.0f}s")
    return payments / max(last_done - first_sent, 1e-9)


def item_ceiling(stack: DeployedStack, payments: int) -> float:
    """Payment-shaped transactions per second on one item, one after another, straight to DynamoDB.

    What the hot item allows at all, whatever a consumer does: the record, the entry and the
    balance in one transaction, as the optimistic payment handler commits them.
    """
    dynamodb = stack.servers.client("dynamodb")
    records, ledger = stack.table_name("IdempotencyTable"), stack.table_name("LedgerTable")
    account = f"ceiling-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    for index in range(payments):
        dynamodb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": records, "Item": {"id": {"S": f"{account}#{index}"}}}},
                {"Put": {"TableName": ledger, "Item": {"accountId": {"S": account}, "entryId": {"S": f"P#{index}"}}}},
                {
                    "Update": {
                        "TableName": ledger,
                        "Key": {"accountId": {"S": account}, "entryId": {"S": "BALANCE"}},
                        "UpdateExpression": "ADD balanceCents :amount",
                        "ExpressionAttributeValues": {":amount": {"N": "100"}},
                    }
                },
            ]
        )
    return payments / (time.monotonic() - started)


def _pipeline(
    stack: DeployedStack,
    messages: Sequence[outgoing.Outgoing],
    pollers: int,
    timeout_s: float,
    say: Callable[[str], None],
) -> tuple[Tracker, float, float]:
    """Send everything while the pollers consume; returns the tracker, first send and last completion."""
    tracker = Tracker()
    sqs = stack.servers.client("sqs", max_pool_connections=50, timeout_s=30.0)
    group = PollerGroup([stack.poller(tracker.finished) for _ in range(pollers)])
    # Cold starts out of the measurement: each environment initialises on an empty batch first.
    for environment in stack.fleet.environments:
        environment.invoke({"Records": []})
    group.start()
    try:
        first_sent = time.time()
        for start in range(0, len(messages), 10):
            at, chunk = time.time(), messages[start : start + 10]
            tracker.sent(outgoing.send_all(sqs, stack.queue.url, chunk), at)
        deadline = time.monotonic() + timeout_s
        shown = time.monotonic()
        while not tracker.all_done() and time.monotonic() < deadline:
            time.sleep(0.05)
            if time.monotonic() - shown >= 5:
                shown = time.monotonic()
                say(f"    {len(tracker.done_at)} of {len(messages)} applied, {tracker.returned} returned to SQS")
    finally:
        group.stop()
    last_done = max(tracker.done_at.values(), default=time.time())
    return tracker, first_sent, last_done


def _percentile(values: Sequence[float], share: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[round(share * 100) - 1]


def measure(
    servers: LocalServers,
    dynamodb: DynamoDBLocal,
    sink: WebhookSink,
    args: argparse.Namespace,
    accounts: int,
    say: Callable[[str], None],
    function_log: Path = HOT_LOG,
) -> Figures:
    """One spread: the serial run, then the pipeline; the function logs (and its EMF) into ``function_log``."""
    rng = random.Random(args.seed + accounts)
    run = f"hot{accounts}-{uuid.uuid4().hex[:6]}"
    with function_log.open("a", encoding="utf-8", buffering=1) as log_sink:
        stack = deploy_stack(
            servers, stack_name=run, parameter_overrides={"BatchSize": args.batch_size}, webhook=sink, log_sink=log_sink
        )
        try:
            say(f"\n[{accounts} account(s)] item ceiling and serial run: {args.serial} payments on one account")
            ceiling = item_ceiling(stack, args.serial)
            serial = serial_limit(stack, args.serial, rng, args.timeout, say)
            say(f"[{accounts} account(s)] pipeline: {args.messages} messages")
            messages = _messages(args.messages, accounts, args.receipts, rng, run)
            sink.clear()
            outcomes_before = outcome_counts(function_log)
            proxy_before = dynamodb.proxy.stats() if dynamodb.proxy else {}
            tracker, first_sent, last_done = _pipeline(stack, messages, args.pollers, args.timeout, say)
            proxy_after = dynamodb.proxy.stats() if dynamodb.proxy else {}
            dead_lettered = sum(outgoing.queue_counts(stack.servers.client("sqs"), stack.dead_letter_queue.url))
            balances, _, _ = stack.ledger_totals()
        finally:
            stack.stop()
    latencies = [tracker.done_at[i] - tracker.sent_at[i] for i in tracker.done_at if i in tracker.sent_at]
    # Against what was applied: a payment still waiting at the timeout is not a wrong balance.
    expected = outgoing.expected_balances(tracker.applied())
    keys = Counter(request.idempotency_key for request in sink.received())
    return Figures(
        accounts=accounts,
        messages=len(messages),
        serial_per_s=serial,
        ceiling_per_s=ceiling,
        throughput_per_s=len(tracker.done_at) / max(last_done - first_sent, 1e-9),
        p50_s=_percentile(latencies, 0.50),
        p99_s=_percentile(latencies, 0.99),
        deliveries=tracker.deliveries,
        returned=tracker.returned,
        not_done=len(tracker.sent_at) - len(tracker.done_at),
        dead_lettered=dead_lettered,
        webhook_repeats=sum(count - 1 for count in keys.values() if count > 1),
        proxy={name: proxy_after.get(name, 0) - proxy_before.get(name, 0) for name in proxy_after},
        outcomes=dict(outcome_counts(function_log) - outcomes_before),
        wrong_balances=sum(balances.get(account, 0) != total for account, total in expected.items()),
    )


def report(figures: Figures, args: argparse.Namespace, say: Callable[[str], None]) -> None:
    spread = "ONE account" if figures.accounts == 1 else f"{figures.accounts} accounts"
    say(f"\n{figures.messages} messages on {spread} ({args.receipts:.0%} receipt requests)")
    rows = {
        "item ceiling (raw transactions, 1 item)": f"{figures.ceiling_per_s:8.1f} payments/s",
        "serial limit (1 poller, one account)": f"{figures.serial_per_s:8.1f} payments/s",
        "pipeline throughput": f"{figures.throughput_per_s:8.1f} msg/s = {figures.share_of_serial:.0%} of the "
        f"serial limit (target >= {THROUGHPUT_TARGET:.0%})",
        "send to applied p50 / p99": f"{figures.p50_s:8.2f} s / {figures.p99_s:.2f} s (all sent at once)",
        "returned to SQS": f"{figures.returned:8d} of {figures.deliveries} deliveries = {figures.returned_share:.1%} "
        f"of messages (target < {RETURNED_TARGET:.0%})",
        "healthy messages in the DLQ": f"{figures.dead_lettered:8d} (target 0)",
        "webhook calls repeated": f"{figures.webhook_repeats:8d} (target 0)",
        f"not applied within {args.timeout:.0f}s": f"{figures.not_done:8d}",
        "balances not the sum of their applied payments": f"{figures.wrong_balances:d}",
        "conflict proxy": figures.proxy,
        "consumer outcomes (EMF)": figures.outcomes,
    }
    for label, value in rows.items():
        say(f"  {label:<39} {value}")
    misses = figures.misses()
    say(f"  {'all targets met' if not misses else 'NOT met: ' + '; '.join(misses)}")


def run_hot(args: argparse.Namespace) -> int:
    say = command_output(HOT_LOG)

    emulation = ConflictEmulation(conflicts=not args.no_conflicts, hold_ms=args.hold_ms, latency_ms=args.latency_ms)
    say(f"hot items: {args.pollers} pollers, BatchSize {args.batch_size}, DynamoDB: {emulation.describe()}")
    say(f"the function's logs and metrics: {HOT_LOG}")
    missed = 0
    with DynamoDBLocal(emulation=emulation) as dynamodb, LocalServers(dynamodb) as servers, WebhookSink() as sink:
        for accounts in args.accounts:
            figures = measure(servers, dynamodb, sink, args, accounts, say)
            report(figures, args, say)
            missed += bool(figures.misses())
    say("\nevery process started has stopped")
    return 1 if missed else 0


def _argument(kind: type[int] | type[float], expected: str, valid: Callable[[Any], bool]) -> Callable[[str], Any]:
    """An argparse type: ``kind`` within bounds, refused with "must be <expected>, got <text>"."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not valid(value):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
        return value

    return parse


# Each bound says what is valid, so that NaN (neither >= 0 nor < 0) is refused.
_positive = _argument(int, "a whole number >= 1", lambda value: value >= 1)
_milliseconds = _argument(float, "a number of milliseconds >= 0", lambda value: value >= 0)
_share = _argument(float, "a share between 0 and 1", lambda value: 0 <= value <= 1)


def add_parser(commands: Any) -> None:
    hot = commands.add_parser("hot", help="a hot account through the conflict emulation, against its serial limit")
    hot.add_argument("--messages", type=_positive, default=400, help="messages per spread (default 400)")
    hot.add_argument("--accounts", type=_positive, nargs="+", default=[1, 100], help="spreads to run (default 1 100)")
    hot.add_argument("--receipts", type=_share, default=0.1, help="share of receipt requests (default 0.1)")
    hot.add_argument("--pollers", type=_positive, default=4)
    hot.add_argument("--batch-size", type=_positive, default=10)
    hot.add_argument("--latency-ms", type=_milliseconds, default=10.0, help="added to every DynamoDB call (default 10)")
    hot.add_argument("--hold-ms", type=_milliseconds, default=DEFAULT_HOLD_MS, help="a transaction's prepare hold")
    hot.add_argument("--no-conflicts", action="store_true", help="measure DynamoDB Local's kindness instead")
    hot.add_argument("--serial", type=_positive, default=100, help="payments in the serial runs (default 100)")
    hot.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for every message")
    hot.add_argument("--seed", type=int, default=7)
    hot.set_defaults(handler=run_hot)
