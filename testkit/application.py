"""Where the application lives: the one place the core's tooling names it.

The user's code (their handlers, their registry, the function's entry point) is a package under ``src/`` that the
core never imports. Its proof, chaos, bench and fixture projects reach it only through these names, read when asked
for: a project whose examples are replaced keeps the package and its registry, and nothing of the proof names it.
Nothing here imports beyond the standard library: the benchmark's function reads it inside Lambda's runtime venv.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

PACKAGE = "service"
REGISTRY = f"{PACKAGE}.registry"
# The function's entry module (template.yaml's Handler, less its ``handler``).
ENTRY = f"{PACKAGE}.lambda_function"


def registered() -> tuple[Any, ...]:
    """The registered handler classes (``HANDLERS`` of the registry), imported now."""
    return importlib.import_module(REGISTRY).HANDLERS


def source(project: Path) -> Path:
    """The package's folder in a project: ``src/<package>``."""
    return project / "src" / PACKAGE


def registry_file(project: Path) -> Path:
    return source(project) / "registry.py"


def handlers_folder(project: Path) -> Path:
    return source(project) / "handlers"


def handler_import(module: str, name: str) -> str:
    """The registry's import line of a handler class in ``handlers/<module>.py``."""
    return f"from {PACKAGE}.handlers.{module} import {name}\n"
