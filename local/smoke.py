"""``make smoke``: a message of each registered handler, its resend and one poison message through a stack, checked;
what it cleans up, and the permissions it needs: docs/deploying.md (``make smoke``)."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from consumer.config import destination_variable, table_variable
from consumer.handler import Handlers, declared_destinations, declared_tables
from consumer.outbox import OUTBOX_TABLE
from local.demo import Check, show_checks
from local.state import STATE_DIR
from service.registry import HANDLERS
from testkit import dead_letters, messages, payloads
from testkit.tables import scan

OUTPUTS = {
    "queue_url": "ConsumerQueueUrl",
    "dead_letter_queue_url": "DeadLetterQueueUrl",
    "idempotency_table": "IdempotencyTableName",
}
POISON_ERROR_TYPE = "InvalidJson"  # consumer.errors.ErrorType.INVALID_JSON
# Lambda's pollers and the queue's backoff on a cold stack take seconds, not minutes.
DEFAULT_TIMEOUT_S = 120.0
_POLL_S = 0.5
Items = dict[str, list[dict[str, Any]]]  # each declared table's items, by logical id


class SmokeError(Exception):
    """The smoke test could not start (no such stack, an output missing): one line saying why."""


@dataclass(frozen=True)
class Target:
    """Where the smoke test sends and looks: clients, the queues and the tables (logical id -> name)."""

    sqs: Any
    dynamodb: Any
    queue_url: str
    dead_letter_queue_url: str
    idempotency_table: str
    tables: Mapping[str, str]
    fifo: bool = False
    # The destinations whose address in the relay's environment is this queue: what the handlers emit there comes
    # back to this function, and the run waits for it.
    relayed_here: frozenset[str] = frozenset()


def target_from_stack(
    cloudformation: Any, lambda_: Any, sqs: Any, dynamodb: Any, stack_name: str, handlers: Handlers = HANDLERS
) -> Target:
    """The target named by a deployed stack's outputs, and the tables ``handlers`` declare by the function's
    variables."""
    from botocore.exceptions import ClientError  # noqa: PLC0415 (only the deployed form needs it)

    try:
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        raise SmokeError(f"cannot describe stack {stack_name!r}: {error}") from error
    outputs = {o["OutputKey"]: o["OutputValue"] for o in (stacks[0].get("Outputs") or [])} if stacks else {}
    if missing := [name for name in (*OUTPUTS.values(), "ConsumerFunctionName") if name not in outputs]:
        raise SmokeError(f"stack {stack_name!r} has no output {', '.join(missing)} (is it this project's template?)")
    function = lambda_.get_function_configuration(FunctionName=outputs["ConsumerFunctionName"])
    variables = (function.get("Environment") or {}).get("Variables") or {}
    unset = [table_variable(table) for table in declared_tables(handlers) if table_variable(table) not in variables]
    if unset:
        raise SmokeError(f"the function of stack {stack_name!r} has no variable {', '.join(unset)}")
    values = {role: outputs[name] for role, name in OUTPUTS.items()}
    tables = {table: variables[table_variable(table)] for table in declared_tables(handlers)}
    relay = outputs.get("RelayFunctionName")
    relay_function = lambda_.get_function_configuration(FunctionName=relay) if relay else {}
    relay_variables = (relay_function.get("Environment") or {}).get("Variables") or {}
    values["relayed_here"] = relayed_here(relay_variables, values["queue_url"], handlers)
    return Target(sqs=sqs, dynamodb=dynamodb, tables=tables, fifo=values["queue_url"].endswith(".fifo"), **values)


def relayed_here(relay_variables: Mapping[str, str], queue_url: str, handlers: Handlers = HANDLERS) -> frozenset[str]:
    """The destinations the handlers declare whose address in the relay's environment is ``queue_url``."""
    return frozenset(
        d for d in declared_destinations(handlers) if relay_variables.get(destination_variable(d)) == queue_url
    )


