"""Finding the function's Python: pyenv first, then PATH, else one line saying how to get it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from testkit.lambda_venv import LambdaPythonMissing, find_python


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_no_python_312_anywhere_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(LambdaPythonMissing, match=r"no Python 3\.12 found .*pyenv install 3\.12"):
        find_python("3.12")


def test_pyenvs_python_is_preferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = tmp_path / "versions" / "3.12.9"
    python = executable(prefix / "bin" / "python3.12", "#!/bin/sh\n")
    executable(tmp_path / "bin" / "pyenv", f"#!/bin/sh\necho {prefix}\n")
    executable(tmp_path / "bin" / "python3.12", "#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + "/usr/bin:/bin")

    assert find_python("3.12") == python


def test_without_pyenv_the_python_on_path_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    on_path = executable(tmp_path / "bin" / "python3.12", "#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))

    assert find_python("3.12") == on_path
