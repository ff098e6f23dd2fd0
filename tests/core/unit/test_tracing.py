"""Tracing on demand (``TRACING=true``): one X-Ray subsegment per call, sent to the daemon; nothing of it when off.

The daemon is a UDP socket on loopback: a datagram sent on loopback is in its buffer when ``sendto`` returns, so
reading without waiting sees every document the invocation sent, and an empty read is a real "nothing sent".
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any

import botocore.config
import botocore.exceptions
import botocore.session
import pytest

from consumer import webhook
from consumer.errors import PoisonMessage, TransientError
from consumer.tracing import Tracer
from consumer.webhook import WebhookClient
from testkit.lambda_sqs import sqs_record
from testkit.processes import LOOPBACK, free_port
from testkit.webhook import Answer, WebhookSink
from tests.core.handlers import tally_body
from tests.core.unit.conftest import TALLIES, fresh_interpreter, function_tables, run, table_environment

ROOT, PARENT = "1-67891233-abcdef012345678912345678", "53995c3f42cd8ad8"
SAMPLED = f"Root={ROOT};Parent={PARENT};Sampled=1"


class Daemon:
    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.setblocking(False)
        self.address = f"127.0.0.1:{self.socket.getsockname()[1]}"

    def documents(self) -> list[dict[str, Any]]:
        """Every document received so far, each checked for the daemon's header line."""
        received: list[dict[str, Any]] = []
        while True:
            try:
                datagram = self.socket.recv(65_536)
            except BlockingIOError:
                return received
            header, _, body = datagram.partition(b"\n")
            assert json.loads(header) == {"format": "json", "version": 1}
            received.append(json.loads(body))


def closed_port_address() -> str:
    """A loopback address nothing listens on (free a moment ago): a connection there is refused."""
    return f"{LOOPBACK}:{free_port()}"


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    listener = Daemon()
    yield listener
    listener.socket.close()


