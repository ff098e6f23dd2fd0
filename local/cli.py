"""``python -m local <command>``: run, send, invoke, dlq, redrive, demo, smoke, rehearse (wired to make targets)."""

from __future__ import annotations

import argparse
import json
import random
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from local import rehearse, smoke, state
from local.demo import run_demo
from local.event_files import EventFileError, load_event, messages_from_bodies, messages_from_event
from local.function_output import command_output
from local.poller import BatchReport
from local.session import FUNCTION_LOG, running_stack
from local.stack import DeployedStack
from testkit import dead_letters, messages, payloads
from testkit.aws import DUMMY_CREDENTIALS_ENV, client
from testkit.invocation import Invocation
from testkit.lambda_runtime import EmulatorExited, LambdaFleet, RuntimeStartError
from testkit.lambda_venv import LambdaPythonMissing, LambdaVenvError
from testkit.webhook import WebhookSink

FIFO_HELP = "deploy with QueueType=fifo (a FIFO queue and DLQ, one message group per key)"
MEMORY_HELP = "the function's MemorySize instead of the template's (its CPU share follows: 1769 MB = 1 vCPU)"
# A runtime that cannot start says why in one line; nothing it started is left running.
RUNTIME_ERRORS = (RuntimeStartError, EmulatorExited, LambdaPythonMissing, LambdaVenvError, EventFileError)


def _parameters(pairs: list[str], *, fifo: bool = False) -> dict[str, str]:
    parsed = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        if not separator:
            raise SystemExit(f"--param takes Name=Value, got {pair!r}")
        parsed[name] = value
    if fifo and parsed.setdefault("QueueType", "fifo") != "fifo":
        raise SystemExit(f"--fifo contradicts --param QueueType={parsed['QueueType']}")
    return parsed


def _running() -> state.StackState:
    if (running := state.read()) is None:
        raise SystemExit("no local stack is running: start one with `make run` (in another terminal)")
    return running


def _banner(stack: DeployedStack, sink: WebhookSink, pollers: int) -> str:
    credentials = " ".join(f"{name}={value}" for name, value in DUMMY_CREDENTIALS_ENV.items() if name != "AWS_REGION")
    aws = f"{credentials} \\\n    .venv/bin/aws"
    handler = payloads.registered()[0]
    example = messages.drawn(handler, "example-1", payloads.valid_payloads(handler, 1)[0])
    table = stack.table_name(handler.tables[0])
    dynamodb = f"--endpoint-url {stack.servers.dynamodb_endpoint_url} --table-name {table}"
    keys = stack.servers.client("dynamodb").describe_table(TableName=table)["Table"]["KeySchema"]
    item = json.dumps({key["AttributeName"]: {"S": "..."} for key in keys})
    send_cli = (
        f"{aws} sqs send-message --endpoint-url {stack.servers.sqs_endpoint_url} \\\n"
        f"    --queue-url {stack.queue.url} \\\n    --message-body {shlex.quote(example.body)}"
    )
    if stack.queue.fifo:
        # A FIFO queue refuses a send without a group; content-based deduplication is off, so an id too.
        send_cli += " \\\n    --message-group-id acc-1 --message-deduplication-id $(uuidgen)"
    tables = "  ".join(f"{logical}={table.name}" for logical, table in stack.resources.tables.items())
    quotas = [environment.quota for environment in stack.fleet.environments if environment.quota is not None]
    cpu = quotas[0].describe() if quotas else "no CPU quota"
    return f"""
Local stack "{stack.resources.stack_name}" is running. Ctrl-C stops it and every process it started.
  SQS (moto server)   {stack.servers.sqs_endpoint_url}
  DynamoDB Local      {stack.servers.dynamodb_endpoint_url}
  conflict emulation  {stack.servers.dynamodb.emulation.describe()}
  queue               {stack.queue.url}
  dead-letter queue   {stack.dead_letter_queue.url}
  tables              {tables}
  webhook sink        {sink.url}/<an endpoint's parameter>   (GET {sink.url}/requests lists what it received)
  function            {stack.function.handler}, Timeout {stack.function.timeout_s}s, \
MemorySize {stack.function.memory_mb} MB, BatchSize {stack.trigger.batch_size}, {pollers} poller(s)
  runtime             Lambda's Runtime Interface Emulator + awslambdaric on Python 3.13, \
one execution environment per poller, {cpu}
  function logs       {FUNCTION_LOG}  (tail -f it)
  state file          {state.STATE_FILE}

Push messages from another terminal:
  make send ARGS="--count 100 --duplicates 0.2 --type {handler.event_type}"   (drawn from its payload model)
  make send ARGS="--type {handler.event_type} --payload '{{...}}'"   (or --type poison: payloads the models refuse)
  make send ARGS="--file events/poison-invalid-json.json"   (or --bodies FILE: one JSON body per line)
  {send_cli}
Then: make dlq | make redrive | make invoke EVENT=events/poison-invalid-json.json
Inspect and seed any table the same way (all in memory: `make run` starts empty and loses everything at exit):
  {aws} dynamodb scan {dynamodb}
  {aws} dynamodb put-item {dynamodb} --item {shlex.quote(item)}
"""


