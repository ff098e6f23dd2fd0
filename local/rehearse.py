"""``make rehearse``: the real ``sam build`` + ``sam deploy`` onto ministack, an independent AWS emulator.

The stack is built by SAM CLI and created by the emulator's CloudFormation (with the SAM transform),
so the template, samconfig.toml's ``rehearse`` environment and the event source mapping are the ones a
user deploys, not this project's own reading of them. Messages go in with the AWS CLI; the checks read
the stack's outputs as a deployer would. The emulator's gaps are handled here, never in the template.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from local.demo import Check, show_checks
from local.smoke import OUTPUTS, POISON_ERROR_TYPE
from testkit import dead_letters, messages
from testkit.aws import DUMMY_CREDENTIALS_ENV, client
from testkit.processes import LOOPBACK, LoopbackServer

REPO = Path(__file__).resolve().parent.parent
MINISTACK_PYTHON = REPO / ".venv-ministack" / "bin" / "python"
AWS_CLI = REPO / ".venv" / "bin" / "aws"
STACK = "idempotent-sqs-consumer-rehearsal"  # samconfig.toml: [rehearse.global.parameters]
TIMEOUT_S = 120.0
CANNOT_VERIFY = (
    "TTL, point-in-time recovery and SSE on the tables: accepted by the emulator, not applied",
    "metrics and alarms: no EMF or SQS metrics, so the alarms and the dashboard stay without data",
    "the architecture: the function runs on this machine's interpreter whatever Architectures says (x86_64 here)",
    "batch sizes: the emulator's poller hands over batches of 1 or 2, never BatchSize",
    "IAM: the role's policies are not enforced (the emulator's AUTH=true refuses an action AWS does not have)",
)


class RehearsalError(Exception):
    """A step failed: one line saying which."""


class Ministack(LoopbackServer):
    """ministack (pinned in the Makefile) on 127.0.0.1 only: no IoT mTLS or SFTP listeners beside it."""

    name = "ministack"

    def _command(self, port: int) -> list[str]:
        # ``env`` execs the server, so the PID we hold is the emulator's own.
        settings = [f"GATEWAY_PORT={port}", f"BIND_HOST={LOOPBACK}", "IOT_MTLS_ENABLED=0", "SFTP_ENABLED=0"]
        return ["env", *settings, str(MINISTACK_PYTHON), "-m", "ministack"]


def _listeners(pid: int) -> list[str]:
    """The local addresses every TCP socket of ``pid`` listens on (``ss``)."""
    lines = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    return [line.split()[3] for line in lines if f"pid={pid}," in line]


def _children(pid: int) -> list[int]:
    """The emulator's child processes (its function workers)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit status waits for an init that may never collect it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def _run(what: str, command: list[str], env: dict[str, str]) -> str:
    print(f"$ {' '.join(command)}", flush=True)
    answer = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if answer.returncode != 0:
        raise RehearsalError(f"{what} failed ({answer.returncode}): {(answer.stderr or answer.stdout)[-3000:]}")
    return answer.stdout


def _wait(condition: Any, deadline: float) -> bool:
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
    return True


def _event_source_checks(lambda_: Any, function: str, parameters: dict[str, str]) -> list[Check]:
    """The mapping read back, and the emulator's gap: its CloudFormation keeps ScalingConfig.MaximumConcurrency as
    the string "5", on which its poller fails for every batch. botocore reads the string back as 5, so it is set
    again through the Lambda API unconditionally; on AWS this step does not exist."""
    (mapping,) = lambda_.list_event_source_mappings(FunctionName=function)["EventSourceMappings"]
    wanted = int(parameters["MaximumConcurrency"])
    lambda_.update_event_source_mapping(UUID=mapping["UUID"], ScalingConfig={"MaximumConcurrency": wanted})
    print(f"emulator gap: ScalingConfig.MaximumConcurrency set again to {wanted} through the Lambda API", flush=True)
    read = (mapping["State"], mapping["FunctionResponseTypes"], mapping["BatchSize"])
    return [
        Check(
            read == ("Enabled", ["ReportBatchItemFailures"], int(parameters["BatchSize"])),
            f"the queue's event source mapping (state, response types, batch size): {read}",
        )
    ]


