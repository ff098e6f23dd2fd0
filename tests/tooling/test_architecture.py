"""The seam, as `make lint` checks it: the core never imports the application, the examples or the tooling. And the
shipped examples' tests need nothing of the core's own rigs: the test kit has what a handler's tests need."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from testkit import application
from testkit.template import REPO_ROOT
from tests.tooling.template_copies import template_project

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CONTRACT = "The core never imports the application, the examples or the tooling"


def _lint_imports(project: Path) -> tuple[int, str]:
    command = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    paths = {"PYTHONPATH": f"{project / 'src'}{os.pathsep}{project}"}
    env = {**os.environ, **paths}
    done = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, check=False)
    return done.returncode, _ANSI.sub("", done.stdout + done.stderr)


def test_the_core_importing_the_application_fails_lint_naming_the_contract_and_the_import(tmp_path: Path) -> None:
    for folder in ("src", "examples", "tests", "testkit", "local", "bench", "chaos"):
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path)
    assert _lint_imports(tmp_path)[0] == 0, "the project's own tree must keep the contract"
    planted = tmp_path / "src" / "consumer" / "batch.py"
    planted.write_text(planted.read_text() + f"\nimport {application.REGISTRY}  # planted\n")

    code, output = _lint_imports(tmp_path)

    assert code == 1
    assert "Broken contracts" in output and _CONTRACT in output
    assert f"consumer.batch -> {application.REGISTRY}" in output


def test_the_contracts_hold_when_lint_imports_is_run_bare_in_the_checkout() -> None:
    # As a user or an editor runs it: no PYTHONPATH, the venv's own path alone (make venv puts src/ on it).
    command = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)

    assert done.returncode == 0, _ANSI.sub("", done.stdout + done.stderr)[-2000:]
    contracts = len(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"])
    assert f"Contracts: {contracts} kept, 0 broken." in _ANSI.sub("", done.stdout)


def _lock_rig_imports(folder: Path) -> list[str]:
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            found += [f"{path.name}:{node.lineno} imports {name}" for name in names if name == "tests.lock_rig"]
    return found


def test_the_shipped_handlers_tests_use_the_test_kit_and_never_the_cores_lock_rig(tmp_path: Path) -> None:
    # Read in the core's own application: a project's own tests may use what they like, an upgrade never forbids it.
    project = template_project(tmp_path / "project", environments=False)
    assert sorted((project / "tests/app").glob("test_*.py")), "the core's application ships handler tests"
    assert _lock_rig_imports(project / "tests/app") == []

    planted = project / "tests/app/test_planted.py"
    planted.write_text("from tests.lock_rig import something\n")

    assert _lock_rig_imports(project / "tests/app") == ["test_planted.py:1 imports tests.lock_rig"]
