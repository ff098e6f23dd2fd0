"""What an execution environment tells the harness, written where a killed process cannot take it back.

The chaos function runs in Lambda's runtime, in processes that a crash fault ends with
``os._exit``. Anything kept in memory dies with them, so each event (a fault injected,
a cold start, an invocation's record results) is one JSON line appended with a single
``os.write`` on an ``O_APPEND`` descriptor: on the file before the next instruction, whole
or not at all, whatever kills the process afterwards. The harness reads every journal
once the run is over.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


class Journal:
    """Append-only JSON lines; thread-safe within a process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._lock = threading.Lock()

    def write(self, entry: dict[str, Any]) -> None:
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._descriptor, line)


def read(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    """Every entry of every journal (a line cut short by a dying process is skipped)."""
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                yield json.loads(line)
            except ValueError:
                continue
