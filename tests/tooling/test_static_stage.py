"""`make test`'s first stage on a template with one mistake: it stops there, quickly, with one failure that
says what to fix and where (the static checks run before any server or runtime starts)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from testkit.template import REPO_ROOT, TEMPLATE_PATH

VARIABLE = "          IDEMPOTENCY_TABLE_NAME: !Ref IdempotencyTable\n"
_LIMIT_S = 300


@pytest.mark.long(40)
def test_a_mistyped_table_variable_stops_the_static_stage_with_one_failure_naming_line_and_fix(tmp_path: Path) -> None:
    source = TEMPLATE_PATH.read_text(encoding="utf-8")
    assert source.count(VARIABLE) == 1, "the idempotency table's variable moved in template.yaml: update this test"
    line = source[: source.index(VARIABLE)].count("\n") + 1
    copy = tmp_path / "template.yaml"
    copy.write_text(source.replace(VARIABLE, VARIABLE.replace("IDEMPOTENCY_TABLE_NAME", "IDEMPOTENCY_TABEL_NAME")))

    started = time.monotonic()
    # As make test runs it (the venv taken as built: this very test runs in it).
    done = subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.installed", "static", f"TEMPLATE={copy}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=_LIMIT_S,
        check=False,
    )
    elapsed = time.monotonic() - started

    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-4000:]
    summary = re.findall(r"^.* in [\d.]+s\b.*$", output, re.MULTILINE)[-1]
    assert summary.startswith("1 failed,") and "error" not in summary, output[-4000:]
    said = (
        f"{copy}:{line}: ConsumerFunction sets IDEMPOTENCY_TABEL_NAME, which no code reads: "
        'rename it to "IDEMPOTENCY_TABLE_NAME: !Ref IdempotencyTable"'
    )
    assert said in output, output[-4000:]
    assert elapsed < _LIMIT_S
