"""README's "A handler with its own table", followed to the letter on copies of the project.

With every step the tests a new handler and table can break pass, and the handler is routed
with its table named; with one step left out or mistyped, the test that README names fails,
saying what is missing. The steps' text (the registration, the table, its variable, its
grant) is read from README itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.utils import readme_checklist

REPO_ROOT = Path(__file__).resolve().parents[2]
# What a handler with its own table touches: routing, settings, the function's start, the template's
# tables, environment and grants, and the examples (which build the README's table).
_SUITE = [
    "tests/unit/test_handler_registry.py",
    "tests/unit/test_app.py",
    "tests/examples/test_inventory_reserved.py",
    "tests/infrastructure/test_tables.py",
    "tests/infrastructure/test_function.py",
    "tests/infrastructure/test_iam_matches_code.py",
]
_REGISTRATION, _TABLE, _VARIABLE, _GRANT = range(4)


def _copy_of_the_project(target: Path) -> None:
    """Every file git tracks, as a clone has them (no virtual environments, no caches)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, target / name)


def _insert(path: Path, anchor: str, text: str, *, after: bool) -> None:
    content = path.read_text()
    assert content.count(anchor) == 1, f"{anchor!r} moved in {path.name}: update README's checklist and this test"
    path.write_text(content.replace(anchor, anchor + text if after else text + anchor))


def _follow(project: Path, skip: int | None = None, typo: tuple[str, str] | None = None) -> None:
    """README's steps on ``project``, but ``skip`` (a step's block), and ``typo`` replaced in the variable."""
    steps = readme_checklist()
    if typo:
        steps[_VARIABLE] = steps[_VARIABLE].replace(*typo)
    handlers = project / "src" / "consumer" / "handlers"
    shutil.copy(project / "examples" / "inventory_reserved.py", handlers / "inventory_reserved.py")
    if skip != _REGISTRATION:
        # The import, then the whole HANDLERS statement that replaces the registry's.
        import_line, handlers_statement = steps[_REGISTRATION].strip().split("\n", 1)
        registry = handlers / "__init__.py"
        lines = registry.read_text().splitlines(keepends=True)
        (start,) = [i for i, line in enumerate(lines) if line.startswith("HANDLERS:")]
        end = start if not lines[start].rstrip().endswith("(") else lines.index(")\n", start)
        lines[start : end + 1] = [handlers_statement.strip() + "\n"]
        last_import = max(i for i, line in enumerate(lines) if line.startswith("from consumer.handlers."))
        lines.insert(last_import + 1, import_line + "\n")
        registry.write_text("".join(lines))
    template = project / "template.yaml"
    if skip != _TABLE:
        _insert(template, "\nResources:\n", steps[_TABLE] + "\n", after=True)
    if skip != _VARIABLE:
        _insert(template, "          LEDGER_TABLE_NAME: !Ref LedgerTable\n", steps[_VARIABLE], after=True)
    if skip != _GRANT:
        _insert(template, "              - Sid: ApplyLedgerWrites\n", steps[_GRANT], after=False)


def _pytest(project: Path, tests: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-x", *tests],
        cwd=project,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_a_handler_with_its_own_table_added_as_the_readme_says_passes_and_is_routed(tmp_path: Path) -> None:
    _copy_of_the_project(tmp_path)
    _follow(tmp_path)

    done = _pytest(tmp_path, _SUITE)

    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # The copy's registry routes the new type, with the table the tests name for it.
    routed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from consumer.handlers import build_handlers; import tests.utils as u;"
            " print(build_handlers(u.settings_for_tests())['InventoryReserved'].table_names)",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": f"{tmp_path / 'src'}{os.pathsep}{tmp_path}"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert routed.stdout.strip() == "{'InventoryTable': 'inventory'}"


@pytest.mark.parametrize(
    ("skip", "typo", "caught_by", "said"),
    [
        (_REGISTRATION, None, "tests/unit/test_handler_registry.py", "register each handler file"),
        (_GRANT, None, "tests/infrastructure/test_iam_matches_code.py", "InventoryTable"),
        (None, ("INVENTORY_", "INVENTRY_"), "tests/infrastructure/test_function.py", "INVENTORY_TABLE_NAME"),
        (_VARIABLE, None, "tests/infrastructure/test_function.py", "INVENTORY_TABLE_NAME"),
    ],
    ids=["unregistered-file", "missing-grant", "mistyped-variable", "missing-variable"],
)
def test_each_step_left_out_fails_the_test_the_readme_names(
    tmp_path: Path, skip: int | None, typo: tuple[str, str] | None, caught_by: str, said: str
) -> None:
    _copy_of_the_project(tmp_path)
    _follow(tmp_path, skip=skip, typo=typo)

    done = _pytest(tmp_path, [caught_by])

    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert said in done.stdout, done.stdout[-4000:]
