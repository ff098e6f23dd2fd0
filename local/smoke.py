"""``make smoke``: one payment, a resend of it and one poison message through a stack, checked, then removed.

Against a deployed stack (``STACK=<name>``) its queues and tables come from its CloudFormation
outputs; without one, the local stack is started for the run. Everything the run writes carries
a run id, so the clean-up removes only its own items and dead letter, even on a stack in use.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from local.demo import Check, show_checks
from local.state import STATE_DIR
from testkit import dead_letters, messages

# The template's Outputs the smoke test needs, by the role they play here.
OUTPUTS = {
    "queue_url": "ConsumerQueueUrl",
    "dead_letter_queue_url": "DeadLetterQueueUrl",
    "ledger_table": "LedgerTableName",
    "idempotency_table": "IdempotencyTableName",
}
AMOUNT_CENTS = 1234
POISON_ERROR_TYPE = "InvalidJson"  # consumer.errors.ErrorType.INVALID_JSON
# Lambda's pollers and the queue's backoff on a cold stack take seconds, not minutes.
DEFAULT_TIMEOUT_S = 120.0
_POLL_S = 0.5


class SmokeError(Exception):
    """The smoke test could not start (no such stack, an output missing): one line saying why."""


@dataclass(frozen=True)
class Target:
    """Where the smoke test sends and looks: clients and the stack's resource names."""

    sqs: Any
    dynamodb: Any
    queue_url: str
    dead_letter_queue_url: str
    ledger_table: str
    idempotency_table: str
    fifo: bool = False


def target_from_stack(cloudformation: Any, sqs: Any, dynamodb: Any, stack_name: str) -> Target:
    """The target named by a deployed stack's outputs (``describe_stacks``)."""
    from botocore.exceptions import ClientError  # noqa: PLC0415 (only the deployed form needs it)

    try:
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        raise SmokeError(f"cannot describe stack {stack_name!r}: {error}") from error
    outputs = {o["OutputKey"]: o["OutputValue"] for o in (stacks[0].get("Outputs") or [])} if stacks else {}
    missing = [name for name in OUTPUTS.values() if name not in outputs]
    if missing:
        raise SmokeError(f"stack {stack_name!r} has no output {', '.join(missing)} (is it this project's template?)")
    values = {role: outputs[name] for role, name in OUTPUTS.items()}
    return Target(sqs=sqs, dynamodb=dynamodb, fifo=values["queue_url"].endswith(".fifo"), **values)


@dataclass(frozen=True)
class SmokeRun:
    """What one run writes: every name carries its run id."""

    account_id: str  # also the payment's idempotency key
    payment_id: str
    poison_body: str

    @classmethod
    def new(cls, run_id: str) -> SmokeRun:
        # The poison is cut short on purpose: invalid JSON, yet recognisable in the dead-letter queue.
        poison = f'{{"smokeRun": "{run_id}", "eventType": "PaymentReceived", "payload": '
        return cls(f"smoke-{run_id}", f"smoke-p-{run_id}", poison)

    @property
    def payment(self) -> messages.Outgoing:
        return messages.payment(self.account_id, self.payment_id, self.account_id, AMOUNT_CENTS)


def _send(target: Target, body: str, group: str) -> None:
    request: dict[str, Any] = {"QueueUrl": target.queue_url, "MessageBody": body}
    if target.fifo:
        # A new deduplication id per send: the resend must reach the consumer, not be dropped by SQS.
        request.update(MessageGroupId=group, MessageDeduplicationId=uuid.uuid4().hex)
    target.sqs.send_message(**request)


def _ledger_key(run: SmokeRun, entry_id: str) -> dict[str, Any]:
    return {"accountId": {"S": run.account_id}, "entryId": {"S": entry_id}}


def _ledger_item(target: Target, run: SmokeRun, entry_id: str) -> dict[str, Any] | None:
    answer = target.dynamodb.get_item(
        TableName=target.ledger_table, Key=_ledger_key(run, entry_id), ConsistentRead=True
    )
    item: dict[str, Any] | None = answer.get("Item")
    return item


def _count_payment_entries(target: Target, run: SmokeRun) -> int:
    answer = target.dynamodb.query(
        TableName=target.ledger_table,
        KeyConditionExpression="accountId = :a AND begins_with(entryId, :p)",
        ExpressionAttributeValues={":a": {"S": run.account_id}, ":p": {"S": "PAYMENT#"}},
        ConsistentRead=True,
    )
    return int(answer["Count"])


def _our_dead_letter(target: Target, run: SmokeRun) -> dead_letters.DeadLetter | None:
    parked = dead_letters.peek(target.sqs, target.dead_letter_queue_url)
    return next((letter for letter in parked if letter.body == run.poison_body), None)