def chained(target: Target, sent: list[messages.Outgoing]) -> list[str]:
    """The records of what the run's messages emitted onto this queue: each relayed message's, under its key."""
    if not target.relayed_here:
        return []
    sources = set(map(_record_id, sent))
    return [
        str(messages.Outgoing(item["body"]["S"], messages.EMITTED, item["id"]["S"]).record_id)
        for item in scan(target.dynamodb, target.tables[OUTBOX_TABLE])
        if item["sourceRecord"]["S"] in sources and item["destination"]["S"] in target.relayed_here
    ]


def _record_id(message: messages.Outgoing) -> str:
    """The id of the message's idempotency record, as the consumer names it: event type and key."""
    return str(message.record_id)


def status(target: Target, record_id: str) -> str | None:
    key = {"id": {"S": record_id}}
    item = target.dynamodb.get_item(TableName=target.idempotency_table, Key=key, ConsistentRead=True).get("Item")
    return item["status"]["S"] if item else None


def run_messages(run_id: str) -> list[messages.Outgoing]:
    """One message per registered handler, drawn from the run id, under a key that carries it."""
    seed = zlib.crc32(run_id.encode())
    return [
        messages.drawn(handler, f"smoke-{run_id}-{index}", payloads.valid_payloads(handler, 1, seed)[0])
        for index, handler in enumerate(payloads.registered())
    ]


def poison_body(run_id: str) -> str:
    # Cut short on purpose: invalid JSON, yet recognisable in the dead-letter queue.
    return f'{{"smokeRun": "{run_id}", "eventType": "smoke", "payload": '


def send(target: Target, body: str, group: str) -> None:
    fifo = messages.fifo_fields(group) if target.fifo else {}
    target.sqs.send_message(QueueUrl=target.queue_url, MessageBody=body, **fifo)


def table_items(dynamodb: Any, tables: Mapping[str, str]) -> Items:
    return {table: sorted(scan(dynamodb, name), key=repr) for table, name in tables.items()}


def _letters(target: Target, body: str) -> list[dead_letters.DeadLetter]:
    return [letter for letter in dead_letters.peek(target.sqs, target.dead_letter_queue_url) if letter.body == body]


def wait(condition: Callable[[], bool], deadline: float) -> bool:
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def outcome(target: Target, message: messages.Outgoing) -> str | None:
    """Applied (its record completed), dead-lettered with a reason, or ``None`` while neither."""
    if status(target, _record_id(message)) == "COMPLETED":
        return "applied once"
    letters = _letters(target, message.body)
    return f"dead-lettered: {letters[0].reason}" if letters and letters[0].error_type else None


def run_smoke(
    target: Target,
    *,
    run_id: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    sender: Callable[[Target, str, str], object] = send,
) -> list[Check]:
    """Send (each body with ``sender``), wait (one deadline for the whole run), resend, check, then put back what the
    run changed."""
    run_id = run_id or uuid.uuid4().hex[:12]
    sent, poison = run_messages(run_id), poison_body(run_id)
    deadline = time.monotonic() + timeout_s
    before = table_items(target.dynamodb, target.tables)
    try:
        for handler, message in zip(payloads.registered(), sent, strict=True):
            payloads.put_seeds(target.dynamodb, target.tables, payloads.seed_items(handler, message.payload or {}))
            sender(target, message.body, message.group_id)
        sender(target, poison, "smoke")
        ended = wait(lambda: all(outcome(target, m) for m in sent), deadline)
        outcomes = {m.event_type: outcome(target, m) for m in sent}
        # What they emitted onto this queue comes back through the relay: applied before the tables are read.
        emitted = chained(target, sent)
        relayed = wait(lambda: all(status(target, record) == "COMPLETED" for record in emitted), deadline)
        parked = wait(lambda: bool(_letters(target, poison)), deadline)
        applied = table_items(target.dynamodb, target.tables)
        for message in sent:  # the producer's resend: the same body, so the same key, as a new message
            sender(target, message.body, message.group_id)
        # A resend's outcome leaves no trace of its own: wait until the queue has handled everything.
        idle = wait(lambda: sum(messages.queue_counts(target.sqs, target.queue_url)) == 0, deadline)
        resent = table_items(target.dynamodb, target.tables)
        letter = next(iter(_letters(target, poison)), None)
        found = letter.error_type if letter else None
        return [
            *(
                Check(bool(found), f"{event} ends {found or f'neither applied nor dead-lettered in {timeout_s:.0f}s'}")
                for event, found in outcomes.items()
            ),
            Check(relayed, f"each message emitted onto the queue ({len(emitted)}) relayed and applied"),
            Check(ended and idle, f"the queue drained within {timeout_s:.0f}s, so every resend was handled"),
            Check(resent == applied, f"the resends changed no item of the declared tables {sorted(target.tables)}"),
            Check(parked, f"the poison message is in the dead-letter queue within {timeout_s:.0f}s"),
            Check(found == POISON_ERROR_TYPE, f"its ErrorType attribute is {POISON_ERROR_TYPE} (found {found})"),
        ]
    finally:
        clean_up(target, sent, [poison], before, chained(target, sent))


