"""Every tracked file has one owner (ownership.toml): the core's, yours, or a listed merge; docs/upgrading.md agrees."""

from __future__ import annotations

import re
import subprocess
import tomllib
from collections.abc import Iterable, Mapping, Sequence

import pytest
import yaml

from local.upgrade import ANSWERS, holds
from testkit.template import REPO_ROOT

COLUMNS = ("ours", "yours", "merged")


def manifest() -> dict[str, list[str]]:
    document = tomllib.loads((REPO_ROOT / "ownership.toml").read_text(encoding="utf-8"))
    assert set(document) == set(COLUMNS), f"ownership.toml has the columns {COLUMNS}, got {sorted(document)}"
    return {column: list(document[column]) for column in COLUMNS}


def owners(path: str, columns: Mapping[str, Sequence[str]]) -> list[str]:
    """The columns whose entries hold ``path`` (by the rule make upgrade restores the core's files by)."""
    return [column for column, entries in columns.items() if holds(entries, path)]


def ownership_mistakes(paths: Iterable[str], columns: Mapping[str, Sequence[str]]) -> list[str]:
    mistakes = []
    for path in paths:
        found = owners(path, columns)
        if not found:
            mistakes.append(f"{path} is in no column of ownership.toml: add it to yours (an upgrade never touches it)")
        elif len(found) > 1:
            mistakes.append(f"{path} is in {' and '.join(found)} of ownership.toml: one owner each")
    return mistakes


# The template's file for the answers copier writes, by the name it has in a project.
_ANSWERS_TEMPLATE = "{{ _copier_conf.answers_file }}.jinja"


def _tracked() -> list[str]:
    # Or would track: a file an upgrade or the user added and not yet committed is owned all the same.
    command = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: nothing is tracked to own")
    return [ANSWERS if path == _ANSWERS_TEMPLATE else path for path in listed.stdout.splitlines()]


def kept_from_upgrades(copier_config: str) -> list[str]:
    """What copier.yml excludes when it updates a project (and only then)."""
    excluded: list[str] = yaml.safe_load(copier_config)["_exclude"]
    return [
        m[1]
        for entry in excluded
        if (m := re.fullmatch(r"{% if _copier_operation == 'update' %}(.+){% endif %}", entry))
    ]


def upgrade_mistakes(copier_config: str, columns: Mapping[str, Sequence[str]], *, template: bool) -> list[str]:
    """copier.yml against the manifest: an upgrade keeps its hands off every entry of yours the template ships (in the
    template's own manifest, all of them; a project's may add its own, which make upgrade excludes as well) and off
    nothing else."""
    kept = kept_from_upgrades(copier_config)
    mistakes = [
        f"copier.yml keeps {entry} from upgrades, which ownership.toml does not list in yours"
        for entry in kept
        if entry not in columns["yours"]
    ]
    if template:
        mistakes += [
            f"copier.yml lets upgrades touch {entry}, which ownership.toml lists in yours"
            for entry in columns["yours"]
            if entry not in kept
        ]
    return mistakes


def test_every_tracked_file_has_exactly_one_owner() -> None:
    mistakes = ownership_mistakes(_tracked(), manifest())
    assert not mistakes, "\n".join(mistakes)


def test_a_file_in_no_column_or_in_two_is_named_in_one_line_each() -> None:
    columns = {"ours": ["src/consumer/", "Makefile"], "yours": ["src/shop/", "src/consumer/extra.py"], "merged": []}

    assert ownership_mistakes(["src/consumer/app.py", "src/shop/registry.py", "Makefile"], columns) == []
    assert ownership_mistakes(["notes.md", "src/consumer/extra.py", "Makefile.local"], columns) == [
        "notes.md is in no column of ownership.toml: add it to yours (an upgrade never touches it)",
        "src/consumer/extra.py is in ours and yours of ownership.toml: one owner each",
        "Makefile.local is in no column of ownership.toml: add it to yours (an upgrade never touches it)",
    ]


def test_every_entry_names_something_tracked() -> None:
    tracked = _tracked()
    for column, entries in manifest().items():
        for entry in entries:
            assert any(path == entry or (entry.endswith("/") and path.startswith(entry)) for path in tracked), (
                f"{column}: {entry} names nothing tracked"
            )


def test_copier_keeps_from_upgrades_what_is_yours_and_nothing_else() -> None:
    config = (REPO_ROOT / "copier.yml").read_text(encoding="utf-8")
    mistakes = upgrade_mistakes(config, manifest(), template=not (REPO_ROOT / ANSWERS).exists())
    assert not mistakes, "\n".join(mistakes)


def test_a_core_path_kept_from_upgrades_or_a_path_of_yours_left_to_them_is_named() -> None:
    config = """_exclude:
  - .git
  - "{% if _copier_operation == 'update' %}src/shop/{% endif %}"
  - "{% if _copier_operation == 'update' %}Makefile{% endif %}"
"""
    columns = {"ours": ["Makefile"], "yours": ["src/shop/", "events/"], "merged": []}

    assert kept_from_upgrades(config) == ["src/shop/", "Makefile"]
    assert upgrade_mistakes(config, columns, template=True) == [
        "copier.yml keeps Makefile from upgrades, which ownership.toml does not list in yours",
        "copier.yml lets upgrades touch events/, which ownership.toml lists in yours",
    ]
    # A project's own entry of yours is make upgrade's to exclude.
    assert upgrade_mistakes(config, columns, template=False) == [
        "copier.yml keeps Makefile from upgrades, which ownership.toml does not list in yours"
    ]


def test_the_upgrading_page_lists_the_manifests_columns() -> None:
    text = (REPO_ROOT / "docs" / "upgrading.md").read_text(encoding="utf-8")
    (row,) = [line for line in text.splitlines() if line.startswith("| `")]
    cells = [re.findall(r"`([^`]+)`", cell) for cell in row.strip("|").split(" | ")]
    assert cells == list(manifest().values()), "docs/upgrading.md's table and ownership.toml disagree"