def wait(condition: Callable[[], bool], deadline: float) -> bool:
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def run_smoke(target: Target, *, run_id: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Check]:
    """Send, wait (one deadline for the whole run), check, then remove what the run wrote."""
    run = SmokeRun.new(run_id or uuid.uuid4().hex[:12])
    deadline = time.monotonic() + timeout_s
    payment_entry = f"PAYMENT#{run.payment_id}"
    try:
        _send(target, run.payment.body, run.account_id)
        # The producer's resend: the same body, so the same idempotency key, as a new message.
        _send(target, run.payment.body, run.account_id)
        _send(target, run.poison_body, run.account_id)
        applied = wait(lambda: _ledger_item(target, run, payment_entry) is not None, deadline)
        parked = wait(lambda: _our_dead_letter(target, run) is not None, deadline)
        # The resend's outcome leaves no trace of its own: wait until the queue has handled everything.
        idle = wait(lambda: sum(messages.queue_counts(target.sqs, target.queue_url)) == 0, deadline)
        balance = _ledger_item(target, run, "BALANCE")
        balance_cents = int(balance["balanceCents"]["N"]) if balance else None
        entries = _count_payment_entries(target, run)
        letter = _our_dead_letter(target, run)
        error_type = letter.error_type if letter else None
        return [
            Check(applied, f"ledger entry ({run.account_id}, {payment_entry}) written within {timeout_s:.0f}s"),
            Check(entries == 1, f"exactly one payment entry for the account (found {entries})"),
            Check(
                balance_cents == AMOUNT_CENTS,
                f"balance moved once: {AMOUNT_CENTS} cents expected, found {balance_cents}",
            ),
            Check(idle, f"the queue drained within {timeout_s:.0f}s, so the resend was handled"),
            Check(parked, f"the poison message is in the dead-letter queue within {timeout_s:.0f}s"),
            Check(
                error_type == POISON_ERROR_TYPE,
                f"its ErrorType attribute is {POISON_ERROR_TYPE} (found {error_type})",
            ),
        ]
    finally:
        clean_up(target, run)


def clean_up(target: Target, run: SmokeRun) -> None:
    """Remove the run's ledger items, its idempotency record and its dead letter; nothing else."""
    for entry in (f"PAYMENT#{run.payment_id}", "BALANCE"):
        target.dynamodb.delete_item(TableName=target.ledger_table, Key=_ledger_key(run, entry))
    record_id = f"PaymentReceived#{run.account_id}"  # the consumer's record: event type and idempotency key
    target.dynamodb.delete_item(TableName=target.idempotency_table, Key={"id": {"S": record_id}})
    letter = _our_dead_letter(target, run)
    if letter is not None:
        target.sqs.delete_message(QueueUrl=target.dead_letter_queue_url, ReceiptHandle=letter.receipt_handle)


def report(checks: list[Check], say: Callable[[str], None]) -> int:
    """One line per check; the exit status: 1 when any failed."""
    failed = show_checks(checks, say)
    say("smoke test passed" if not failed else f"smoke test FAILED: {failed} check(s)")
    return 1 if failed else 0


def _deployed(args: argparse.Namespace) -> list[Check]:
    import boto3  # noqa: PLC0415 (the caller's own credentials and region, only for a deployed stack)

    session = boto3.session.Session(region_name=args.region)
    target = target_from_stack(
        session.client("cloudformation"), session.client("sqs"), session.client("dynamodb"), args.stack
    )
    return run_smoke(target, timeout_s=args.timeout)


def _local(args: argparse.Namespace) -> list[Check]:
    from local.session import running_stack  # noqa: PLC0415 (only the local form starts servers)

    log = STATE_DIR / "smoke-function.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"the function's logs: {log}", flush=True)
    with (
        log.open("w", encoding="utf-8") as log_sink,
        running_stack(stack_name=f"smoke-{int(time.time())}", log_sink=log_sink) as (stack, _sink),
    ):
        stack.pollers(args.pollers)
        target = Target(
            sqs=stack.servers.client("sqs"),
            dynamodb=stack.servers.client("dynamodb"),
            queue_url=stack.queue.url,
            dead_letter_queue_url=stack.dead_letter_queue.url,
            ledger_table=stack.table_name("LedgerTable"),
            idempotency_table=stack.table_name("IdempotencyTable"),
            fifo=stack.queue.fifo,
        )
        return run_smoke(target, timeout_s=args.timeout)


def cmd_smoke(args: argparse.Namespace) -> int:
    where = f"stack {args.stack}" if args.stack else "the local stack (started for this run)"
    print(f"smoke test against {where}", flush=True)
    try:
        checks = _deployed(args) if args.stack else _local(args)
    except SmokeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return report(checks, lambda line: print(line, flush=True))


def add_parser(commands: Any) -> None:
    smoke = commands.add_parser("smoke", help="a payment, its resend and a poison message through a stack, checked")
    smoke.add_argument("--stack", default=None, help="a deployed stack's name (default: the local stack)")
    smoke.add_argument("--region", default=None, help="the deployed stack's region (default: the AWS config's)")
    smoke.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the outcomes")
    smoke.add_argument("--pollers", type=int, default=2, help="local form only: concurrent pollers")
    smoke.set_defaults(handler=cmd_smoke)
