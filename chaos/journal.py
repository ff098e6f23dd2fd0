"""What a runtime process reports to the harness, where a crash (``os._exit``) cannot take it back:
each event one JSON line appended with a single ``os.write`` on an ``O_APPEND`` descriptor, on disk
before the next instruction, whole or not at all, whatever the other threads write."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


class Journal:
    """Append-only JSON lines: one file per execution environment, whose runtime processes follow one another."""

    def __init__(self, path: Path) -> None:
        before = list(read([path]))
        # The environment's cold starts before this one: with its seed, what this process draws its faults from.
        self.cold_starts = sum(entry["event"] == "init" for entry in before)
        # The forced faults its earlier processes paid: one is owed once per environment, not per process.
        self.paid = Counter(str(entry["kind"]) for entry in before if entry["event"] == "fault" and entry.get("paid"))
        self._descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, event: str, **fields: Any) -> None:
        os.write(self._descriptor, (json.dumps({"event": event, **fields}, separators=(",", ":")) + "\n").encode())


def read(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Every entry of every journal (a line cut short, should one be, is skipped)."""
    for path in paths:
        for line in path.read_text().splitlines() if path.exists() else ():
            try:
                yield json.loads(line)
            except ValueError:
                continue
