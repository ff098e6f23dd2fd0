"""docs/tables.md's "A table that already exists", followed to the letter on copies of the project: the inventory
example's table given by a parameter naming an existing table, its keys under the template's LocalTables, its output
and its dashboard lines.

With every step, the static checks pass, the stack outputs the table's name and charts it, the handler's own tests and
the generic contract run on the table the local stack makes from those keys; with a step left out or written as for a
table of the stack's, the static stage fails, the check the page names saying what to write.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from local.replace_examples import register
from testkit import application
from testkit.template import Template, load_template
from tests.tooling.template_copies import pytest_in, template_project
from tests.tooling.test_making_it_theirs import _insert
from tests.utils import page_blocks, tables_checklist

_PARAMETER, _KEYS, _VARIABLE, _GRANT, _OUTPUT, _DASHBOARD = range(6)
# The checks make test's static stage runs (tests/deployment but those on the local stack), and the registry's.
_STATIC = ["tests/deployment", "tests/app/test_handler_registry.py"]
_ON_THE_STACK = ["-rfE", "--ignore=tests/deployment/test_events.py", "--ignore=tests/deployment/test_template.py"]


def _follow(project: Path, skip: int | None = None, replace: tuple[int, str, str] | None = None) -> None:
    """The page's steps: the handler copied and registered as "A handler with its own table" says, then this section's
    blocks, but ``skip`` (a block's index) and with ``replace`` (index, old, new) applied to one block."""
    steps = page_blocks("tables.md", "## A table that already exists")
    assert len(steps) == 6, "docs/tables.md's existing-table steps changed shape: update this test"
    if replace:
        index, old, new = replace
        steps[index] = steps[index].replace(old, new)
    shutil.copy(project / "examples" / "inventory_reserved.py", application.handlers_folder(project))
    register(application.registry_file(project), tables_checklist()[0])
    places = [PARAMETERS, METADATA, VARIABLES, ("              - Sid: ParkPoisonMessages\n", False), OUTPUTS, DASHBOARD]
    into_template(project / "template.yaml", steps, places, skip)


# Where the pages' blocks go in template.yaml: (the line they go by, after it or before it).
PARAMETERS = ("\nParameters:\n", True)
METADATA = ("\nMetadata:\n", True)
VARIABLES = ("          IDEMPOTENCY_TABLE_NAME: !Ref IdempotencyTable\n", True)
OUTPUTS = ("\nOutputs:\n", True)
DASHBOARD = ('                  ["AWS/DynamoDB", "WriteThrottleEvents", "TableName", "${IdempotencyTable}"],\n', False)


def into_template(template: Path, blocks: list[str], places: list[tuple[str, bool]], skip: int | None) -> None:
    """Each of a page's ``blocks`` at its place in ``template``, but the ``skip``-th."""
    for index, (block, (anchor, after)) in enumerate(zip(blocks, places, strict=True)):
        if index != skip:
            _insert(template, anchor, block, after=after)


def _copy(project: Path) -> None:
    """The core's own project, with the checkout's SAM CLI, DynamoDB Local and function runtime (none is copied)."""
    template_project(project, environments=(".venv-sam", "node_modules", ".lambda-runtime"))


def _failures(stdout: str) -> list[str]:
    return re.findall(r"^FAILED (\S+)", stdout, re.MULTILINE)


@pytest.mark.long(60)
@pytest.mark.timeout(600)
def test_an_existing_table_given_as_the_readme_says_passes_the_checks_and_the_contract(tmp_path: Path) -> None:
    _copy(tmp_path)
    _follow(tmp_path)
    template = (tmp_path / "template.yaml").read_text()
    assert "InventoryTable:\n    Type: AWS::DynamoDB::Table" not in template

    done = pytest_in(tmp_path, _STATIC, "-p", "no:xdist", *_ON_THE_STACK, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    # The stack outputs the table's name and charts it, as it does its own tables: the name the parameter gives.
    document, reading = load_template(tmp_path / "template.yaml"), Template.from_file(tmp_path / "template.yaml")
    name = reading.parameters["ExistingInventoryTable"]
    assert reading.resolve(document["Outputs"]["InventoryTableName"]["Value"]) == name
    dashboard = reading.resolve(document["Resources"]["ConsumerDashboard"]["Properties"]["DashboardBody"])
    assert [
        metric
        for metric in ("WriteThrottleEvents", "TransactionConflict")
        if f'"{metric}", "TableName", "{name}"' in dashboard
    ] == [
        "WriteThrottleEvents",
        "TransactionConflict",
    ]

    # The handler's own tests (moto, the table made from its LocalTables keys) and the contract on the local stack.
    contract = ["tests/app/test_inventory_reserved.py", "tests/app/test_handler_contract.py", "-k", "InventoryReserved"]
    done = pytest_in(tmp_path, contract, "-p", "no:xdist", timeout=400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout


@pytest.mark.long(20)
@pytest.mark.parametrize(
    ("skip", "replace", "caught_by", "said"),
    [
        (_KEYS, None, "test_outputs_and_config.py", "InventoryTable's keys under LocalTables:"),
        (
            None,
            (_VARIABLE, "!Ref ExistingInventoryTable", "!Ref InventoryTable"),
            "test_function.py",
            '"INVENTORY_TABLE_NAME: !Ref ExistingInventoryTable"',
        ),
        (_GRANT, None, "test_iam_matches_code.py", "on InventoryTable"),
        (_PARAMETER, None, "test_tables.py", "or a parameter ExistingInventoryTable naming an existing table"),
        (
            None,
            (_OUTPUT, "!Ref ExistingInventoryTable", "!Ref InventoryTable"),
            "test_outputs_and_config.py",
            "cannot resolve Ref 'InventoryTable'",
        ),
        (
            None,
            (_DASHBOARD, "${ExistingInventoryTable}", "${InventoryTable}"),
            "test_dashboard.py",
            "cannot resolve Ref 'InventoryTable'",
        ),
    ],
    ids=[
        "keys-left-out",
        "variable-from-the-table",
        "grant-left-out",
        "parameter-left-out",
        "output-from-the-table",
        "dashboard-from-the-table",
    ],
)
def test_each_step_left_out_or_written_for_a_stack_table_fails_the_check_readme_names(
    tmp_path: Path, skip: int | None, replace: tuple[int, str, str] | None, caught_by: str, said: str
) -> None:
    _copy(tmp_path)
    _follow(tmp_path, skip=skip, replace=replace)

    done = pytest_in(tmp_path, [f"tests/deployment/{caught_by}"], "-p", "no:xdist", "-rfE", timeout=300)

    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert said in done.stdout, done.stdout[-4000:]


@pytest.mark.long(15)
def test_a_table_parameter_with_a_default_needs_its_keys_all_the_same(tmp_path: Path) -> None:
    _copy(tmp_path)
    _follow(tmp_path, skip=_KEYS, replace=(_PARAMETER, "Type: String\n", "Type: String\n    Default: inventory\n"))

    done = pytest_in(tmp_path, ["tests/deployment/test_tables.py"], "-p", "no:xdist", "-rfE", timeout=300)

    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert (
        "give its keys for the local stack under the template's Metadata, LocalTables: InventoryTable:" in done.stdout
    )
