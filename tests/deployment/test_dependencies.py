"""The deployed dependencies are locked: every package pinned and hashed, and the lock follows its input."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==(\S+)")


def _entries(lock: str) -> dict[str, tuple[str, int]]:
    """Each locked package: its version and how many file hashes it lists."""
    entries: dict[str, tuple[str, int]] = {}
    for block in re.split(r"\n(?=\S)", lock):
        pinned = _PIN.match(block)
        if pinned:
            entries[pinned[1].lower()] = (pinned[2], block.count("--hash=sha256:"))
    return entries


def test_every_deployed_package_is_pinned_with_the_hashes_of_its_files() -> None:
    lock = (SRC / "requirements.txt").read_text(encoding="utf-8")
    requirement_lines = [line for line in lock.splitlines() if line and not line[0].isspace() and line[0] != "#"]
    entries = _entries(lock)
    assert len(entries) == len(requirement_lines), f"a requirement that is not name==version: {requirement_lines}"
    unhashed = sorted(name for name, (_, hashes) in entries.items() if hashes == 0)
    assert not unhashed, f"locked without hashes: {unhashed}"
    # A native package lists its wheels for every platform, so an arm64 build checks its own.
    assert entries["pydantic-core"][1] > 10


def test_the_lock_holds_each_top_level_package_at_the_version_asked() -> None:
    entries = _entries((SRC / "requirements.txt").read_text(encoding="utf-8"))
    for line in (SRC / "requirements.in").read_text(encoding="utf-8").splitlines():
        pinned = _PIN.match(line)
        if pinned:
            assert entries.get(pinned[1].lower(), ("absent",))[0] == pinned[2], f"{line}: run make lock"
