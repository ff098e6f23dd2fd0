"""What an upgrade replaces and what it never touches: README's "Upgrading the core" against the paths its handler
steps have you edit."""

from __future__ import annotations

import re

from testkit.template import REPO_ROOT

_PATH = re.compile(r"`([\w./-]+(?:/|\.py|\.yaml|\.json|\.toml))`")


def _readme_section(heading: str) -> str:
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index(f"\n{heading}\n") :]
    end = section.find("\n## ", 1)
    return section if end < 0 else section[:end]


def _columns() -> tuple[list[str], list[str]]:
    """README's upgrade table: the paths replaced whole (ours), and those never touched (yours)."""
    (row,) = [line for line in _readme_section("## Upgrading the core").splitlines() if line.startswith("| `")]
    ours, yours = row.strip("|").split(" | ")
    return _PATH.findall(ours), _PATH.findall(yours)


def edited_in_core(steps: str, ours: list[str]) -> list[str]:
    """Each path a numbered step names that lies in a folder or file an upgrade replaces."""
    named = [path for line in steps.splitlines() if re.match(r"\*\*\d+\.\*\*", line) for path in _PATH.findall(line)]
    return [path for path in named if any(path == mine or path.startswith(mine.rstrip("/") + "/") for mine in ours)]


def test_no_step_of_writing_your_own_handler_edits_a_file_an_upgrade_replaces() -> None:
    ours, yours = _columns()
    assert "src/consumer/" in ours and "src/service/" in yours, "README's upgrade table changed shape"
    steps = _readme_section("## Writing your own handler")

    assert edited_in_core(steps, ours) == []
    # The check itself: a step that had you edit the core would be named.
    assert edited_in_core("**1.** Register it in `src/consumer/app.py`.", ours) == ["src/consumer/app.py"]
