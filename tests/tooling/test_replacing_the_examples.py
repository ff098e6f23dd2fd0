"""docs/replacing-the-examples.md, followed to the letter on a copy of the project.

A file of its own, so that make proof (which deals whole files to its workers) runs this, its
longest test, beside the other steps' tests rather than after them.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from local.replace_examples import replace_the_examples
from testkit import application
from testkit.template import REPO_ROOT
from tests.tooling.template_copies import pytest_in, run_in, template_project
from tests.tooling.test_making_it_theirs import _follow, _routed

_LINT = (
    ["ruff", "check", "."],
    ["ruff", "format", "--check", "."],
    ["mypy", "--strict", "src"],
    ["mypy", "testkit", "local", "chaos", "bench", "tests"],
)


@pytest.mark.long(150)
# Lint and the unit tests of a whole copy, beside the other workers' tests on two cores: about five minutes, more
# than the suite's bound for one test; its own commands keep their bounds (run_in), so a hang still stops it.
@pytest.mark.timeout(600)
def test_replacing_the_examples_as_the_docs_say_leaves_a_project_that_passes_lint_and_tests(
    tmp_path: Path,
) -> None:
    """Every example removed and the inventory handler added, each as the docs say, on a copy: lint and the
    static and unit tests pass there. The whole suite on a copy (the local stack, chaos) is too slow for
    one test; it is what a clone runs after this."""
    template_project(tmp_path, environments=())
    # The handler added afterwards is the inventory example as it ships: the page removes it with the others.
    handler = (tmp_path / "examples/inventory_reserved.py").read_text()
    replace_the_examples(tmp_path)

    # Every example gone: what is left is the core's, the application's frame and the generic tests.
    assert [path.name for path in (tmp_path / "examples").iterdir()] == ["__init__.py"]
    assert sorted(path.name for path in application.handlers_folder(tmp_path).iterdir()) == ["__init__.py"]
    left = sorted(path.name for path in (tmp_path / "tests/app").iterdir())
    assert left == ["README.md", "__init__.py", "conftest.py", "test_handler_contract.py", "test_handler_registry.py"]
    (tmp_path / "examples/inventory_reserved.py").write_text(handler)
    _follow(tmp_path)
    (tmp_path / "examples/inventory_reserved.py").unlink()

    assert sorted(_routed(tmp_path)) == ["InventoryReserved"]
    template = (tmp_path / "template.yaml").read_text()
    assert [name for name in ("LedgerTable", "ReceiptWebhookUrl", "WebhookSecretArn") if name in template] == []
    # mypy checks its cache against each file's hash: the checkout's (make lint runs first) spares what is unchanged.
    if (REPO_ROOT / ".mypy_cache").is_dir():
        shutil.copytree(REPO_ROOT / ".mypy_cache", tmp_path / ".mypy_cache")
    for command in _LINT:
        done = run_in(tmp_path, [str(Path(sys.executable).parent / command[0]), *command[1:]])
        assert done.returncode == 0, (command, done.stdout[-4000:] + done.stderr[-2000:])
    # The static and unit tests in one process, beside the other workers: over 240 s once here (run 16).
    # What needs no server (the copy has no DynamoDB Local): the static checks, the application's, the core's unit.
    tests = ["tests/deployment", "tests/app", "tests/core/unit"]
    # test_sam_event_shape.py reads SAM CLI's own event, and the copy installs no SAM CLI.
    skip = ["--ignore=tests/deployment/test_sam_event_shape.py"]
    done = pytest_in(tmp_path, tests, "-p", "no:xdist", "-m", "not integration", *skip, timeout=480)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
