"""Every file in events/ has the shape SAM CLI's own SQS sample event has: same keys, same value types."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from local.event_files import load_event
from testkit.template import REPO_ROOT

EVENTS = REPO_ROOT / "events"
SAM = REPO_ROOT / ".venv-sam" / "bin" / "sam"


@pytest.fixture(scope="module")
def sam_record() -> dict[str, Any]:
    if not SAM.exists():
        pytest.fail(f"SAM CLI is missing at {SAM}: run `make validate` (it installs .venv-sam)")
    answer = subprocess.run(
        [str(SAM), "local", "generate-event", "sqs", "receive-message"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**os.environ, "SAM_CLI_TELEMETRY": "0"},
    )
    (record,) = json.loads(answer.stdout)["Records"]
    return record


def _types(document: dict[str, Any]) -> dict[str, type]:
    return {key: type(value) for key, value in document.items()}


@pytest.mark.parametrize("path", sorted(EVENTS.glob("*.json")), ids=lambda path: path.name)
def test_event_file_has_sams_sqs_shape(path: Path, sam_record: dict[str, Any]) -> None:
    records = load_event(path)["Records"]

    assert records
    for record in records:
        # Our records may add what SQS adds (md5OfMessageAttributes); none may lack or retype SAM's keys.
        assert set(sam_record) <= set(record), f"{path.name} lacks {set(sam_record) - set(record)}"
        assert {key: type(record[key]) for key in sam_record} == _types(sam_record)
        for name, value in sam_record["attributes"].items():
            assert isinstance(record["attributes"].get(name), type(value)), f"{path.name}: attributes.{name}"
