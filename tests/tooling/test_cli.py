"""The commands as the docs give them: run, send, dlq, redrive, invoke; nothing left running after."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from consumer.envelope import KeySource, parse_message
from local import state
from testkit import payloads
from testkit.processes import alive
from testkit.servers import LocalServers
from tests.kit import drain
from tests.tooling.template_copies import on_the_cores_own_application

REPO_ROOT = Path(__file__).resolve().parents[2]
# As the Makefile runs the commands: the local stack's message builders use the consumer's names.
_COMMAND_PATH = {"PYTHONPATH": str(REPO_ROOT / "src")}
pytestmark = [pytest.mark.integration, pytest.mark.cores_own_application]
test_on_the_cores_own_application = on_the_cores_own_application(__name__, seconds=150)


def _local(state_dir: Path, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "local", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **_COMMAND_PATH, "LOCAL_STACK_DIR": str(state_dir)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _children(pid: int) -> set[int]:
    listed = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False)
    return {int(line) for line in listed.stdout.split()}


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.long(70)
def test_run_then_send_dlq_redrive_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    run = subprocess.Popen(
        [sys.executable, "-m", "local", "run", "--pollers", "2"],
        cwd=REPO_ROOT,
        env={**os.environ, **_COMMAND_PATH, "LOCAL_STACK_DIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for(lambda: state_file.exists() or run.poll() is not None, 90, "the stack to start")
        assert run.poll() is None, run.stdout.read() if run.stdout else ""
        # DynamoDB Local, its conflict proxy, the moto server and one runtime emulator per poller.
        _wait_for(lambda: len(_children(run.pid)) == 5, 30, "the servers and the pollers' runtime emulators")
        servers = _children(run.pid)
        state = json.loads(state_file.read_text())

        sent = _local(tmp_path, "send", "--count", "20", "--duplicates", "0.5", "--seed", "1")
        assert sent.returncode == 0, sent.stderr
        assert "sent " in sent.stdout
        poison = _local(tmp_path, "send", "--type", "poison", "--count", "3")
        assert poison.returncode == 0, poison.stderr
        # A type no handler takes yet, as a user pushes one before registering its handler.
        custom = _local(tmp_path, "send", "--type", "ShipmentBooked", "--payload", '{"sku": "sku-1"}')
        assert custom.returncode == 0, custom.stderr
        custom_id = custom.stdout.split("message id(s): ")[1].split()[0]

        def dead_lettered() -> int:
            listed = _local(tmp_path, "dlq")
            assert listed.returncode == 0, listed.stderr
            return int(listed.stdout.split()[0])

        # Invalid JSON, an unknown event type, a payload each handler's model refuses, and the custom type.
        parked = 3 + len(payloads.registered())
        _wait_for(lambda: dead_lettered() == parked, 60, f"{parked} dead letters")
        listing = _local(tmp_path, "dlq").stdout
        assert f"- {custom_id} (in the DLQ as " in listing
        assert {"ErrorType: InvalidJson", "ErrorType: SchemaViolation", "ErrorType: UnknownEventType"} <= {
            line.strip() for line in listing.splitlines()
        }
        # Each listed under the id it was sent with (the consumer's logs name it), its DLQ copy's id beside it.
        originals = [line.split()[1] for line in listing.splitlines() if "(in the DLQ as " in line]
        copies = [line.split()[-1].rstrip(")") for line in listing.splitlines() if "(in the DLQ as " in line]
        assert len(originals) == parked and not set(originals) & set(copies), listing

        moved = _local(tmp_path, "redrive")
        assert moved.returncode == 0, moved.stderr
        assert moved.stdout.startswith(f"moved {parked} ")
        # Still poison: the pollers dead-letter them again.
        _wait_for(lambda: dead_lettered() == parked, 60, "the redriven poison to come back")

        assert state["queue_url"].startswith(state["sqs_endpoint_url"])
    finally:
        run.send_signal(signal.SIGINT)
        output, _ = run.communicate(timeout=60)

    assert run.returncode == 0, output
    assert "make send" in output
    assert "aws sqs send-message --endpoint-url" in output
    assert "aws dynamodb scan --endpoint-url" in output and "aws dynamodb put-item --endpoint-url" in output
    assert "loses everything at exit" in output
    assert "batch of" in output
    assert not state_file.exists()
    assert not any(alive(pid) for pid in servers)


def test_send_without_a_running_stack_says_how_to_start_one(tmp_path: Path) -> None:
    answer = _local(tmp_path, "send", "--count", "1")
    assert answer.returncode != 0
    assert "make run" in answer.stderr


@pytest.mark.long(20)
def test_invoke_without_a_running_stack_starts_one_and_prints_the_response(tmp_path: Path) -> None:
    answer = _local(tmp_path, "invoke", "events/poison-invalid-json.json")
    assert answer.returncode == 0, answer.stderr
    response = json.loads(answer.stdout[answer.stdout.rindex('{\n  "batchItemFailures"') :])
    assert response == {"batchItemFailures": []}
    assert "dead-lettered: InvalidJson" in answer.stderr


@pytest.mark.long(30)
def test_demo_passes_its_checks_on_a_small_workload(tmp_path: Path) -> None:
    answer = _local(tmp_path, "demo", "--messages", "20", "--pollers", "2", timeout_s=240)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert "all checks passed" in answer.stdout
    assert "FAIL" not in answer.stdout
    # Invalid JSON, an unknown event type, and per registered handler a refused payload and two reused keys.
    assert f"dead-lettered          {2 + 3 * len(payloads.registered())}:" in answer.stdout


@pytest.mark.parametrize(
    ("content", "said"), [(None, "no event file"), ("{not json", "cannot be read as JSON"), ("[]", "not an SQS event")]
)
def test_invoke_on_a_bad_event_file_says_what_is_wrong_in_one_line(
    tmp_path: Path, content: str | None, said: str
) -> None:
    event = tmp_path / "event.json"
    if content is not None:
        event.write_text(content)
    done = _local(tmp_path, "invoke", str(event), timeout_s=60)
    assert done.returncode == 1
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_make_invoke_without_event_names_the_variable() -> None:
    done = subprocess.run(
        ["make", "-s", "invoke", "EVENT="], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode != 0
    assert "EVENT=" in done.stderr, done.stderr


@pytest.fixture
def queue(local_servers: LocalServers, tmp_path: Path) -> str:
    """A stack published as `make run` publishes it, with no poller: what `send` sends stays on its queue."""
    resources = local_servers.deploy()
    queue = resources.queues["ConsumerQueue"]
    published = state.StackState(
        pid=os.getpid(),
        stack_name=resources.stack_name,
        dynamodb_endpoint_url=local_servers.dynamodb_endpoint_url,
        sqs_endpoint_url=local_servers.sqs_endpoint_url,
        queue_url=queue.url,
        dead_letter_queue_url=resources.dead_letter_queue(queue).url,
        tables={logical_id: table.name for logical_id, table in resources.tables.items()},
        function={},
        function_environment={},
    )
    state.write(published, tmp_path / "state.json")
    return queue.url


def _on_the_queue(local_servers: LocalServers, queue_url: str) -> dict[str, str]:
    """Each message on the queue by its id: its body."""
    return {letter.message_id: letter.body for letter in drain(local_servers.client("sqs"), queue_url)}


def _sent_ids(sent: subprocess.CompletedProcess[str]) -> set[str]:
    assert sent.returncode == 0, sent.stderr
    return set(sent.stdout.split("message id(s):")[1].splitlines()[0].split())


def test_send_any_event_type_with_its_payload_in_the_usual_envelope(
    local_servers: LocalServers, queue: str, tmp_path: Path
) -> None:
    payload = {"sku": "sku-1", "quantity": 2}
    sent = _local(tmp_path, "send", "--type", "ShipmentBooked", "--payload", json.dumps(payload), "--count", "3")
    on_queue = _on_the_queue(local_servers, queue)
    assert set(on_queue) == _sent_ids(sent)
    parsed = [parse_message({"messageId": message_id, "body": body}) for message_id, body in on_queue.items()]
    assert {(message.event_type, message.key_source) for message in parsed} == {("ShipmentBooked", KeySource.BODY)}
    assert all(message.payload == payload for message in parsed)
    assert len({message.idempotency_key for message in parsed}) == 3  # a fresh key each


def test_send_with_a_key_sends_one_message_and_its_resends(
    local_servers: LocalServers, queue: str, tmp_path: Path
) -> None:
    sent = _local(tmp_path, "send", "--type", "ShipmentBooked", "--payload", "{}", "--count", "2", "--key", "k-1")
    bodies = [json.loads(body) for body in _on_the_queue(local_servers, queue).values()]
    assert len(_sent_ids(sent)) == 2
    assert bodies == 2 * [{"eventType": "ShipmentBooked", "metadata": {"idempotencyKey": "k-1"}, "payload": {}}]


def test_send_with_a_payload_sends_one_message_unless_counted(
    local_servers: LocalServers, queue: str, tmp_path: Path
) -> None:
    sent = _local(tmp_path, "send", "--type", "ShipmentBooked", "--payload", '{"sku": "sku-1"}')
    assert len(_sent_ids(sent)) == 1 == len(_on_the_queue(local_servers, queue))


def test_send_bodies_sends_each_line_as_it_is(local_servers: LocalServers, queue: str, tmp_path: Path) -> None:
    lines = ['{"eventType": "ShipmentBooked", "payload": {"sku": "sku-1"}}', "   ", '{"not": "an envelope"}', ""]
    bodies = tmp_path / "bodies.jsonl"
    bodies.write_text("\n".join(lines) + "\n")
    sent = _local(tmp_path, "send", "--bodies", str(bodies))
    on_queue = _on_the_queue(local_servers, queue)
    assert set(on_queue) == _sent_ids(sent)
    assert sorted(on_queue.values()) == sorted([lines[0], lines[2]])


@pytest.mark.parametrize("handler", payloads.registered(), ids=[h.event_type for h in payloads.registered()])
def test_send_draws_messages_of_a_registered_handler_from_its_model(
    local_servers: LocalServers, queue: str, tmp_path: Path, handler: payloads.Handler
) -> None:
    sent = _local(tmp_path, "send", "--type", handler.event_type, "--count", "2")
    bodies = [json.loads(body) for body in _on_the_queue(local_servers, queue).values()]
    assert len(_sent_ids(sent)) == 2
    assert [body["eventType"] for body in bodies] == [handler.event_type] * 2
    assert [payloads.refusal(handler.payload_model, body["payload"]) for body in bodies] == [None, None]
    assert len({body["metadata"]["idempotencyKey"] for body in bodies}) == 2


def test_send_file_sends_the_records_of_an_event_file(local_servers: LocalServers, queue: str, tmp_path: Path) -> None:
    sent = _local(tmp_path, "send", "--file", "events/poison-invalid-json.json")
    record = json.loads((REPO_ROOT / "events/poison-invalid-json.json").read_text())["Records"][0]
    assert list(_on_the_queue(local_servers, queue).values()) == [record["body"]]
    assert len(_sent_ids(sent)) == 1


@pytest.mark.parametrize(
    ("args", "status", "said"),
    [
        (["--type", "ShipmentBooked", "--payload", "{sku: 1}"], 2, "--payload is not JSON"),
        (["--type", "ShipmentBooked"], 2, "--type ShipmentBooked needs --payload"),
        (["--key", "k-1"], 2, "--key goes with --payload"),
        (["--bodies", "bodies.jsonl"], 1, "bodies.jsonl line 3 is not a JSON body"),
        (["--bodies", "missing.jsonl"], 1, "missing.jsonl cannot be read"),
    ],
)
def test_send_refuses_bad_input_in_one_line_and_sends_nothing(
    local_servers: LocalServers, queue: str, tmp_path: Path, args: list[str], status: int, said: str
) -> None:
    # The first line is a good body: a bad line further on must stop it too.
    (tmp_path / "bodies.jsonl").write_text('{"eventType": "A", "payload": {}}\n\n{"eventType": \n')
    refused = _local(tmp_path, "send", *(str(tmp_path / arg) if arg.endswith(".jsonl") else arg for arg in args))
    assert refused.returncode == status, refused.stdout + refused.stderr
    assert said in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert _on_the_queue(local_servers, queue) == {}
