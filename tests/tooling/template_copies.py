"""Copies of template.yaml with some values changed, for tests that need another setting."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from testkit.template import REPO_ROOT, load_template

Document = dict[str, Any]


def function_properties(document: Document) -> Document:
    return document["Resources"]["ConsumerFunction"]["Properties"]


def queue_properties(document: Document) -> Document:
    return document["Resources"]["ConsumerQueue"]["Properties"]


def sqs_event_properties(document: Document) -> Document:
    return function_properties(document)["Events"]["Queue"]["Properties"]


def template_copy(directory: Path, edit: Callable[[Document], None]) -> Path:
    """The real template, edited, written to ``directory`` (intrinsics in their long form)."""
    document = load_template()
    edit(document)
    path = directory / f"template-{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def probe_function(directory: Path, source: str) -> tuple[str, Path]:
    """A handler module of its own (a unique name, so module caches never mix) and its code folder."""
    module = f"probe_{uuid.uuid4().hex[:12]}"
    code_dir = directory / "probe_src"
    code_dir.mkdir(exist_ok=True)
    (code_dir / f"{module}.py").write_text(source, encoding="utf-8")
    return module, code_dir


# What a checkout has beside its files: the environments the make targets build, shared with the copy as they are.
_ENVIRONMENTS = (".venv", ".venv-sam", "node_modules", ".lambda-runtime")


def project_copy(directory: Path) -> Path:
    """This checkout's files (tracked, and new ones not ignored) copied to ``directory``/project, its built
    environments linked: a project a test can plant a mistake in and run a make target on, as a user would."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    root = directory / "project"
    for name in filter(None, listed):
        if (REPO_ROOT / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, root / name)
    for name in _ENVIRONMENTS:
        if (REPO_ROOT / name).exists():
            (root / name).symlink_to(REPO_ROOT / name)
    return root
