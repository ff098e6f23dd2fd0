"""The function in Lambda's own runtime (emulator + awslambdaric on Python 3.13), through its failure paths.

One execution environment per handler, shared by the tests of this module: cold starts
are the expensive part, so only the tests about cold starts make new ones.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from local.poller import BatchVerdict, Poller
from local.stack import DeployedStack, deploy_stack
from testkit import messages, payloads
from testkit.invocation import Invocation
from testkit.lambda_runtime import (
    EmulatorExited,
    HandlerImportError,
    LambdaEnvironment,
    LambdaFleet,
    PortTaken,
)
from testkit.lambda_sqs import sqs_event
from testkit.lambda_venv import venv_python
from testkit.processes import LOOPBACK, alive, children
from testkit.resources import FunctionSpec
from testkit.servers import LocalServers
from testkit.webhook import WebhookSink
from tests.tooling import generic
from tests.tooling.template_copies import on_the_cores_own_application

pytestmark = pytest.mark.cores_own_application
test_on_the_cores_own_application = on_the_cores_own_application(__name__, seconds=90)

FAULTY = """
import time


def raises(event, context):
    raise ValueError("the handler failed on purpose")


def sleeps(event, context):
    time.sleep(float(event.get("sleep_s", 5)))
    return {"slept": True}


def unserialisable(event, context):
    return {"batchItemFailures": {1, 2}}


def echo(event, context):
    return {"remaining_ms": context.get_remaining_time_in_millis(), "memory": context.memory_limit_in_mb,
            "function_name": context.function_name}
"""


@pytest.fixture(scope="module")
def consumer(local_servers: LocalServers, webhook_sink: WebhookSink) -> Iterator[DeployedStack]:
    """The template's function in one execution environment, on tables and queues of its own."""
    stack = deploy_stack(local_servers, webhook=webhook_sink)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def faulty_code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    code_dir = tmp_path_factory.mktemp("faulty")
    (code_dir / "faulty.py").write_text(FAULTY, encoding="utf-8")
    return code_dir


def _faulty(consumer: DeployedStack, code_dir: Path, handler: str, timeout_s: int = 3) -> FunctionSpec:
    return replace(consumer.function, handler=f"faulty.{handler}", code_dir=code_dir, timeout_s=timeout_s)


def _environment(consumer: DeployedStack, function: FunctionSpec) -> LambdaEnvironment:
    return LambdaEnvironment(function, consumer.function_environment, python=venv_python(), name="test").start()


