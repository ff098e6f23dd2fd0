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
from tests.tooling import ON_THE_CORES_OWN

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


# What make installs the environments from: older than their stamps, a project's linked environments are taken as built.
_INSTALLED_FROM = ("requirements-dev.txt", "src/requirements.in", "package.json", "package-lock.json")


def link_environments(target: Path, environments: bool | Sequence[str]) -> None:
    """The checkout's built environments (all, or those named) linked into ``target``, taken there as built."""
    for name in ENVIRONMENTS if environments is True else environments or ():
        if (REPO_ROOT / name).exists():
            (target / name).symlink_to(REPO_ROOT / name)
    taken_as_built(target)


def taken_as_built(target: Path) -> None:
    """What ``target``'s environments are installed from made older than their stamps: a project's newer requirements
    would have a make target there install into the checkout's linked ones (npm ci empties the checkout's
    node_modules under every test running DynamoDB Local; uv points its venv's path at the project)."""
    for name in _INSTALLED_FROM:
        if (target / name).exists():
            os.utime(target / name, (0, 0))


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


def on_the_cores_own_application(module: str, seconds: int) -> Callable[[Path], None]:
    """The test a checkout runs for the tests of a tooling module that run the registered application (the local
    stack, the runtime emulator, the CLI): those tests, marked ``cores_own_application``, run in ``template_project``
    (every environment linked) and must pass there; tests/conftest.py deselects them in a checkout. What they check
    then holds for the core's application, whichever handlers the user has registered, and a project's own handlers
    never decide the core's proof (make test's generic contract checks those).

    In the module: the mark on those tests (or ``pytestmark`` for all) and
    ``test_on_the_cores_own_application = on_the_cores_own_application(__name__, seconds=...)``.
    """

    @pytest.mark.long(seconds)
    @pytest.mark.timeout(seconds * 4 + 120)
    @pytest.mark.cores_own_application_run
    def test_every_test_here_passes_on_the_cores_own_application(tmp_path: Path) -> None:
        project = template_project(tmp_path / "project")
        path = module.replace(".", "/") + ".py"
        options = ("-p", "no:xdist", "-rfE", "-m", "cores_own_application")
        done = pytest_in(project, [path], *options, timeout=seconds * 4 + 60, environment={ON_THE_CORES_OWN: "1"})
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]

    return test_every_test_here_passes_on_the_cores_own_application
