"""The function's own interpreter: a Python 3.12 venv holding exactly what Lambda gives the function.

That is the deployment artifact (``src/requirements.txt``), boto3 and botocore as the
Lambda runtime provides them (pinned as in ``requirements-dev.txt``, so the function and
the tests agree on the SDK), and the runtime interface client ``awslambdaric``. The venv
is cached under ``.lambda-runtime/`` by a digest of those requirements and the
interpreter's version, so a change to either builds a new one and an unchanged one costs
nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from local.state import REPO_ROOT

LAMBDA_PYTHON_VERSION = "3.12"
# The runtime interface client of Lambda's managed Python runtime, as a wheel.
AWSLAMBDARIC = "awslambdaric==4.2.2"
CACHE_DIR = REPO_ROOT / ".lambda-runtime"
ARTIFACT_REQUIREMENTS = REPO_ROOT / "src" / "requirements.txt"
DEV_REQUIREMENTS = REPO_ROOT / "requirements-dev.txt"
_RUNTIME_PROVIDED = ("boto3", "botocore")


class LambdaPythonMissing(RuntimeError):
    """No interpreter of the function's runtime version on this machine."""


class LambdaVenvError(RuntimeError):
    """The function's venv could not be built."""


def find_python(version: str = LAMBDA_PYTHON_VERSION) -> Path:
    """pyenv's ``version`` if pyenv has it, else ``python<version>`` on PATH."""
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        answer = subprocess.run([pyenv, "prefix", version], capture_output=True, text=True, check=False)
        candidate = Path(answer.stdout.strip().splitlines()[0]) / "bin" / f"python{version}" if answer.stdout else None
        if answer.returncode == 0 and candidate is not None and candidate.exists():
            return candidate
    on_path = shutil.which(f"python{version}")
    if on_path is not None:
        return Path(on_path)
    raise LambdaPythonMissing(
        f"no Python {version} found (the function's runtime is python{version}): "
        f"install one with `pyenv install {version}`, or put python{version} on PATH"
    )


def _pinned(requirements: Path, names: tuple[str, ...]) -> list[str]:
    """The lines of ``requirements`` that pin one of ``names``."""
    lines = [line.split("#", 1)[0].strip() for line in requirements.read_text(encoding="utf-8").splitlines()]
    found = [line for line in lines if line.split("==", 1)[0].strip().lower() in names]
    missing = set(names) - {line.split("==", 1)[0].strip().lower() for line in found}
    if missing:
        raise LambdaVenvError(f"{requirements} pins no {', '.join(sorted(missing))}")
    return found


def requirements() -> list[str]:
    """Everything the function's venv installs, one requirement a line."""
    artifact = [
        line.split("#", 1)[0].strip()
        for line in ARTIFACT_REQUIREMENTS.read_text(encoding="utf-8").splitlines()
        if line.split("#", 1)[0].strip()
    ]
    return [*artifact, *_pinned(DEV_REQUIREMENTS, _RUNTIME_PROVIDED), AWSLAMBDARIC]


def _interpreter_version(python: Path) -> str:
    answer = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=False
    )
    if answer.returncode != 0:
        raise LambdaPythonMissing(f"{python} does not run: {answer.stderr.strip() or answer.returncode}")
    return answer.stdout.strip()


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    # Two processes (make run and a test run) may build at once: one builds, the other waits.
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def venv_python(cache_dir: Path = CACHE_DIR, python: Path | None = None) -> Path:
    """The venv's interpreter, building the venv first when its requirements changed."""
    python = python or find_python()
    wanted = requirements()
    digest = hashlib.sha256("\n".join([_interpreter_version(python), *wanted]).encode()).hexdigest()[:12]
    venv = cache_dir / f"venv-{digest}"
    interpreter = venv / "bin" / "python"
    with _exclusive(cache_dir / ".lock"):
        if (venv / ".complete").exists():
            return interpreter
        _build(python, venv, wanted)
        for stale in cache_dir.glob("venv-*"):
            if stale != venv:
                shutil.rmtree(stale, ignore_errors=True)
    return interpreter


def _build(python: Path, venv: Path, wanted: list[str]) -> None:
    print(f"building the function's Python venv in {venv} ({len(wanted)} requirements)...", file=sys.stderr)
    shutil.rmtree(venv, ignore_errors=True)
    steps = [
        [str(python), "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *wanted],
    ]
    for step in steps:
        answer = subprocess.run(step, capture_output=True, text=True, check=False)
        if answer.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            last = (answer.stderr.strip().splitlines() or [f"exit code {answer.returncode}"])[-1]
            raise LambdaVenvError(f"building the function's venv failed at `{' '.join(step[:4])} ...`: {last}")
    (venv / ".complete").write_text("\n".join(wanted) + "\n", encoding="utf-8")


def main() -> int:
    """``python -m local.lambda_venv``: build (or find) the venv and print its interpreter."""
    try:
        print(venv_python())
    except (LambdaPythonMissing, LambdaVenvError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