def clean_up(
    target: Target, sent: list[messages.Outgoing], others: list[str], before: Items, chained: Sequence[str] = ()
) -> None:
    """Put back each item of the declared tables the run changed, remove its records (its relayed messages' too) and
    dead letters; no more."""
    for table, items in table_items(target.dynamodb, target.tables).items():
        schema = target.dynamodb.describe_table(TableName=target.tables[table])["Table"]["KeySchema"]
        keys = [k["AttributeName"] for k in schema]
        old = {repr([item[k] for k in keys]): item for item in before.get(table, [])}
        for item in items:
            was = old.get(repr([item[k] for k in keys]))
            if was is None:
                target.dynamodb.delete_item(TableName=target.tables[table], Key={k: item[k] for k in keys})
            elif was != item:
                target.dynamodb.put_item(TableName=target.tables[table], Item=was)
    for record in [*map(_record_id, sent), *chained]:
        target.dynamodb.delete_item(TableName=target.idempotency_table, Key={"id": {"S": record}})
    for body in [*others, *(m.body for m in sent)]:
        for letter in _letters(target, body):
            target.sqs.delete_message(QueueUrl=target.dead_letter_queue_url, ReceiptHandle=letter.receipt_handle)


def report(checks: list[Check], say: Callable[[str], None]) -> int:
    """One line per check; the exit status: 1 when any failed."""
    failed = show_checks(checks, say)
    say("smoke test passed" if not failed else f"smoke test FAILED: {failed} check(s)")
    return 1 if failed else 0


def _deployed(args: argparse.Namespace) -> list[Check]:
    import boto3  # noqa: PLC0415 (the caller's own credentials and region, only for a deployed stack)

    aws: Any = boto3.session.Session(region_name=args.region).client
    target = target_from_stack(aws("cloudformation"), aws("lambda"), aws("sqs"), aws("dynamodb"), args.stack)
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
        stack.relays()
        target = Target(
            sqs=stack.servers.client("sqs"),
            dynamodb=stack.servers.client("dynamodb"),
            queue_url=stack.queue.url,
            dead_letter_queue_url=stack.dead_letter_queue.url,
            idempotency_table=stack.table_name("IdempotencyTable"),
            tables={table: stack.table_name(table) for table in declared_tables(HANDLERS)},
            fifo=stack.queue.fifo,
            relayed_here=relayed_here(stack.relay_fleet.function.environment, stack.queue.url),
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
    smoke = commands.add_parser("smoke", help="a message of each handler, its resend and a poison message, checked")
    smoke.add_argument("--stack", default=None, help="a deployed stack's name (default: the local stack)")
    smoke.add_argument("--region", default=None, help="the deployed stack's region (default: the AWS config's)")
    smoke.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for the outcomes")
    smoke.add_argument("--pollers", type=int, default=2, help="local form only: concurrent pollers")
    smoke.set_defaults(handler=cmd_smoke)