def _batch_line(say: Callable[[str], None]) -> Callable[[BatchReport], None]:
    lock = threading.Lock()

    def show(report: BatchReport) -> None:
        detail = f" ({report.verdict.value}: {report.detail})" if report.verdict.deletes_nothing else ""
        init_ms = report.invocation.init_duration_ms
        cold = f" cold start, init {init_ms:.0f} ms" if init_ms is not None else ""
        line = (
            f"{time.strftime('%H:%M:%S')} batch of {report.received}: {report.deleted} done, "
            f"{len(report.failed_ids)} back to the queue{detail}  [{report.invocation.duration_s * 1000:.0f} ms{cold}]"
        )
        with lock:
            say(line)

    return show


def cmd_run(args: argparse.Namespace) -> int:
    if (running := state.read()) is not None:
        raise SystemExit(f"a local stack is already running (pid {running.pid}); stop it first")
    say = command_output(FUNCTION_LOG)
    stopping = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopping.set())
    say("starting DynamoDB Local, the moto server and the webhook sink...")
    with running_stack(
        stack_name=args.stack_name,
        parameter_overrides=_parameters(args.param, fifo=args.fifo),
        publish=True,
        memory_mb=args.memory,
    ) as (stack, sink):
        group = stack.pollers(args.pollers, on_batch=_batch_line(say))
        relays = stack.relays()
        say(_banner(stack, sink, args.pollers))
        while not stopping.wait(0.5):
            pass
        say("stopping...")
        group.stop()
        relays.stop()
    say("stopped: no process of the local stack is left running")
    return 0


def _refuse(why: str) -> NoReturn:
    """A send that cannot be made as asked: one line, nothing sent, argparse's status for a bad argument."""
    print(f"error: {why}", file=sys.stderr)
    raise SystemExit(2)


def _poison(per_kind: int) -> list[messages.Outgoing]:
    """Invalid JSON, an unknown event type and, per handler, a payload its model refuses (``testkit.payloads``)."""
    bodies = ['{"eventType": "Cut", "payload": ', messages.envelope("NoSuchEvent", f"unknown-{time.time_ns()}", {})]
    for handler in payloads.registered():
        refused = payloads.invalid_payloads(handler)[0].payload
        bodies.append(messages.envelope(handler.event_type, f"refused-{time.time_ns()}", refused))
    return [messages.Outgoing(body, "poison") for body in bodies] * per_kind


