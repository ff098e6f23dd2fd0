"""The function's own output, kept apart from the command's: its log file, and the metrics in it.

In AWS the function's stdout goes to CloudWatch Logs, its Powertools metrics as EMF lines
there; locally the same lines go to a file, and ``outcome_counts`` adds up those metrics.
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from consumer.idempotency.observer import FallBack
from consumer.outcome import Outcome


def command_output(path: Path) -> Callable[[str], None]:
    """Start ``path`` afresh as ``sys.stdout`` (where the handler logs and prints metrics); return how the command
    prints its own lines (to the terminal). Call it before the handler is imported: its logger keeps its stream."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    terminal = sys.stdout
    log = path.open("a", encoding="utf-8", buffering=1)
    sys.stdout = log

    def warn_into_log(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, *_: Any, **__: Any
    ) -> None:
        # Warnings come from the function's libraries (e.g. Powertools): they belong in its log.
        log.write(warnings.formatwarning(message, category, filename, lineno))

    warnings.showwarning = warn_into_log
    return partial(print, file=terminal, flush=True)


# The EMF metrics the function emits per invocation: one per outcome, the conflicts it absorbed, and its grouping.
METRICS = (
    *(outcome.value for outcome in Outcome),
    "conflicts_absorbed",
    "transactions",
    "messages_per_transaction",
    *(f"fell_back_{reason}" for reason in FallBack.ALL),
)


def outcome_counts(path: Path) -> Counter[str]:
    totals: Counter[str] = Counter()
    with contextlib.suppress(FileNotFoundError), path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if '"_aws"' not in line:
                continue
            try:
                document = json.loads(line)
            except ValueError:
                continue
            for name in METRICS:
                value = document.get(name)
                values = value if isinstance(value, list) else [value]
                totals[name] += int(sum(v for v in values if isinstance(v, int | float)))
    return totals
