"""The running stack's address book (``STATE_FILE``), written by ``make run``, read by ``make send``, ``invoke``,
``dlq`` and ``redrive`` to find the stack; a file whose process is gone is stale and is removed on read."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testkit.processes import alive
from testkit.resources import FunctionSpec, SqsTrigger
from testkit.template import REPO_ROOT

# LOCAL_STACK_DIR moves it, so a second stack (e.g. a test's) never meets the one you run.
STATE_DIR = Path(os.environ.get("LOCAL_STACK_DIR") or REPO_ROOT / ".local-stack")
STATE_FILE = STATE_DIR / "state.json"


@dataclass(frozen=True)
class StackState:
    pid: int
    stack_name: str
    dynamodb_endpoint_url: str
    sqs_endpoint_url: str
    queue_url: str
    dead_letter_queue_url: str
    tables: dict[str, str]
    function: dict[str, Any]
    function_environment: dict[str, str]

    def function_spec(self) -> FunctionSpec:
        fields = dict(self.function)
        triggers = tuple(SqsTrigger(**trigger) for trigger in fields.pop("triggers"))
        return FunctionSpec(**{**fields, "code_dir": Path(fields["code_dir"])}, triggers=triggers)


def write(state: StackState, path: Path = STATE_FILE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(asdict(state), indent=2), encoding="utf-8")
    temporary.replace(path)


def read(path: Path = STATE_FILE) -> StackState | None:
    """The running stack, or ``None`` when none is (a stale file is removed)."""
    try:
        state = StackState(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    if not alive(state.pid):
        path.unlink(missing_ok=True)
        return None
    return state
