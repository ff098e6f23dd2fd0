"""`make test`'s first stage on a template with one mistake (a mistyped variable, a line of the core's left out): it
stops there, quickly, with one failure that says what to fix and where (the static checks run before any server or
runtime starts)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

import consumer
from testkit.template import REPO_ROOT, TEMPLATE_PATH
from tests.deployment.core_lines import newest_section
from tests.tooling.template_copies import sqs_event_properties, template_copy

VARIABLE = "          IDEMPOTENCY_TABLE_NAME: !Ref IdempotencyTable\n"
_LIMIT_S = 300


@pytest.mark.long(40)
def test_a_mistyped_table_variable_stops_the_static_stage_with_one_failure_naming_line_and_fix(tmp_path: Path) -> None:
    source = TEMPLATE_PATH.read_text(encoding="utf-8")
    assert source.count(VARIABLE) == 1, "the idempotency table's variable moved in template.yaml: update this test"
    line = source[: source.index(VARIABLE)].count("\n") + 1
    copy = tmp_path / "template.yaml"
    copy.write_text(source.replace(VARIABLE, VARIABLE.replace("IDEMPOTENCY_TABLE_NAME", "IDEMPOTENCY_TABEL_NAME")))

    output = _one_failure(copy)
    said = (
        f"{copy}:{line}: ConsumerFunction sets IDEMPOTENCY_TABEL_NAME, which no code reads: "
        'rename it to "IDEMPOTENCY_TABLE_NAME: !Ref IdempotencyTable"'
    )
    assert said in output, output[-4000:]


@pytest.mark.long(40)
def test_a_template_lagging_its_core_stops_the_static_stage_with_one_failure_naming_the_line_to_merge(
    tmp_path: Path,
) -> None:
    """A line of the core's (core-lines.yaml) left out, as a hand merge after an upgrade leaves it: the event source
    without ReportBatchItemFailures, which the event source's own checks would each fail on."""
    copy = template_copy(tmp_path, lambda document: sqs_event_properties(document).pop("FunctionResponseTypes"))

    output = _one_failure(copy)

    assert "FAILED tests/deployment/test_core_lines.py::test_the_template_carries_every_line_its_core_needs" in output
    said = (
        f"{copy.name} lags its core (consumer {consumer.__version__}): merge these lines of the core's"
        " (tests/deployment/core-lines.yaml has each in its place); CHANGELOG.md says what each is for, in its sections"
        f' from "## {newest_section()}" down to the version you upgraded from:\n'
        "  Resources.ConsumerFunction.Properties.Events.Queue.Properties.FunctionResponseTypes:"
        " [ReportBatchItemFailures]\n"
    )
    assert said in output, output[-4000:]


def _one_failure(template: Path) -> str:
    """``make static`` on ``template``, as make test runs it (the venv taken as built: this very test runs in it): it
    fails, quickly, with one failure and no error; what it printed."""
    started = time.monotonic()
    done = subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed", "static", f"TEMPLATE={template}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=_LIMIT_S,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    summary = re.findall(r"^.* in [\d.]+s\b.*$", output, re.MULTILINE)[-1]
    assert summary.startswith("1 failed,") and "error" not in summary, output[-4000:]
    assert time.monotonic() - started < _LIMIT_S
    return output
