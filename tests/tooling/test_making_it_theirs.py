"""docs/tables.md ("A handler with its own table"), followed to the letter on copies of the project (and the
steps that test_replacing_the_examples.py shares).

With every step the tests a new handler and table can break pass, and the handler is routed
with its table named, beside any handler the user registered already; with one step left out or
mistyped, the test that the page names fails, saying what is missing. The steps' text (the
registration, the table, its variable, its grant; the files, registrations and template lines
that go with each example) is read from the pages themselves.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

from local.replace_examples import register
from testkit import application
from tests.tooling.template_copies import pytest_in, run_in, template_project
from tests.utils import tables_checklist

# What a handler with its own table touches: routing, settings, the function's start, the template's
# tables, environment and grants, and the examples (which build the page's table).
_SUITE = [
    "tests/app/test_handler_registry.py",
    "tests/core/unit/test_app.py",
    "tests/app/test_inventory_reserved.py",
    "tests/deployment/test_tables.py",
    "tests/deployment/test_function.py",
    "tests/deployment/test_iam_matches_code.py",
]
_REGISTRATION, _TABLE, _VARIABLE, _GRANT = range(4)


def _insert(path: Path, anchor: str, text: str, *, after: bool) -> None:
    content = path.read_text()
    assert content.count(anchor) == 1, f"{anchor!r} moved in {path.name}: update docs/tables.md and this test"
    path.write_text(content.replace(anchor, anchor + text if after else text + anchor))


def _follow(project: Path, skip: int | None = None, typo: tuple[str, str] | None = None) -> None:
    """The page's steps on ``project``, but ``skip`` (a step's block), and ``typo`` replaced in the variable."""
    steps = tables_checklist()
    if typo:
        steps[_VARIABLE] = steps[_VARIABLE].replace(*typo)
    shutil.copy(project / "examples" / "inventory_reserved.py", application.handlers_folder(project))
    if skip != _REGISTRATION:
        register(application.registry_file(project), steps[_REGISTRATION])
    template = project / "template.yaml"
    if skip != _TABLE:
        _insert(template, "\nResources:\n", steps[_TABLE] + "\n", after=True)
    if skip != _VARIABLE:
        _insert(template, "          IDEMPOTENCY_TABLE_NAME: !Ref IdempotencyTable\n", steps[_VARIABLE], after=True)
    if skip != _GRANT:
        _insert(template, "              - Sid: ParkPoisonMessages\n", steps[_GRANT], after=False)


def _routed(project: Path) -> dict[str, dict[str, str]]:
    """The copy's registry, built with the tests' settings: each event type and the tables it is given."""
    code = (
        "from consumer.handler import build_handlers; from testkit.application import registered;"
        " import tests.utils as u;"
        " print({t: h.table_names for t, h in build_handlers(registered(), u.settings_for_tests()).items()})"
    )
    done = run_in(project, [sys.executable, "-c", code], timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    routed: dict[str, dict[str, str]] = ast.literal_eval(done.stdout.strip())
    return routed


@pytest.mark.long(25)
def test_a_handler_with_its_own_table_added_as_the_docs_say_passes_and_is_routed(tmp_path: Path) -> None:
    template_project(tmp_path, environments=())
    _follow(tmp_path)

    done = pytest_in(tmp_path, _SUITE, "-x")

    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # The copy's registry routes the new type, with the table the tests name for it.
    assert _routed(tmp_path)["InventoryReserved"] == {"InventoryTable": "inventory"}


@pytest.mark.long(25)
def test_the_documented_steps_keep_a_handler_the_user_registered_already(tmp_path: Path) -> None:
    """A user's handler beside the shipped ones (the refund example, registered as "Writing your own
    handler" says, not yet committed): adding the next one keeps it, and the tests still pass."""
    template_project(tmp_path, environments=())
    shutil.copy(tmp_path / "examples" / "refund_issued.py", application.handlers_folder(tmp_path))
    step = tables_checklist()[_REGISTRATION]
    register(
        application.registry_file(tmp_path),
        step.replace("inventory_reserved", "refund_issued").replace("InventoryReserved", "RefundIssued"),
    )
    before = _routed(tmp_path)
    _follow(tmp_path)

    done = pytest_in(tmp_path, _SUITE, "-x")

    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "RefundIssued" in before
    assert sorted(_routed(tmp_path)) == sorted([*before, "InventoryReserved"])


@pytest.mark.long(15)
@pytest.mark.parametrize(
    ("skip", "typo", "caught_by", "said"),
    [
        (_REGISTRATION, None, "tests/app/test_handler_registry.py", "register each handler file"),
        (_GRANT, None, "tests/deployment/test_iam_matches_code.py", "InventoryTable"),
        (None, ("INVENTORY_", "INVENTRY_"), "tests/deployment/test_function.py", "INVENTORY_TABLE_NAME"),
        (_VARIABLE, None, "tests/deployment/test_function.py", "INVENTORY_TABLE_NAME"),
    ],
    ids=["unregistered-file", "missing-grant", "mistyped-variable", "missing-variable"],
)
def test_each_step_left_out_fails_the_test_the_page_names(
    tmp_path: Path, skip: int | None, typo: tuple[str, str] | None, caught_by: str, said: str
) -> None:
    template_project(tmp_path, environments=())
    _follow(tmp_path, skip=skip, typo=typo)

    done = pytest_in(tmp_path, [caught_by], "-x")

    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert said in done.stdout, done.stdout[-4000:]
