"""What a runtime process reports to the harness, where a crash (``os._exit``) cannot take it back:
each event one JSON line appended with a single ``os.write`` on an ``O_APPEND`` descriptor, on disk
before the next instruction, whole or not at all, whatever the other threads write."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class Journal:
    """Append-only JSON lines: the next free ``journal-N.jsonl`` of the run's directory, one per process."""

    def __init__(self, directory: Path) -> None:
        for index in itertools.count():
            path = directory / f"journal-{index}.jsonl"
            try:
                self._descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            # The number of cold starts before this one in the run: what seeds this process.
            self.index = index
            break

    def write(self, event: str, **fields: Any) -> None:
        os.write(self._descriptor, (json.dumps({"event": event, **fields}, separators=(",", ":")) + "\n").encode())


def read(directory: Path) -> Iterator[dict[str, Any]]:
    """Every entry of every journal in ``directory`` (a line cut short, should one be, is skipped)."""
    for path in sorted(directory.glob("journal-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                yield json.loads(line)
            except ValueError:
                continue