def _messages_checks(url: str, env: dict[str, str], outputs: dict[str, str], deadline: float) -> list[Check]:
    """Payments, a resend and a poison message pushed with the AWS CLI; the ledger and the DLQ read back."""
    sqs, dynamodb = client("sqs", url), client("dynamodb", url)
    run = f"r{int(time.time())}"
    sent = [messages.payment(f"{run}-{i}", f"{run}-p{i}", f"{run}-acc{i % 2}", 1000 + i) for i in range(4)]
    sent.append(sent[0])  # the producer's resend: same body, same key, a new message
    poison = messages.poison(1)[0]
    for message in [*sent, poison]:
        _run(
            "aws sqs send-message",
            [
                str(AWS_CLI),
                "sqs",
                "send-message",
                "--endpoint-url",
                url,
                "--queue-url",
                outputs["ConsumerQueueUrl"],
                "--message-body",
                message.body,
            ],
            env,
        )

    def balances() -> dict[str, int]:
        found = {}
        for account in {m.payload["accountId"] for m in sent if m.payload}:
            item = dynamodb.get_item(
                TableName=outputs["LedgerTableName"],
                ConsistentRead=True,
                Key={"accountId": {"S": account}, "entryId": {"S": "BALANCE"}},
            ).get("Item")
            found[account] = int(item["balanceCents"]["N"]) if item else 0
        return found

    def poison_letter() -> dead_letters.DeadLetter | None:
        letters = dead_letters.peek(sqs, outputs["DeadLetterQueueUrl"])
        return next((letter for letter in letters if letter.body == poison.body), None)

    expected = messages.expected_balances(sent)
    exact = _wait(lambda: balances() == expected, deadline)
    idle = _wait(lambda: sum(messages.queue_counts(sqs, outputs["ConsumerQueueUrl"])) == 0, deadline)
    letter = poison_letter() if _wait(lambda: poison_letter() is not None, deadline) else None
    entries = sum(
        dynamodb.query(
            TableName=outputs["LedgerTableName"],
            ConsistentRead=True,
            KeyConditionExpression="accountId = :a AND begins_with(entryId, :p)",
            ExpressionAttributeValues={":a": {"S": account}, ":p": {"S": "PAYMENT#"}},
        )["Count"]
        for account in expected
    )
    return [
        Check(exact, f"ledger exact: balances {balances()} == {expected} (4 payments, 1 resend)"),
        Check(entries == 4, f"one ledger entry per payment, the resend not applied ({entries} of 4)"),
        Check(idle, "the queue drained: every message handled or dead-lettered"),
        Check(
            letter is not None and letter.error_type == POISON_ERROR_TYPE,
            f"the poison message is in the DLQ with ErrorType {POISON_ERROR_TYPE} "
            f"(found {letter.error_type if letter else None})",
        ),
    ]


def rehearse(server: Ministack) -> list[Check]:
    url = server.endpoint_url
    env = {
        **os.environ,
        **DUMMY_CREDENTIALS_ENV,
        "AWS_ENDPOINT_URL": url,
        "SAM_CLI_TELEMETRY": "0",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    assert server.pid is not None
    listeners = _listeners(server.pid)
    checks = [Check(listeners == [f"{LOOPBACK}:{server.port}"], f"the emulator listens on {listeners} only")]
    started = time.monotonic()
    _run("make deploy", ["make", "deploy", "ARCH=x86_64", "CONFIG_ENV=rehearse"], env)
    print(f"sam build + sam deploy: {time.monotonic() - started:.0f}s", flush=True)
    described = json.loads(
        _run(
            "describe-stacks",
            [str(AWS_CLI), "cloudformation", "describe-stacks", "--endpoint-url", url, "--stack-name", STACK],
            env,
        )
    )
    stack = described["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    parameters = {p["ParameterKey"]: p["ParameterValue"] for p in stack.get("Parameters", [])}
    checks.append(Check(stack["StackStatus"] == "CREATE_COMPLETE", f"stack {STACK}: {stack['StackStatus']}"))
    wanted = {*OUTPUTS.values(), "ConsumerFunctionName"}
    checks.append(Check(wanted <= outputs.keys(), f"outputs {sorted(outputs)}"))
    function = outputs["ConsumerFunctionName"]
    configuration = client("lambda", url).get_function_configuration(FunctionName=function)
    checks.append(
        Check(
            configuration["Architectures"] == ["x86_64"] and configuration["Runtime"] == "python3.12",
            f"function {configuration['Runtime']} {configuration['Architectures']} (Architecture param)",
        )
    )
    checks += _event_source_checks(client("lambda", url), function, parameters)
    checks += _messages_checks(url, env, outputs, time.monotonic() + TIMEOUT_S)
    smoke = subprocess.run(["make", "smoke", f"STACK={STACK}"], cwd=REPO, env=env, check=False)
    checks.append(Check(smoke.returncode == 0, f"make smoke STACK={STACK} against the emulator"))
    _run(
        "sam delete",
        [str(REPO / ".venv-sam" / "bin" / "sam"), "delete", "--config-env", "rehearse", "--no-prompts"],
        env,
    )
    dynamodb, logs = client("dynamodb", url), client("logs", url)
    tables = dynamodb.list_tables()["TableNames"]
    groups = [group["logGroupName"] for group in logs.describe_log_groups()["logGroups"]]
    checks += [
        Check(outputs["LedgerTableName"] in tables, "sam delete kept the ledger table (DeletionPolicy: Retain)"),
        Check(outputs["IdempotencyTableName"] not in tables, "and removed the idempotency table (Delete)"),
        Check(any(STACK in group for group in groups), f"and kept the function's log group: {groups}"),
    ]
    return checks


def main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    server = Ministack()
    try:
        with server:
            pid = server.pid
            checks = rehearse(server)
            workers = _children(pid) if pid else []
        _wait(lambda: not any(_running(worker) for worker in workers), time.monotonic() + 10)
        left = [worker for worker in workers if _running(worker)]
        for worker in left:  # started through the emulator, so ours to stop
            os.kill(worker, signal.SIGKILL)
        checks.append(Check(not left, f"nothing left running after the emulator stopped (left: {left})"))
    except RehearsalError as error:
        print(f"error: {error}", flush=True)
        return 1
    failed = show_checks(checks, lambda line: print(line, flush=True))
    print("not verifiable on the emulator:\n" + "\n".join(f"  - {gap}" for gap in CANNOT_VERIFY))
    print(f"rehearsal {'passed' if not failed else f'FAILED: {failed} check(s)'} in {time.monotonic() - started:.0f}s")
    return 1 if failed else 0


def add_parser(commands: Any) -> None:
    help_text = "sam build + sam deploy onto ministack, messages, checks, sam delete"
    commands.add_parser("rehearse", help=help_text).set_defaults(handler=main)
