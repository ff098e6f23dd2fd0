"""``make rehearse``: the real ``sam build`` + ``sam deploy`` (samconfig.toml's ``rehearse`` environment) onto
ministack, an independent AWS emulator whose CloudFormation runs the SAM transform: the stack a user deploys, not
this project's own reading of the template. Messages go in with the AWS CLI; the checks read the stack's outputs
as a deployer would. The emulator's gaps are handled here, never in the template."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from consumer.config import table_parameter
from consumer.outbox import OUTBOX_TABLE
from local import smoke
from local.demo import Check, show_checks
from local.event_files import sample_bodies
from local.smoke import OUTPUTS, Target, wait
from local.stack import webhook_parameters
from testkit import dead_letters, messages, payloads
from testkit.aws import DUMMY_CREDENTIALS_ENV, client
from testkit.processes import LOOPBACK, LoopbackServer, children
from testkit.tables import create_template_tables
from testkit.template import LOCAL_TABLES, Template
from testkit.webhook import WebhookSink

REPO = Path(__file__).resolve().parent.parent
MINISTACK_PYTHON = REPO / ".venv-ministack" / "bin" / "python"
# AWS CLI v1 ignores AWS_ENDPOINT_URL for some services: the endpoint goes on its command line.
AWS_CLI = str(REPO / ".venv" / "bin" / "aws")
STACK = "idempotent-sqs-consumer-rehearsal"  # samconfig.toml: [rehearse.global.parameters]
CANNOT_VERIFY = (
    "TTL, point-in-time recovery and SSE on the tables: accepted by the emulator, not applied",
    "metrics and alarms: no EMF or SQS metrics, so the alarms and the dashboard stay without data",
    "the architecture: the function runs on this machine's interpreter whatever Architectures says (x86_64 here)",
    "batch sizes: the emulator's poller hands over batches of 1 or 2, never BatchSize",
    "IAM of what the emulator does as itself: polling the queue, writing the logs (PollConsumerQueue, WriteOwnLogs)",
    "sqs:ChangeMessageVisibility covering ChangeMessageVisibilityBatch, as on AWS: the emulator's gap, granted above",
    "the relay's mapping beyond its settings read back: its poller ignores partial batch responses, halving and the"
    " retry bounds",
)
# Actions AWS does not have that AUTH=true asks the role for (AWS authorizes ChangeMessageVisibilityBatch with
# sqs:ChangeMessageVisibility): each allowed after the deploy, outside the template, on its one resource (an output).
EMULATOR_ONLY_ACTIONS = {"sqs:ChangeMessageVisibilityBatch": "ConsumerQueueArn"}
REFUSAL = re.compile(r"not authorized to perform: ([\w:]+)")


class Ministack(LoopbackServer):
    """ministack (pinned in the Makefile) on 127.0.0.1 only: no IoT mTLS or SFTP listeners beside it."""

    name = "ministack"

    def __init__(self, scratch: str) -> None:
        super().__init__()
        self.scratch = scratch  # its TMPDIR: the functions' code and workers, removed with it

    def _command(self, port: int) -> list[str]:
        # ``env`` execs the server, so the PID we hold is the emulator's own.
        settings = [f"GATEWAY_PORT={port}", f"BIND_HOST={LOOPBACK}", "IOT_MTLS_ENABLED=0", "SFTP_ENABLED=0"]
        settings.append(f"TMPDIR={self.scratch}")
        # AUTH=true: every call of the function is authorized against its role. The key the rehearsal signs with is
        # the emulator's root, allowed everything, as the deployer's own credentials would be.
        settings += ["AUTH=true", f"AWS_ACCESS_KEY_ID={DUMMY_CREDENTIALS_ENV['AWS_ACCESS_KEY_ID']}"]
        return ["env", *settings, str(MINISTACK_PYTHON), "-m", "ministack"]


def _listeners(pids: list[int]) -> list[str]:
    """The local addresses every TCP socket of these processes listens on (``ss``)."""
    lines = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    return [line.split()[3] for line in lines if any(f"pid={pid}," in line for pid in pids)]


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit status waits for an init that may never collect it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def _run(command: list[str], env: dict[str, str]) -> str:
    print(f"$ {' '.join(command)}", flush=True)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout


def _event_source_check(lambda_: Any, function: str, parameters: dict[str, str]) -> Check:
    """The mapping read back; and the emulator's gap: its CloudFormation keeps MaximumConcurrency as a string, which
    fails its poller. botocore reads "5" back as 5, so it is set again unconditionally (no such step on AWS)."""
    (mapping,) = lambda_.list_event_source_mappings(FunctionName=function)["EventSourceMappings"]
    wanted = int(parameters["MaximumConcurrency"])
    lambda_.update_event_source_mapping(UUID=mapping["UUID"], ScalingConfig={"MaximumConcurrency": wanted})
    print(f"emulator gap: ScalingConfig.MaximumConcurrency set again to {wanted} through the Lambda API", flush=True)
    read = (mapping["State"], mapping["FunctionResponseTypes"], mapping["BatchSize"])
    wanted_read = ("Enabled", ["ReportBatchItemFailures"], int(parameters["BatchSize"]))
    return Check(read == wanted_read, f"the event source mapping (state, response types, batch size): {read}")


def _relay_check(lambda_: Any, dynamodb: Any, sqs: Any, outputs: dict[str, str]) -> Check:
    """The relay deployed beside the consumer, its mapping read back: the outbox's stream, from its oldest record,
    partial batch responses and halving, its on-failure queue."""
    (mapping,) = lambda_.list_event_source_mappings(FunctionName=outputs["RelayFunctionName"])["EventSourceMappings"]
    stream = dynamodb.describe_table(TableName=outputs["OutboxTableName"])["Table"].get("LatestStreamArn")
    queue = sqs.get_queue_attributes(QueueUrl=outputs["RelayDeadLetterQueueUrl"], AttributeNames=["QueueArn"])
    on_failure = mapping.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
    read = (
        mapping["EventSourceArn"] == stream,
        mapping.get("StartingPosition"),
        mapping["FunctionResponseTypes"],
        str(mapping.get("BisectBatchOnFunctionError")).lower() == "true",
        on_failure == queue["Attributes"]["QueueArn"],
    )
    wanted = (True, "TRIM_HORIZON", ["ReportBatchItemFailures"], True, True)
    said = "the relay's mapping (the outbox's stream, from its oldest record, partial responses, halving, on failure)"
    return Check(read == wanted, f"{said}: {read}")


def _chain_check(target: Target) -> Check:
    """Each handler that emits onto the consumer's queue, through the relay on the emulator: its sample event with the
    most payload fields (the one most likely to use what emits, as the payment's receiptEmail) sent under a key of
    this run, and each message it emitted there applied by the function, which the emulator's relay fed it."""
    run, sent = f"chain-{int(time.time())}", []
    for handler in payloads.registered():
        if not set(handler.destinations) & target.relayed_here:
            continue
        payloads_ = [json.loads(body).get("payload") for body in sample_bodies(handler.event_type)]
        samples = [p for p in payloads_ if payloads.refusal(handler.payload_model, p) is None]
        if samples:
            sent.append(messages.drawn(handler, f"{run}-{handler.event_type}", max(samples, key=len)))
            smoke.send(target, sent[-1].body, sent[-1].group_id)
    if not sent:
        return Check(True, "no registered handler emits onto the consumer's queue: no chain to follow")
    deadline = time.monotonic() + smoke.DEFAULT_TIMEOUT_S
    wait(lambda: all(smoke.outcome(target, m) for m in sent), deadline)
    chained = smoke.chained(target, sent)
    relayed = wait(lambda: all(smoke.status(target, r) == "COMPLETED" for r in chained), deadline)
    return Check(
        bool(chained) and relayed,
        f"the chain through the emulator's relay: {len(sent)} sample(s) emitted {len(chained)} message(s) onto the"
        f" queue, each relayed and applied ({relayed}); a handler whose richest sample emits nothing fails this",
    )


def _refusals(url: str, group: str, role: str, tables: list[str], term: str = "") -> set[str]:
    """What the function's log lines (those holding ``term``) report its role was refused, each as ``refusal`` says."""
    filtered = client("logs", url).filter_log_events(logGroupName=group, filterPattern=f"AccessDenied {term}".strip())
    statements = client("iam", url).get_role_policy(RoleName=role, PolicyName="consumer")["PolicyDocument"]["Statement"]
    return {refusal(event["message"], statements, tables) for event in filtered["events"]}


def refusal(message: str, statements: list[dict[str, Any]], tables: list[str]) -> str:
    """``<action> on table <name>``: the emulator's refusal names the action only, so the table is each of the stack's
    ``tables`` that no statement allows that action on."""
    if not (found := REFUSAL.search(message)):
        return message[:300]
    allowed = {str(s["Resource"]) for s in statements if found[1] in s["Action"] or found[1] == s["Action"]}
    ungranted = [table for table in tables if not any(arn.endswith(f"/{table}") for arn in allowed)]
    return f"{found[1]} on table {' or '.join(ungranted) or '?'}"


def _grant_emulator_gaps(iam: Any, role: str, outputs: dict[str, str]) -> None:
    grants = [{"Effect": "Allow", "Action": a, "Resource": outputs[o]} for a, o in EMULATOR_ONLY_ACTIONS.items()]
    document = json.dumps({"Version": "2012-10-17", "Statement": grants})
    iam.put_role_policy(RoleName=role, PolicyName="emulator-gaps", PolicyDocument=document)
    for grant in grants:
        print(f"emulator gap: the role allowed {grant['Action']} (no such IAM action on AWS) on {grant['Resource']}")


def _negative_control(url: str, target: Target, role: str, group: str) -> Check:
    """Enforcement shown on in this run: the first handler's first table's grant taken away, a new message of it must
    be refused, kept, not applied. Also proves the log observable the positive run's "no refusal" check relies on."""
    iam, run = client("iam", url), f"n{int(time.time())}"
    handler = payloads.registered()[0]
    table = handler.tables[0]
    arn = target.dynamodb.describe_table(TableName=target.tables[table])["Table"]["TableArn"]
    document = iam.get_role_policy(RoleName=role, PolicyName="consumer")["PolicyDocument"]
    taken = [s for s in document["Statement"] if arn in json.dumps(s.get("Resource"))]
    document["Statement"] = [s for s in document["Statement"] if s not in taken]
    iam.put_role_policy(RoleName=role, PolicyName="consumer", PolicyDocument=json.dumps(document))
    (message,) = smoke.run_messages(run)[:1]
    payloads.put_seeds(target.dynamodb, target.tables, payloads.seed_items(handler, message.payload or {}))
    before = smoke.table_items(target.dynamodb, target.tables)
    smoke.send(target, message.body, message.group_id)
    tables = [target.idempotency_table, *target.tables.values()]
    wait(lambda: bool(_refusals(url, group, role, tables, run)), time.monotonic() + 30)
    refused = _refusals(url, group, role, tables, run)
    unchanged = smoke.table_items(target.dynamodb, target.tables) == before
    kept = sum(messages.queue_counts(target.sqs, target.queue_url))
    sids = [s.get("Sid") for s in taken]
    return Check(
        bool(taken) and bool(refused) and unchanged and kept == 1,
        f"negative control, {handler.event_type}'s grant on {table} ({sids}) taken away: a new message refused "
        f"({sorted(refused)} in the function's log), not applied (tables unchanged: {unchanged}), kept for a retry "
        f"({kept} message in the queue)",
    )


def _messages_checks(url: str, env: dict[str, str], target: Target) -> list[Check]:
    """make smoke's run (a message of each registered handler, its resend, a poison message), every message pushed with
    the AWS CLI; then nothing else in the DLQ."""
    command = [AWS_CLI, "--endpoint-url", url, "sqs", "send-message", "--queue-url", target.queue_url]
    checks = smoke.run_smoke(target, sender=lambda _, body, __: _run([*command, "--message-body", body], env))
    unexpected = [letter.reason for letter in dead_letters.peek(target.sqs, target.dead_letter_queue_url)]
    return [*checks, Check(not unexpected, f"nothing else in the DLQ: {unexpected}")]


def rehearse(server: Ministack, pid: int, sink: WebhookSink) -> list[Check]:
    url = server.endpoint_url
    # Dummy credentials only, and no AWS config that could name a real account.
    env = {**os.environ, **DUMMY_CREDENTIALS_ENV, "AWS_ENDPOINT_URL": url, "SAM_CLI_TELEMETRY": "0"}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    # What samconfig.toml cannot know (ARGS replaces its parameter_overrides): this run's webhook, the local values.
    template = Template.from_file(stack_name=STACK)
    given = {n: v for n, v in template.parameters.items() if "Default" not in template.document["Parameters"][n]}
    names = {table: template.parameters[table_parameter(table)] for table in template.local(LOCAL_TABLES)}
    create_template_tables(client("dynamodb", url), names)
    urls = " ".join(f"{name}={value}" for name, value in {**given, **webhook_parameters(sink)}.items())
    overrides = f"ARGS=--parameter-overrides Architecture=x86_64 {urls}"
    _run(["make", "deploy", "ARCH=x86_64", "CONFIG_ENV=rehearse", overrides], env)
    described = _run([AWS_CLI, "--endpoint-url", url, "cloudformation", "describe-stacks", "--stack-name", STACK], env)
    stack = json.loads(described)["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    parameters = {p["ParameterKey"]: p["ParameterValue"] for p in stack["Parameters"]}
    function = outputs["ConsumerFunctionName"]
    configuration = client("lambda", url).get_function_configuration(FunctionName=function)
    runs_on = (configuration["Runtime"], configuration["Architectures"])
    role, log_group = configuration["Role"].rsplit("/", 1)[-1], configuration["LoggingConfig"]["LogGroup"]
    _grant_emulator_gaps(client("iam", url), role, outputs)
    sqs, dynamodb = client("sqs", url), client("dynamodb", url)
    target = smoke.target_from_stack(client("cloudformation", url), client("lambda", url), sqs, dynamodb, STACK)
    checks = [
        Check(stack["StackStatus"] == "CREATE_COMPLETE", f"stack {STACK}: {stack['StackStatus']}"),
        Check({*OUTPUTS.values(), "ConsumerFunctionName"} <= outputs.keys(), f"outputs {sorted(outputs)}"),
        Check(runs_on == ("python3.13", ["x86_64"]), f"the function's runtime and architecture: {runs_on}"),
        _event_source_check(client("lambda", url), function, parameters),
        _relay_check(client("lambda", url), dynamodb, sqs, outputs),
        *_messages_checks(url, env, target),
        _chain_check(target),
    ]
    smoked = subprocess.run(["make", "smoke", f"STACK={STACK}"], cwd=REPO, env=env, check=False)
    refusals = _refusals(url, log_group, role, [target.idempotency_table, *target.tables.values()])
    checks += [
        Check(smoked.returncode == 0, f"make smoke STACK={STACK} against the emulator"),
        Check(not refusals, f"IAM enforced (AUTH=true): no call of the function refused so far {sorted(refusals)}"),
        _negative_control(url, target, role, log_group),  # last: sam delete follows, so the grant stays away
    ]
    _run([str(REPO / ".venv-sam/bin/sam"), "delete", "--config-env", "rehearse", "--no-prompts"], env)
    kept = client("dynamodb", url).list_tables()["TableNames"]
    retained = {table: name for table, name in target.tables.items() if table != OUTBOX_TABLE}
    groups = [group["logGroupName"] for group in client("logs", url).describe_log_groups()["logGroups"]]
    listeners = _listeners([pid, *children(pid)])
    checks += [
        Check(listeners == [f"{LOOPBACK}:{server.port}"], f"the emulator and its workers listen on {listeners} only"),
        Check(set(retained.values()) <= set(kept), "sam delete kept the declared tables (DeletionPolicy: Retain)"),
        Check(
            not {outputs["IdempotencyTableName"], outputs["OutboxTableName"]} & set(kept),
            "and removed the idempotency table and the outbox (Delete)",
        ),
        Check(any(STACK in group for group in groups), f"and kept the function's log group: {groups}"),
    ]
    return checks


def main(args: argparse.Namespace) -> int:
    started, workers, checks = time.monotonic(), [], []
    try:
        with (
            tempfile.TemporaryDirectory(prefix="rehearse-") as scratch,
            Ministack(scratch) as server,
            WebhookSink() as sink,
        ):
            assert server.pid is not None
            try:
                checks = rehearse(server, server.pid, sink)
            finally:
                workers = children(server.pid)  # the emulator's function workers
    except subprocess.CalledProcessError as error:
        print(f"error: {' '.join(error.cmd)} exited with {error.returncode}:\n{(error.stderr or error.stdout)[-3000:]}")
    finally:
        wait(lambda: not any(map(_running, workers)), time.monotonic() + 10)
        left = [worker for worker in workers if _running(worker)]
        for worker in left:  # started through the emulator, so ours to stop
            os.kill(worker, signal.SIGKILL)
    checks.append(Check(not left, f"nothing left running once the emulator stopped (left: {left})"))
    failed = show_checks(checks, lambda line: print(line, flush=True)) if len(checks) > 1 else 1
    print("not verifiable on the emulator:\n" + "\n".join(f"  - {gap}" for gap in CANNOT_VERIFY))
    print(f"rehearsal {'passed' if not failed else f'FAILED: {failed} check(s)'} in {time.monotonic() - started:.0f}s")
    return 1 if failed else 0


def add_parser(commands: Any) -> None:
    commands.add_parser("rehearse", help="sam build + deploy onto ministack, checked").set_defaults(handler=main)
