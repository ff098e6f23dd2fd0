"""The seam, as `make lint` checks it: the core never imports the application, the examples or the tooling."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from testkit.template import REPO_ROOT

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
    planted.write_text(planted.read_text() + "\nimport service.registry  # planted\n")

    code, output = _lint_imports(tmp_path)

    assert code == 1
    assert "Broken contracts" in output and _CONTRACT in output
    assert "consumer.batch -> service.registry" in output


def test_the_contracts_hold_when_lint_imports_is_run_bare_in_the_checkout() -> None:
    # As a user or an editor runs it: no PYTHONPATH, the venv's own path alone (make venv puts src/ on it).
    command = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)

    assert done.returncode == 0, _ANSI.sub("", done.stdout + done.stderr)[-2000:]
    contracts = len(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"])
    assert f"Contracts: {contracts} kept, 0 broken." in _ANSI.sub("", done.stdout)
