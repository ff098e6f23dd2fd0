"""Copies of template.yaml with some values changed, for tests that need another setting."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from local.upgrade import render
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
ENVIRONMENTS = (".venv", ".venv-sam", "node_modules", ".lambda-runtime")


def link_environments(target: Path, environments: bool | Sequence[str]) -> None:
    for name in ENVIRONMENTS if environments is True else environments or ():
        if (REPO_ROOT / name).exists():
            (target / name).symlink_to(REPO_ROOT / name)


@functools.cache
def _pristine() -> Path:
    """One render of the template per process (copier takes seconds; a copy of its files, a fraction of one)."""
    directory = Path(tempfile.mkdtemp(prefix="template-project-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return render(REPO_ROOT, directory / "project")


def template_project(target: Path, *, environments: bool | Sequence[str] = True) -> Path:
    """The core's own application: a project made by copier from the template this checkout records (its source at
    its version; in the template's own repository, HEAD with its uncommitted changes), with the examples, whatever
    this project replaced them with; the checkout's built environments linked (all, or those named). What a test of
    the core follows the docs on, or plants a mistake in, so that the user's application never decides it."""
    shutil.copytree(_pristine(), target, symlinks=True, dirs_exist_ok=True)
    link_environments(target, environments)
    return target


def run_in(
    project: Path, command: list[str], timeout: int = 240, environment: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``command`` in ``project``, its code first on the path (the checkout's venv puts the checkout's there too)."""
    return subprocess.run(
        command,
        cwd=project,
        env={
            **os.environ,
            **(environment or {}),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": f"{project / 'src'}{os.pathsep}{project}",
        },
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def pytest_in(
    project: Path, tests: list[str], *options: str, timeout: int = 240, environment: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *options, *tests]
    return run_in(project, command, timeout=timeout, environment=environment)


# Set for a test run again in the core's own project, where it goes on as written.
_ON_THE_CORES_OWN = "ON_THE_CORES_OWN_APPLICATION"


def on_the_cores_own_application(request: pytest.FixtureRequest, tmp_path: Path) -> bool:
    """For a test of the tooling that runs the registered application on the local stack: in a checkout, the test is
    run again in ``template_project`` (every environment linked) and must pass there, and this returns False; there,
    it returns True and the test goes on. What it checks then holds for the core's application, whichever handlers
    the user has registered."""
    if os.environ.get(_ON_THE_CORES_OWN):
        return True
    project = template_project(tmp_path)
    done = pytest_in(
        project, [request.node.nodeid], "-p", "no:xdist", timeout=500, environment={_ON_THE_CORES_OWN: "1"}
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return False