@pytest.fixture
def traced(function_env: str, daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TRACING", "true")
    monkeypatch.setenv("AWS_XRAY_DAEMON_ADDRESS", daemon.address)
    monkeypatch.setenv("_X_AMZN_TRACE_ID", SAMPLED)
    monkeypatch.setattr(webhook, "trace_call", webhook.trace_call)  # put back after the test
    return function_env


def test_with_tracing_on_each_call_of_a_batch_is_a_subsegment_of_the_invocations_segment(
    traced: str, daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    event = {"Records": [sqs_record("good", tally_body("p-1")), sqs_record("bad", "{oops")]}

    response, _ = run(event, capsys)

    assert response == {"batchItemFailures": []}
    documents = daemon.documents()
    calls = [(document["name"], document["aws"]["operation"]) for document in documents]
    assert ("SQS", "SendMessage") in calls  # the poison message's dead letter
    (write,) = [document for document in documents if document["aws"]["operation"] == "TransactWriteItems"]
    assert write["trace_id"] == ROOT and write["parent_id"] == PARENT and write["type"] == "subsegment"
    assert write["namespace"] == "aws" and TALLIES in write["aws"]["table_names"]
    assert write["http"]["response"]["status"] == 200 and write["start_time"] <= write["end_time"]
    assert not {"error", "fault", "throttle"} & write.keys()
    assert len({document["id"] for document in documents}) == len(documents)


def test_a_refused_write_is_an_error_subsegment_and_the_message_keeps_its_outcome(
    traced: str, daemon: Daemon, capsys: pytest.CaptureFixture[str]
) -> None:
    run({"Records": [sqs_record("first", tally_body("p-1"))]}, capsys)
    daemon.documents()

    response, _ = run({"Records": [sqs_record("resent", tally_body("p-1"))]}, capsys)

    assert response == {"batchItemFailures": []}  # a duplicate, not a failure
    (write,) = [document for document in daemon.documents() if document["aws"]["operation"] == "TransactWriteItems"]
    assert write["http"]["response"]["status"] == 400 and write["error"] is True
    assert "fault" not in write


def test_an_invocation_lambda_did_not_sample_sends_nothing(
    traced: str, daemon: Daemon, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("_X_AMZN_TRACE_ID", SAMPLED.replace("Sampled=1", "Sampled=0"))

    response, _ = run({"Records": [sqs_record("good", tally_body("p-1"))]}, capsys)

    assert response == {"batchItemFailures": []}
    assert daemon.documents() == []


@pytest.mark.parametrize(("tracing", "imported"), [("false", False), ("true", True)])
def test_tracing_off_imports_nothing_of_it(tracing: str, imported: bool) -> None:
    # A fresh interpreter, as Lambda starts one: whatever a test before imported does not count.
    variables = {
        **table_environment(),
        "DEAD_LETTER_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/dlq",
        "TRACING": tracing,
    }
    script = (
        "import sys, boto3, moto; moto.mock_aws().start(); import tests.core.handlers as t;"
        f" t.create_test_tables(boto3.client('dynamodb', region_name='us-east-1'), {function_tables()!r});"
        " from consumer import app; app.lambda_handler((t.TallyHandler, t.CallHandler)).build_consumer();"
        " print(int('consumer.tracing' in sys.modules))"
    )
    assert fresh_interpreter(script, variables)[-1] == str(int(imported))


@pytest.fixture
def traced_client(daemon: Daemon, webhook: WebhookSink, monkeypatch: pytest.MonkeyPatch) -> WebhookClient:
    tracer = Tracer(daemon.address, {"_X_AMZN_TRACE_ID": SAMPLED})
    monkeypatch.setattr("consumer.webhook.trace_call", tracer.http_call)
    return WebhookClient(f"{webhook.url}/receipts?token=secret")


@pytest.mark.parametrize(
    ("status", "flags"),
    [(200, {}), (404, {"error": True}), (429, {"error": True, "throttle": True}), (503, {"fault": True})],
)
def test_a_webhook_call_is_a_remote_subsegment_with_its_status_without_the_query(
    traced_client: WebhookClient, webhook: WebhookSink, daemon: Daemon, status: int, flags: dict[str, bool]
) -> None:
    webhook.answer_next(Answer(status))

    # What the client makes of each status is its own tests'; the subsegment is what is checked here.
    with contextlib.suppress(PoisonMessage, TransientError):
        traced_client.post(b"{}", "key-1", deadline_s=5)

    (call,) = daemon.documents()
    assert call["namespace"] == "remote" and call["name"] == webhook.url.removeprefix("http://")
    assert call["http"] == {
        "request": {"method": "POST", "url": f"{webhook.url}/receipts"},
        "response": {"status": status},
    }
    assert {key: call[key] for key in ("error", "throttle", "fault") if key in call} == flags
    assert call["trace_id"] == ROOT and call["parent_id"] == PARENT


def test_an_unreachable_webhook_is_a_fault_subsegment_naming_the_error(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracer = Tracer(daemon.address, {"_X_AMZN_TRACE_ID": SAMPLED})
    monkeypatch.setattr("consumer.webhook.trace_call", tracer.http_call)

    with pytest.raises(TransientError, match="unreachable"):
        WebhookClient(f"http://{closed_port_address()}/x").post(b"{}", "key-1", deadline_s=5)

    (call,) = daemon.documents()
    assert call["fault"] is True and call["cause"]["exceptions"][0]["type"] == "ConnectionRefusedError"
    assert "response" not in call["http"]


def test_a_daemon_that_cannot_be_reached_never_fails_the_call(
    webhook: WebhookSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracer = Tracer("no-such-host.invalid:2000", {"_X_AMZN_TRACE_ID": SAMPLED})
    monkeypatch.setattr("consumer.webhook.trace_call", tracer.http_call)

    assert WebhookClient(f"{webhook.url}/receipts").post(b"{}", "key-1", deadline_s=5).status == 200


def test_an_sdk_call_that_never_answers_is_a_fault_subsegment_naming_the_error(daemon: Daemon) -> None:
    session = botocore.session.get_session()
    Tracer(daemon.address, {"_X_AMZN_TRACE_ID": SAMPLED}).trace_sdk(session)
    config = botocore.config.Config(retries={"total_max_attempts": 1}, connect_timeout=1)
    sqs = session.create_client(
        "sqs",
        "us-east-1",
        endpoint_url=f"http://{closed_port_address()}",
        config=config,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )

    with pytest.raises(botocore.exceptions.EndpointConnectionError):
        sqs.send_message(QueueUrl="https://sqs.us-east-1.amazonaws.com/123456789012/dlq", MessageBody="{}")  # type: ignore[attr-defined]

    (call,) = daemon.documents()
    assert (call["name"], call["aws"]["operation"], call["fault"]) == ("SQS", "SendMessage", True)
    assert call["cause"]["exceptions"][0]["type"] == "EndpointConnectionError" and "http" not in call