def _generated(args: argparse.Namespace) -> list[messages.Outgoing]:
    rng, handlers = random.Random(args.seed), {h.event_type: h for h in payloads.registered()}
    count = args.count if args.count is not None else 1 if args.payload is not None else 10
    if args.payload is not None:
        try:
            payload = json.loads(args.payload)
        except ValueError as error:
            _refuse(f'--payload is not JSON ({error}); with make: ARGS="... --payload \'{{\\"sku\\":1}}\'"')
        keys = [args.key or f"{args.prefix}-{time.time_ns()}-{n}" for n in range(count)]
        originals = [messages.Outgoing(messages.envelope(args.type, key, payload), "custom", key) for key in keys]
    elif args.key is not None:
        _refuse("--key goes with --payload (the generated kinds make their own keys)")
    elif args.type == "poison":
        originals = _poison(max(1, count // 3))  # one of each kind per 3
    elif args.type is None or args.type in handlers:
        chosen = [handlers[args.type]] if args.type else list(handlers.values())
        run, seed = f"{args.prefix}-{int(time.time())}", args.seed or 0
        drawn = [(h, p) for h in chosen for p in payloads.valid_payloads(h, -(-count // len(chosen)), seed)][:count]
        originals = [messages.drawn(h, f"{run}-{h.event_type}-{n}", p) for n, (h, p) in enumerate(drawn)]
    else:
        _refuse(f"--type {args.type} needs --payload (make send draws only {', '.join(handlers)} and poison)")
    sent = messages.with_resends(originals, args.duplicates, rng)
    if args.tenants:
        # A fair queue's tenant is the producer's MessageGroupId on a standard queue.
        sent = [replace(message, group=f"tenant-{index % args.tenants}") for index, message in enumerate(sent)]
    return sent


def cmd_send(args: argparse.Namespace) -> int:
    if args.file:
        outgoing = messages_from_event(Path(args.file))
    elif args.bodies:
        outgoing = messages_from_bodies(Path(args.bodies))
    else:
        outgoing = _generated(args)
    running = _running()
    dynamodb = client("dynamodb", running.dynamodb_endpoint_url)
    handlers = {h.event_type: h for h in payloads.registered()}
    for message in (m for m in outgoing if m.kind == "drawn"):  # its seeds (testkit.payloads) first, as make demo's
        seeds = payloads.seed_items(handlers[str(message.event_type)], message.payload or {})
        payloads.put_seeds(dynamodb, running.tables, seeds)
    ids = messages.send_all(client("sqs", running.sqs_endpoint_url), running.queue_url, outgoing)
    if len(ids) <= 10:
        print("message id(s):", *ids)  # as the function's logs and make dlq name them
    if args.file or args.bodies:
        print(f"sent the {len(ids)} message(s) of {args.file or args.bodies} to {running.queue_url}")
    else:
        keys = {message.key for message in outgoing if message.key}
        print(f"sent {len(ids)} message(s) to {running.queue_url} ({len(keys)} distinct idempotency keys)")
    return 0


def _answer(invocation: Invocation) -> Any:
    """What Lambda's Invoke API would answer: the response, or its error document."""
    if invocation.timed_out:
        message = f"Task timed out after {invocation.duration_s:.2f} seconds"
        return {"errorType": "Sandbox.Timedout", "errorMessage": message}
    if invocation.error is not None:
        return {"errorType": invocation.error_type, "errorMessage": str(invocation.error)}
    return invocation.response


def cmd_invoke(args: argparse.Namespace) -> int:
    event = load_event(Path(args.event))
    running = state.read()
    notes: list[str] = []
    if running is not None:
        spec, environment = running.function_spec(), running.function_environment
        with LambdaFleet(spec, environment, memory_mb=args.memory, log_sink=sys.stderr) as fleet:
            answer = _answer(fleet.add().invoke(event))
    else:
        print("no local stack is running: starting one for this invocation", file=sys.stderr)
        with running_stack(stack_name=args.stack_name, memory_mb=args.memory, log_sink=sys.stderr) as (stack, sink):
            answer = _answer(stack.runtime.invoke(event))
            parked = dead_letters.peek(stack.servers.client("sqs"), stack.dead_letter_queue.url)
            notes += [f"dead-lettered: {letter.reason}" for letter in parked]
            notes += [f"webhook received POST {r.path} Idempotency-Key: {r.idempotency_key}" for r in sink.received()]
    print(json.dumps(answer, indent=2))
    for note in notes:
        print(note, file=sys.stderr)
    return 1 if isinstance(answer, dict) and "errorType" in answer else 0


def cmd_dlq(args: argparse.Namespace) -> int:
    running = _running()
    parked = dead_letters.peek(client("sqs", running.sqs_endpoint_url), running.dead_letter_queue_url)
    print(f"{len(parked)} message(s) in {running.dead_letter_queue_url}")
    for letter in parked:
        body = letter.body if len(letter.body) <= 160 else letter.body[:157] + "..."
        # The id the message had when it was sent, as the consumer's logs name it.
        print(f"- {letter.original_message_id} (in the DLQ as {letter.message_id})")
        print(f"    ErrorType: {letter.error_type}\n    ErrorMessage: {letter.error_message}\n    body: {body}")
    return 0


def cmd_redrive(args: argparse.Namespace) -> int:
    running = _running()
    sqs = client("sqs", running.sqs_endpoint_url)
    moved = dead_letters.redrive(sqs, running.dead_letter_queue_url, running.queue_url)
    print(f"moved {moved} message(s) from the dead-letter queue back to {running.queue_url}")
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m local", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="start the stack and its pollers in the foreground")
    run.add_argument("--pollers", type=int, default=2, help="concurrent pollers (invocations at once)")
    run.add_argument("--stack-name", default="local")
    run.add_argument("--memory", type=int, default=None, metavar="MB", help=MEMORY_HELP)
    run.add_argument("--param", action="append", default=[], metavar="Name=Value", help="template parameter")
    run.add_argument("--fifo", action="store_true", help=FIFO_HELP + "; the same as --param QueueType=fifo")
    run.set_defaults(handler=cmd_run)

    send = commands.add_parser("send", help="push messages to the running stack")
    send.add_argument("--count", type=int, default=None, help="messages to send (default 10, 1 with --payload)")
    send.add_argument("--duplicates", type=float, default=0.0, help="fraction resent by the producer")
    send.add_argument("--type", help="a registered eventType (default: each), any with --payload, or poison")
    send.add_argument("--key", help="the idempotency key of every message (default: a new one each)")
    send.add_argument("--seed", type=int, default=None)
    send.add_argument("--prefix", default="send", help="idempotency keys start with this")
    send.add_argument("--tenants", type=int, default=0, help="spread the messages over N fair-queue tenants")
    source = send.add_mutually_exclusive_group()
    source.add_argument("--payload", metavar="JSON", help="send --type with this payload in the usual envelope")
    source.add_argument("--file", help="send the records of an SQS event file (events/*.json) instead")
    source.add_argument("--bodies", metavar="FILE", help="send each line of FILE (a JSON body) as it is")
    send.set_defaults(handler=cmd_send)

    invoke = commands.add_parser("invoke", help="run the handler once on an event file")
    invoke.add_argument("event")
    invoke.add_argument("--stack-name", default="invoke")
    invoke.add_argument("--memory", type=int, default=None, metavar="MB", help=MEMORY_HELP)
    invoke.set_defaults(handler=cmd_invoke)

    commands.add_parser("dlq", help="list dead-lettered messages and why").set_defaults(handler=cmd_dlq)
    commands.add_parser("redrive", help="move dead letters back to the queue").set_defaults(handler=cmd_redrive)

    demo = commands.add_parser("demo", help="a realistic workload end to end, checked")
    demo.add_argument("--pollers", type=int, default=4)
    demo.add_argument("--memory", type=int, default=None, metavar="MB", help=MEMORY_HELP)
    demo.add_argument("--messages", type=int, default=150, help="per registered handler")
    demo.add_argument("--duplicates", type=float, default=0.25)
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--fifo", action="store_true", help=FIFO_HELP + ", and check each group's order")
    demo.set_defaults(handler=run_demo)

    smoke.add_parser(commands)
    rehearse.add_parser(commands)
    return root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except RUNTIME_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
