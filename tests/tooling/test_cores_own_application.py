"""The tooling tests that run the registered application run on the core's own (template_copies): a checkout runs
one test per module, which runs the module's marked tests in a project made from the template, and a failure there
fails it in the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tooling import ON_THE_CORES_OWN, template_copies
from tests.tooling.template_copies import pytest_in, run_in, template_project

_PLANTED = """
import pytest

from tests.tooling.template_copies import on_the_cores_own_application

test_on_the_cores_own_application = on_the_cores_own_application(__name__, seconds=10)


@pytest.mark.cores_own_application
def test_marked():
    assert {outcome!r} == "passes", "the marked test fails on purpose"


def test_unmarked():
    assert False, "an unmarked test is not run there"
"""


def _planted(directory: Path, outcome: str) -> Path:
    project = template_project(directory, environments=False)
    (project / "tests/tooling/test_planted.py").write_text(_PLANTED.format(outcome=outcome))
    return project


def _collected(project: Path, **environment: str) -> list[str]:
    done = pytest_in(project, ["tests/tooling/test_planted.py"], "--collect-only", environment=environment)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line.split("::")[1] for line in done.stdout.splitlines() if "::" in line]


def test_a_checkout_runs_the_modules_one_test_and_the_cores_own_application_its_marked_tests(tmp_path: Path) -> None:
    project = _planted(tmp_path / "project", "passes")

    assert _collected(project) == ["test_on_the_cores_own_application", "test_unmarked"]
    assert _collected(project, **{ON_THE_CORES_OWN: "1"}) == ["test_marked", "test_unmarked"]


@pytest.mark.parametrize("outcome", ["passes", "fails"])
def test_the_checkouts_test_fails_when_a_marked_test_fails_on_the_cores_own_application(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    # The core's own application, with the module planted in it, as the checkout's template would render it.
    monkeypatch.setattr(template_copies, "template_project", lambda target: _planted(target, outcome))
    run = template_copies.on_the_cores_own_application("tests.tooling.test_planted", seconds=10)

    if outcome == "passes":
        run(tmp_path)
        return
    with pytest.raises(AssertionError, match="the marked test fails on purpose") as failed:
        run(tmp_path)
    assert "an unmarked test is not run there" not in str(failed.value)


def test_a_project_made_for_the_proof_takes_the_checkouts_linked_environments_as_built(tmp_path: Path) -> None:
    # Its make targets must never install into the checkout's environments: npm ci there empties node_modules under
    # every test running DynamoDB Local at the time.
    project = template_project(tmp_path / "project")
    stamps = [".venv/.installed", "node_modules/.installed"]
    question = ["make", "--question", *stamps]

    assert run_in(project, question).returncode == 0, "a make target there would install into the checkout's"

    (project / "package.json").touch()
    assert run_in(project, question).returncode == 1, "the control: a newer package.json is installed from"
