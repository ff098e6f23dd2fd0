"""Copies of template.yaml with some values changed, for tests that need another setting."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from testkit.template import load_template

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
