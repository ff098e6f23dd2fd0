"""The core says which version it is: ``consumer.__version__`` is CHANGELOG.md's newest release."""

from __future__ import annotations

import re

import consumer
from testkit.template import REPO_ROOT

_RELEASE = re.compile(r"^## (\d+\.\d+\.\d+)$", re.MULTILINE)


def releases(changelog: str) -> list[str]:
    """The versions CHANGELOG.md has a section for, newest first."""
    return _RELEASE.findall(changelog)


def test_the_cores_version_is_the_changelogs_newest_release() -> None:
    found = releases((REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    assert found, "CHANGELOG.md has no release section (## <major>.<minor>.<patch>)"
    assert consumer.__version__ == found[0], (
        f"consumer.__version__ is {consumer.__version__}, CHANGELOG's newest release {found[0]}: a release moves both"
    )


def test_releases_are_listed_newest_first_each_once() -> None:
    found = releases((REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    as_numbers = [tuple(int(part) for part in version.split(".")) for version in found]
    assert as_numbers == sorted(set(as_numbers), reverse=True)


def test_a_release_heading_is_read_and_an_unreleased_one_is_not() -> None:
    assert releases("## Unreleased\n\n- x\n\n## 2.1.0\n\n- y\n\n## 2.0.0\n") == ["2.1.0", "2.0.0"]
    assert releases("## 2.1.0 (draft)\n") == []
