"""``make upgrade`` (local/upgrade.py over copier): a project on the previous release, v2.1.0, made before the template
existed, its examples replaced as that release's docs say and a handler of its own added, is adopted and upgraded to
this tree, and passes the core's checks.

This tree is tagged in the trial's own clone of the repository (its uncommitted changes committed there, as copier does
for a local HEAD), as the release after the last: the repository itself is never tagged.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import consumer
import local.upgrade as upgrade_module
from local.replace_examples import register
from local.upgrade import ANSWERS, adopt, recorded
from testkit import application
from testkit.template import REPO_ROOT
from tests.tooling.template_copies import ENVIRONMENTS, link_environments, pytest_in, run_in, taken_as_built
from tests.tooling.test_making_it_theirs import _insert
from tests.utils import tables_checklist

PREVIOUS = "v2.1.0"
# The commit v2.1.0 tags. A clone of the branch alone brings no tags, so the trial tags its own clone of the template
# and reads the project's files from this commit, which every clone of main has.
PREVIOUS_COMMIT = "a6b049ff1d96ccb1fead4b4903f0577d4aab6c8e"
# The tree under test, as the release after the last (a post-release: copier takes no pre-release as the newest tag).
CURRENT = f"v{consumer.__version__}.post1"
# Commits in the trial's repositories, whoever runs it.
_IDENTITY = {
    f"GIT_{role}_{field}": value
    for role in ("AUTHOR", "COMMITTER")
    for field, value in (("NAME", "upgrade trial"), ("EMAIL", "trial@example.com"))
}


def _git(directory: Path, *arguments: str, **environment: str) -> str:
    done = subprocess.run(
        ["git", *arguments],
        cwd=directory,
        env={**os.environ, **_IDENTITY, **environment},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def _template(directory: Path) -> Path:
    """A clone of the template this project records, at its recorded version, tagged CURRENT: in the template's own
    repository, this tree (uncommitted changes too); in a project made from it, the core it was made from. v2.1.0 is
    tagged at its commit."""
    source, version = recorded(REPO_ROOT)
    _git(REPO_ROOT, "clone", "--quiet", source, str(directory))
    if Path(source).resolve() == REPO_ROOT.resolve():
        _git(directory, "--git-dir=.git", "add", "--all", GIT_WORK_TREE=str(REPO_ROOT))
        _git(directory, "commit", "--quiet", "--allow-empty", "--message", "the tree under test")
        _git(directory, "reset", "--quiet", "--hard")
    else:
        _git(directory, "checkout", "--quiet", version)
    _git(directory, "tag", "--force", CURRENT)
    _git(directory, "tag", "--force", PREVIOUS, PREVIOUS_COMMIT)
    return directory


def _project_on_the_previous_release(directory: Path, template: Path) -> Path:
    """A project as v2.1.0 made one (a clone's files, committed), its examples replaced by that release's own code of
    its docs, then a handler it has never seen (ParcelReserved, a table of its own) added as docs/tables.md says."""
    archive = subprocess.run(["git", "archive", PREVIOUS_COMMIT], cwd=template, capture_output=True, check=False)
    # The release is read from the template's history: a shallow clone has none to start from.
    assert archive.returncode == 0, f"no commit of {PREVIOUS} in the template (a shallow clone?): {archive.stderr!r}"
    directory.mkdir()
    subprocess.run(["tar", "-x", "-C", str(directory)], input=archive.stdout, check=True)
    replace = (
        "from pathlib import Path; from tests.tooling.test_replacing_the_examples import _replace_the_examples as r;"
        " r(Path('.'))"
    )
    done = run_in(directory, [sys.executable, "-c", replace])
    assert done.returncode == 0, done.stderr[-2000:]

    def renamed(text: str) -> str:
        return text.replace("Inventory", "Parcel").replace("inventory", "parcel").replace("INVENTORY", "PARCEL")

    handler = renamed((directory / "examples/inventory_reserved.py").read_text())
    (application.handlers_folder(directory) / "parcel_reserved.py").write_text(handler)
    # A reservation applies only with the stock asked: the generic contract draws payloads with these seeds first.
    seeds = renamed((directory / "tests/app/inventory_reserved_seeds.py").read_text())
    (directory / "tests/app/parcel_reserved_seeds.py").write_text(seeds)
    registration, table, variable, grant = map(renamed, tables_checklist())
    register(application.registry_file(directory), registration)
    template = directory / "template.yaml"
    _insert(template, "\nResources:\n", table + "\n", after=True)
    _insert(template, "          IDEMPOTENCY_TABLE_NAME: !Ref IdempotencyTable\n", variable, after=True)
    _insert(template, "              - Sid: ParkPoisonMessages\n", grant, after=False)
    _git(directory, "init", "--quiet")
    _git(directory, "add", "--all")
    _git(directory, "commit", "--quiet", "--message", "a project on v2.1.0, its examples replaced")
    return directory


def _make_upgrade(project: Path, template: Path) -> subprocess.CompletedProcess[str]:
    """``make upgrade`` as a project made before it existed runs it: the newer checkout's Makefile in its own folder
    (the checkout's environments linked, its venv taken as built)."""
    link_environments(project, environments=True)
    # v2.1.0's .gitignore names the folders, not links to them: untracked, they would leave the project unclean.
    with (project / ".git/info/exclude").open("a") as exclude:
        exclude.write("".join(f"{name}\n" for name in ENVIRONMENTS))
    # The version named: a template a project records may have tags newer than the core it was made from.
    command = ["make", "--no-print-directory", "-f", str(template / "Makefile"), "-o", ".venv/.installed", "upgrade",
               f"VERSION={CURRENT}"]  # fmt: skip
    return run_in(project, command, timeout=300, environment=_IDENTITY)


def _take_this_releases_steps(project: Path) -> None:
    """What CHANGELOG.md's Unreleased section asks of a project without the examples, done as it says: the lines
    marked ``# example: payment`` that the upgrade brings deleted with the lines indented under them, and the outbox's
    message types added to ``HANDLER_API`` in its own ``tests/app/test_handler_registry.py``."""
    template = project / "template.yaml"
    lines, kept, depth = template.read_text().splitlines(keepends=True), [], None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if depth is not None and (not line.strip() or indent > depth):
            continue
        depth = indent if line.rstrip().endswith("# example: payment") else None
        if depth is None:
            kept.append(line)
    template.write_text("".join(kept))
    registry_test = project / "tests/app/test_handler_registry.py"
    text = registry_test.read_text()
    registry_test.write_text(text.replace('"ApiUrl",', '"ApiUrl", "QueueMessage", "TopicMessage", "BusEvent",', 1))
    _git(project, "commit", "--quiet", "--all", "--message", "CHANGELOG.md's steps for this release")


@pytest.fixture
def trial(tmp_path: Path) -> tuple[Path, Path]:
    """The template (this tree, tagged) and a project on the previous release, examples replaced, a handler added."""
    template = _template(tmp_path / "template")
    return template, _project_on_the_previous_release(tmp_path / "project", template)


@pytest.mark.long(450)
@pytest.mark.timeout(1500)
def test_a_project_on_the_previous_release_with_a_handler_of_its_own_upgrades_and_passes_the_cores_checks(
    trial: tuple[Path, Path],
) -> None:
    template, project = trial

    done = _make_upgrade(project, template)

    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    answers = yaml.safe_load((project / ANSWERS).read_text())
    assert (answers["_commit"], answers["_src_path"]) == (CURRENT, str(template))
    # The tooling tests v2.1.0's docs had deleted come back (the core's, replaced whole); the examples do not.
    assert "restored tests/tooling/test_making_it_theirs.py" in done.stdout
    assert not (application.handlers_folder(project) / "payment_received.py").exists()
    assert not (project / "tests/app/test_payment_received.py").exists()
    assert (project / "copier.yml").read_text() == (template / "copier.yml").read_text()
    registry = application.registry_file(project).read_text()
    assert "ParcelReservedHandler" in registry and "PaymentReceivedHandler" not in registry
    assert "ParcelTable" in (project / "template.yaml").read_text()
    _take_this_releases_steps(project)

    # make test, the user's loop, as written, on the checkout's environments (the upgrade rewrote what they are
    # installed from). Its tests run in one process, beside make proof's workers (with three more workers
    # and their DynamoDB Locals on two cores, its DynamoDB tests errored at setup once here).
    taken_as_built(project)
    done = run_in(project, ["make", "--no-print-directory", "test", "PYTEST_WORKERS=-p no:xdist"], timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    # Two of the core's proof on the project's fixture project, made from the template and version it now records,
    # with the examples it no longer has: a mistake planted in the payment example stops the fixture's static stage.
    proof = [
        "tests/tooling/test_making_it_theirs.py::test_each_step_left_out_fails_the_test_the_page_names",
        "tests/tooling/test_one_mistake_one_failure.py::test_a_planted_mistake_stops_the_static_stage_with_one_failure"
        "_in_its_own_words[table_not_in_the_template]",
    ]
    done = pytest_in(project, proof, "-p", "no:xdist", timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.long(40)
def test_a_change_of_the_projects_own_to_a_core_file_the_upgrade_changes_too_stops_it_naming_the_file(
    trial: tuple[Path, Path],
) -> None:
    template, project = trial
    page = project / "docs/upgrading.md"
    page.write_text("A project's own first lines\n" + page.read_text().split("\n", 3)[3])
    _git(project, "commit", "--quiet", "--all", "--message", "a change of its own to the core's page")

    done = _make_upgrade(project, template)

    assert done.returncode != 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "The upgrade stopped on conflicts, your lines against the core's new ones, in: docs/upgrading.md." in (
        done.stderr
    ), done.stderr[-4000:]
    assert "<<<<<<< before updating" in page.read_text()


def test_adoption_records_the_version_the_core_says_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in _IDENTITY.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "src/consumer").mkdir(parents=True)
    (tmp_path / "src/consumer/__init__.py").write_text('__version__ = "2.1.0"\n')
    _git(tmp_path, "init", "--quiet")

    adopt(tmp_path, tmp_path / "template")

    assert yaml.safe_load((tmp_path / ANSWERS).read_text()) == {
        "_commit": "v2.1.0",
        "_src_path": str((tmp_path / "template").resolve()),
        "examples": True,
    }
    recorded = _git(tmp_path, "log", "--format=%s", "--", ANSWERS)
    assert recorded == "Record the core's version, v2.1.0, for make upgrade\n"


def test_a_core_that_names_no_version_is_not_adopted(tmp_path: Path) -> None:
    (tmp_path / "src/consumer").mkdir(parents=True)
    (tmp_path / "src/consumer/__init__.py").write_text('"""No version here."""\n')

    with pytest.raises(AssertionError, match="names no __version__"):
        adopt(tmp_path, tmp_path / "template")
    assert not (tmp_path / ANSWERS).exists()


@pytest.mark.parametrize(
    ("command", "stderr", "told"),
    [
        (["git", "add", "--", "docs/upgrading.md"], "fatal: Unable to create '.git/index.lock': File exists.\n",
         "make upgrade stopped: git add failed: fatal: Unable to create '.git/index.lock': File exists."),
        ([sys.executable, "-m", "copier", "update"], None, "make upgrade stopped: copier update failed (above)"),
    ],
    ids=["git", "copier"],
)  # fmt: skip
def test_a_failed_step_of_the_upgrade_is_named_with_what_it_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str],
    stderr: str | None, told: str,
) -> None:  # fmt: skip
    for name, value in _IDENTITY.items():
        monkeypatch.setenv(name, value)
    (tmp_path / ANSWERS).write_text("_commit: v2.1.0\n_src_path: /nowhere\n")
    (tmp_path / "ownership.toml").write_text("ours = []\nyours = []\nmerged = []\n")
    _git(tmp_path, "init", "--quiet")
    _git(tmp_path, "add", "--all")
    _git(tmp_path, "commit", "--quiet", "--message", "a project")

    def fails(project: Path) -> list[str]:
        raise subprocess.CalledProcessError(128, command, stderr=stderr)

    monkeypatch.setattr(upgrade_module, "restore_ours", fails)

    assert upgrade_module.upgrade(tmp_path, tmp_path / "template", None) == 128
    assert capsys.readouterr().err.strip() == told
