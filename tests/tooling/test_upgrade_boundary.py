"""What an upgrade replaces and what it never touches: docs/upgrading.md against the paths the handler pages' steps
have you edit."""

from __future__ import annotations

import re
from pathlib import Path

from testkit import application
from testkit.template import REPO_ROOT
from tests.tooling.test_ownership import manifest

_PATH = re.compile(r"`([\w./-]+(?:/|\.py|\.yaml|\.json|\.toml))`")


# The pages that have you write and wire a handler.
HANDLER_PAGES = ("writing-a-handler", "guards", "settings", "tables", "contract")


def _page(name: str) -> str:
    return (REPO_ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8")


def _columns() -> tuple[list[str], list[str]]:
    """ownership.toml's columns (docs/upgrading.md's table): the paths replaced whole (ours), and the others."""
    columns = manifest()
    return columns["ours"], columns["yours"] + columns["merged"]


def edited_in_core(steps: str, ours: list[str]) -> list[str]:
    """Each path a numbered step names that lies in a folder or file an upgrade replaces."""
    named = [path for line in steps.splitlines() if re.match(r"\*\*\d+\.\*\*", line) for path in _PATH.findall(line)]
    return [path for path in named if any(path == mine or path.startswith(mine.rstrip("/") + "/") for mine in ours)]


def test_no_step_of_writing_your_own_handler_edits_a_file_an_upgrade_replaces() -> None:
    ours, yours = _columns()
    mine = f"{application.source(Path()).as_posix()}/"
    assert "src/consumer/" in ours and mine in yours, "docs/upgrading.md's table changed shape"
    steps = "\n".join(map(_page, HANDLER_PAGES))
    assert edited_in_core(steps, [mine]), "no numbered step names a file of the handler's: the pages moved"

    assert edited_in_core(steps, ours) == []
    # The check itself: a step that had you edit the core would be named.
    assert edited_in_core("**1.** Register it in `src/consumer/app.py`.", ours) == ["src/consumer/app.py"]
