"""The documentation in two layers: a short README, and docs/ as pages that `make docs` builds strictly, in make test's
static stage. A link to a page or an anchor that is not there fails the build (a planted one shows it), and README's
own links, which the build does not read, are checked here against the pages."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify  # type: ignore[import-untyped]

from testkit.template import REPO_ROOT

README = REPO_ROOT / "README.md"
README_MAX_LINES = 300
# A relative link of Markdown: [label](target), the target without a scheme.
_LINK = re.compile(r"\]\((?![a-z]+:)([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """The ids MkDocs gives the page's headings (python-markdown's toc slugify, as mkdocs.yml leaves it)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    return {slugify(heading, "-") for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def _build(config: Path) -> subprocess.CompletedProcess[str]:
    """The build `make docs` runs (its recipe is checked against this below)."""
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _copy_of_the_docs(target: Path) -> Path:
    shutil.copytree(REPO_ROOT / "docs", target / "docs")
    shutil.copy(REPO_ROOT / "mkdocs.yml", target / "mkdocs.yml")
    return target / "mkdocs.yml"


def test_the_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail to a page of docs/"


def test_every_link_of_the_readme_reaches_its_file_and_anchor() -> None:
    broken = []
    for target in _LINK.findall(README.read_text(encoding="utf-8")):
        path, _, anchor = target.partition("#")
        found = REPO_ROOT / path
        if not found.exists() or (anchor and anchor not in _anchors(found)):
            broken.append(target)
    assert broken == []
    # The check itself: a page that is not there, and an anchor that is not on a page that is.
    assert not (REPO_ROOT / "docs/no-such-page.md").exists()
    assert "no-such-step" not in _anchors(REPO_ROOT / "docs" / "tables.md")
    assert "conflicts-locally" in _anchors(REPO_ROOT / "docs" / "local-stack.md")


def test_make_docs_builds_strictly_in_the_static_stage() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    # --quiet would drop the warnings before --strict counts them: the build would pass whatever is broken.
    assert re.search(r"^docs: .*\n\t.*mkdocs build --strict$", makefile, re.MULTILINE)
    assert re.search(r"^\t@\$\(MAKE\) .* lint validate static docs lambda-venv$", makefile, re.MULTILINE)


def test_a_link_to_an_anchor_no_page_has_fails_the_build(tmp_path: Path) -> None:
    config = _copy_of_the_docs(tmp_path)
    built = _build(config)
    assert built.returncode == 0, built.stderr
    with (tmp_path / "docs" / "guards.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [the missing step](tables.md#no-such-step).\n")

    built = _build(config)

    assert built.returncode == 1
    assert "'guards.md' contains a link 'tables.md#no-such-step'" in built.stderr
    assert "does not contain an anchor '#no-such-step'" in built.stderr


def test_a_link_to_a_page_that_is_not_there_fails_the_build(tmp_path: Path) -> None:
    config = _copy_of_the_docs(tmp_path)
    with (tmp_path / "docs" / "settings.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [the old README section](../README.md#settings).\n")

    built = _build(config)

    assert built.returncode == 1
    assert "'settings.md' contains a link '../README.md#settings'" in built.stderr