def _not_visible(consumer: DeployedStack) -> int:
    attributes = consumer.servers.client("sqs").get_queue_attributes(
        QueueUrl=consumer.queue.url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessagesNotVisible"])


# -- the consumer, one sample event per outcome ------------------------------------------------


def _invoke(consumer: DeployedStack, *bodies: str) -> Invocation:
    invocation = consumer.runtime.invoke(sqs_event(bodies))
    assert invocation.succeeded, invocation.error
    return invocation


@pytest.mark.parametrize("handler", generic.HANDLERS, ids=generic.IDS)
def test_applied_then_duplicate_in_the_same_warm_environment(consumer: DeployedStack, handler: generic.Handler) -> None:
    message = generic.drawn(consumer, handler, f"warm-{handler.event_type}", seed=11)
    first = _invoke(consumer, message.body)
    once = generic.declared_items(consumer)
    again = _invoke(consumer, message.body)

    assert first.response == again.response == {"batchItemFailures": []}
    assert again.init_duration_ms is None  # warm: the same runtime process answered
    assert generic.outcome(consumer, message) is not None
    assert generic.declared_items(consumer) == once


@pytest.mark.parametrize("handler", generic.HANDLERS, ids=generic.IDS)
def test_poison_is_handled_not_failed(consumer: DeployedStack, handler: generic.Handler) -> None:
    refused = payloads.invalid_payloads(handler)[0].payload
    body = messages.envelope(handler.event_type, f"refused-{handler.event_type}", refused)
    assert _invoke(consumer, body).response == {"batchItemFailures": []}
    assert any(letter.body == body and letter.error_type == "SchemaViolation" for letter in generic.letters(consumer))


@pytest.mark.parametrize("handler", generic.HANDLERS, ids=generic.IDS)
def test_a_key_held_by_another_worker_is_in_flight(consumer: DeployedStack, handler: generic.Handler) -> None:
    message = generic.drawn(consumer, handler, f"held-elsewhere-{handler.event_type}", seed=12)
    generic.hold(consumer, message, for_ms=600_000)
    event, before = sqs_event([message.body]), generic.declared_items(consumer)

    invocation = consumer.runtime.invoke(event)

    assert invocation.response == {"batchItemFailures": [{"itemIdentifier": event["Records"][0]["messageId"]}]}
    held = generic.record(consumer, message.event_type, message.key)
    assert held is not None and held["ownerToken"]["S"] == "another-worker"  # still the other worker's claim
    assert generic.declared_items(consumer) == before


# -- the runtime's own behaviour ---------------------------------------------------------------


def test_the_runtime_gets_lambdas_variables_and_deadline(consumer: DeployedStack, faulty_code: Path) -> None:
    function = replace(_faulty(consumer, faulty_code, "echo"), memory_mb=1024)
    with _environment(consumer, function) as environment:
        invocation = environment.invoke({})

    assert invocation.init_duration_ms is not None
    assert invocation.response["memory"] == "1024"  # a string, as in Lambda's Python runtime
    assert invocation.response["function_name"] == function.name
    # Timeout less what had passed when the handler asked: the emulator counts the cold start against Timeout.
    assert 3_000 - invocation.duration_s * 1000 <= invocation.response["remaining_ms"] <= 3_000


def test_a_timeout_kills_the_runtime_and_the_next_invocation_starts_cold(
    consumer: DeployedStack, faulty_code: Path
) -> None:
    # The 3 s Timeout leaves both cold starts far from it (the emulator counts them against it) and the 10 s sleep
    # past it, by construction.
    with _environment(consumer, _faulty(consumer, faulty_code, "sleeps", timeout_s=3)) as environment:
        warm = environment.invoke({"sleep_s": 0})
        first_runtime = next(iter(children(environment.pid or 0)), None)  # the runtime the emulator runs now
        timed_out = environment.invoke({"sleep_s": 10})
        after = environment.invoke({"sleep_s": 0})

    assert warm.succeeded and warm.init_duration_ms is not None
    assert timed_out.timed_out and not timed_out.succeeded
    assert 3.0 <= timed_out.duration_s < 10.0  # cut at Timeout, before the sleep ends
    assert first_runtime is not None and not alive(first_runtime)
    assert after.succeeded and after.init_duration_ms is not None
    assert environment.cold_starts == 2


def test_a_handler_that_does_not_import_is_a_clear_error(consumer: DeployedStack, faulty_code: Path) -> None:
    function = replace(consumer.function, handler="no_such_module.handler")
    with pytest.raises(HandlerImportError, match=r"'no_such_module.handler' does not import.*No module named"):
        LambdaFleet(function, consumer.function_environment)

    with _environment(consumer, function) as environment:
        invocation = environment.invoke({})
    assert invocation.error_type == "Runtime.ImportModuleError"


# A listener is refused before the emulator starts; a port only bound makes the emulator fail to bind.
@pytest.mark.parametrize("listens", [True, False], ids=["listened-on", "bound"])
def test_a_taken_port_is_a_clear_error_and_nothing_runs(
    consumer: DeployedStack, faulty_code: Path, listens: bool
) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        if listens:
            taken.listen()
        port = taken.getsockname()[1]
        environment = LambdaEnvironment(
            _faulty(consumer, faulty_code, "echo"),
            consumer.function_environment,
            python=venv_python(),
            emulator_port=port,
        )
        with pytest.raises(PortTaken, match=f"port 127.0.0.1:{port} is already in use"):
            environment.start()
    assert environment.pid is None


def test_an_emulator_that_dies_is_a_clear_error(consumer: DeployedStack, faulty_code: Path) -> None:
    environment = _environment(consumer, _faulty(consumer, faulty_code, "echo"))
    try:
        assert environment.pid is not None
        os.kill(environment.pid, signal.SIGKILL)
        time.sleep(0.2)
        with pytest.raises(EmulatorExited, match=r"emulator of test \(pid \d+\) exited with code -9"):
            environment.invoke({})
    finally:
        environment.stop()


# -- whole-batch failures, as the event source mapping sees them ---------------------------------


@pytest.mark.parametrize(
    ("handler", "error_type"), [("raises", "ValueError"), ("unserialisable", "Runtime.MarshalError")]
)
def test_a_failed_invocation_deletes_nothing(
    consumer: DeployedStack, faulty_code: Path, handler: str, error_type: str
) -> None:
    sqs = consumer.servers.client("sqs")
    held_before = _not_visible(consumer)
    for body in ("one", "two"):
        sqs.send_message(QueueUrl=consumer.queue.url, MessageBody=body)
    with _environment(consumer, _faulty(consumer, faulty_code, handler)) as environment:
        report = Poller(sqs, consumer.queue, consumer.trigger, environment).poll_once()

    assert report is not None
    assert report.verdict is BatchVerdict.RAISED
    assert report.invocation.error_type == error_type
    assert (report.received, report.deleted) == (2, 0)
    # Undeleted, they wait out their visibility timeout and come back.
    assert _not_visible(consumer) == held_before + 2
