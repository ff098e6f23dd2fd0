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


# What a checkout has beside its files: the environments the make targets build, shared with a copy as they are.
_ENVIRONMENTS = (".venv", ".venv-sam", "node_modules", ".lambda-runtime")


def project_copy(target: Path, *, environments: bool = True) -> Path:
    """Every file git tracks or would track (a handler not yet committed too) copied to ``target``, as a clone has
    them; with ``environments``, the checkout's built environments linked, so that a make target runs there as here.
    A project a test can follow README on, or plant a mistake in."""
    command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (REPO_ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, target / name)
    for name in _ENVIRONMENTS if environments else ():
        if (REPO_ROOT / name).exists():
            (target / name).symlink_to(REPO_ROOT / name)
    return target
