"""The README's way to add a handler, followed to the letter on a copy of the project.

"Copy examples/refund_issued.py to src/consumer/handlers/ and register it in build_handlers":
after that the project's own tests must still pass, and the new event type must be applied.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# The tests a registered handler can break: routing, the registry check, the example itself.
_SUITE = ["tests/unit/test_batch.py", "tests/unit/test_handler_registry.py", "tests/unit/test_examples.py"]


def _copy_of_the_project(target: Path) -> None:
    """Every file git tracks, as a clone has them (no virtual environments, no caches)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target / name)


def _register_the_example(project: Path) -> None:
    handlers = project / "src" / "consumer" / "handlers"
    shutil.copy(project / "examples" / "refund_issued.py", handlers / "refund_issued.py")
    registry = handlers / "__init__.py"
    text = registry.read_text()
    last_import = "from consumer.handlers.receipt_requested import ReceiptRequestedHandler\n"
    last_handler = "        ReceiptRequestedHandler("
    assert last_import in text and last_handler in text, "build_handlers changed shape: update this test and README"
    text = text.replace(last_import, last_import + "from consumer.handlers.refund_issued import RefundIssuedHandler\n")
    text = text.replace(last_handler, "        RefundIssuedHandler(settings.ledger_table_name),\n" + last_handler)
    registry.write_text(text)


def test_the_example_handler_registered_as_the_readme_says_keeps_the_suite_green(tmp_path: Path) -> None:
    _copy_of_the_project(tmp_path)
    _register_the_example(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *_SUITE],
        cwd=tmp_path,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # The registry test saw the new file registered (not an empty scan of the original tree).
    registered = subprocess.run(
        [
            sys.executable,
            "-c",
            "from consumer.handlers import build_handlers; import tests.utils as u;"
            " print(sorted(build_handlers(u.settings_for_tests())))",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path / 'src'}{os.pathsep}{tmp_path}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "RefundIssued" in registered.stdout
