"""The function's own interpreter: a Python 3.13 venv holding exactly what Lambda gives the function.

That is the deployment artifact (``src/requirements.txt``), boto3 and botocore as Lambda's runtime provides them (pinned
as in ``requirements-dev.txt``, so the function and the tests agree on the SDK), and the runtime interface client
``awslambdaric``. It is cached under ``.lambda-runtime/`` by a digest of those and of the interpreter's version.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from testkit.template import REPO_ROOT

LAMBDA_PYTHON_VERSION = "3.13"
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
    if (pyenv := shutil.which("pyenv")) is not None:
        answer = subprocess.run([pyenv, "prefix", version], capture_output=True, text=True, check=False)
        candidate = Path(answer.stdout.strip().splitlines()[0]) / "bin" / f"python{version}" if answer.stdout else None
        if answer.returncode == 0 and candidate is not None and candidate.exists():
            return candidate
    if (on_path := shutil.which(f"python{version}")) is not None:
        return Path(on_path)
    raise LambdaPythonMissing(
        f"no Python {version} found (the function's runtime is python{version}): "
        f"install one with `pyenv install {version}`, or put python{version} on PATH"
    )


def requirements() -> list[str]:
    """What the venv installs beside the artifact's hash-locked requirements: Lambda's boto3 and runtime client."""
    lines = (line.split("#", 1)[0].strip() for line in DEV_REQUIREMENTS.read_text(encoding="utf-8").splitlines())
    pinned = {line.split("==", 1)[0].strip().lower(): line for line in lines if line}
    if missing := [name for name in _RUNTIME_PROVIDED if name not in pinned]:
        raise LambdaVenvError(f"{DEV_REQUIREMENTS} pins no {', '.join(missing)}")
    return [*(pinned[name] for name in _RUNTIME_PROVIDED), AWSLAMBDARIC]


def _interpreter_version(python: Path) -> str:
    command = [str(python), "-c", "import sys; print(sys.version)"]
    answer = subprocess.run(command, capture_output=True, text=True, check=False)
    if answer.returncode != 0:
        raise LambdaPythonMissing(f"{python} does not run: {answer.stderr.strip() or answer.returncode}")
    return answer.stdout.strip()


def venv_python(version: str = LAMBDA_PYTHON_VERSION) -> Path:
    """The venv's interpreter (on Python ``version``), building the venv first when its requirements changed."""
    python = find_python(version)
    wanted = requirements()
    locked = ARTIFACT_REQUIREMENTS.read_text(encoding="utf-8")
    digest = hashlib.sha256("\n".join([_interpreter_version(python), locked, *wanted]).encode()).hexdigest()[:12]
    venv = CACHE_DIR / f"venv-{version}-{digest}"
    interpreter = venv / "bin" / "python"
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # Two processes (make run and a test run) may build at once: one builds, the other waits.
    with (CACHE_DIR / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (venv / ".complete").exists():
            return interpreter
        _build(python, venv, wanted)
        for stale in CACHE_DIR.glob(f"venv-{version}-*"):
            if stale != venv:
                shutil.rmtree(stale, ignore_errors=True)
    return interpreter


def _build(python: Path, venv: Path, wanted: list[str]) -> None:
    print(f"building the function's Python venv in {venv} ({len(wanted)} requirements)...", file=sys.stderr)
    shutil.rmtree(venv, ignore_errors=True)
    # uv (beside this interpreter, from `make venv`), compiling as every venv here is (see the Makefile).
    uv = [str(Path(sys.executable).with_name("uv")), "pip", "install", "--quiet", "--compile-bytecode"]
    uv += ["--python", str(venv / "bin" / "python")]
    steps = [
        [str(python), "-m", "venv", "--without-pip", str(venv)],
        # The artifact's packages as the build installs them: every file checked against the lock's hashes.
        [*uv, "--require-hashes", "-r", str(ARTIFACT_REQUIREMENTS)],
        [*uv, *wanted],
    ]
    for step in steps:
        answer = subprocess.run(step, capture_output=True, text=True, check=False)
        if answer.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            last = (answer.stderr.strip().splitlines() or [f"exit code {answer.returncode}"])[-1]
            raise LambdaVenvError(f"building the function's venv failed at `{' '.join(step[:4])} ...`: {last}")
    (venv / ".complete").write_text("\n".join(wanted) + "\n", encoding="utf-8")


def main() -> int:
    """``python -m testkit.lambda_venv``: build (or find) the venv and print its interpreter."""
    try:
        print(venv_python())
    except (LambdaPythonMissing, LambdaVenvError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
