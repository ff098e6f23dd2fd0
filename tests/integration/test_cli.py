"""The commands as the README gives them: run, send, dlq, redrive, invoke; nothing left running after."""

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

from testkit.processes import alive

REPO_ROOT = Path(__file__).resolve().parents[2]
# As the Makefile runs the commands: the local stack's message builders use the consumer's names.
_COMMAND_PATH = {"PYTHONPATH": str(REPO_ROOT / "src")}
pytestmark = pytest.mark.integration


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

        def dead_lettered() -> int:
            listed = _local(tmp_path, "dlq")
            assert listed.returncode == 0, listed.stderr
            return int(listed.stdout.split()[0])

        _wait_for(lambda: dead_lettered() == 3, 60, "three dead letters")
        listing = _local(tmp_path, "dlq").stdout
        assert {"ErrorType: InvalidJson", "ErrorType: SchemaViolation", "ErrorType: UnknownEventType"} <= {
            line.strip() for line in listing.splitlines()
        }
        # Each listed under the id it was sent with (the consumer's logs name it), its DLQ copy's id beside it.
        originals = [line.split()[1] for line in listing.splitlines() if "(in the DLQ as " in line]
        copies = [line.split()[-1].rstrip(")") for line in listing.splitlines() if "(in the DLQ as " in line]
        assert len(originals) == 3 and not set(originals) & set(copies), listing

        moved = _local(tmp_path, "redrive")
        assert moved.returncode == 0, moved.stderr
        assert moved.stdout.startswith("moved 3 ")
        # Still poison: the pollers dead-letter them again.
        _wait_for(lambda: dead_lettered() == 3, 60, "the redriven poison to come back")

        assert state["queue_url"].startswith(state["sqs_endpoint_url"])
    finally:
        run.send_signal(signal.SIGINT)
        output, _ = run.communicate(timeout=60)

    assert run.returncode == 0, output
    assert "make send" in output
    assert "aws sqs send-message --endpoint-url" in output
    assert "batch of" in output
    assert not state_file.exists()
    assert not any(alive(pid) for pid in servers)


def test_send_without_a_running_stack_says_how_to_start_one(tmp_path: Path) -> None:
    answer = _local(tmp_path, "send", "--count", "1")
    assert answer.returncode != 0
    assert "make run" in answer.stderr


def test_invoke_without_a_running_stack_starts_one_and_prints_the_response(tmp_path: Path) -> None:
    answer = _local(tmp_path, "invoke", "events/poison-schema-violation.json")
    assert answer.returncode == 0, answer.stderr
    response = json.loads(answer.stdout[answer.stdout.rindex('{\n  "batchItemFailures"') :])
    assert response == {"batchItemFailures": []}
    assert "dead-lettered: SchemaViolation" in answer.stderr


def test_demo_passes_its_checks_on_a_small_workload(tmp_path: Path) -> None:
    answer = _local(tmp_path, "demo", "--payments", "40", "--receipts", "4", "--pollers", "2", timeout_s=240)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    assert "all checks passed" in answer.stdout
    assert "FAIL" not in answer.stdout
    assert "dead-lettered          9:" in answer.stdout


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
