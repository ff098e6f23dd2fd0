"""The Lambda handler the benchmark deploys: one system, timed from inside its own process.

Each system runs in an execution environment of its own (``local.lambda_runtime``: the
Runtime Interface Emulator and ``awslambdaric`` on the function's Python 3.12), under the
cgroup CPU quota of the memory size measured. The clocks are read here, around the
system's handler, so the emulator's HTTP hop and the event's JSON are outside the figure
as Lambda's billed duration leaves them out. The probe's latency hook is installed
before the system creates its clients, so the sleep is paid per HTTP request inside the
function's process, where a network round trip is paid.

Event: ``{"latency_ms": 10, "event": <SQS event>, "profile": false}``. Answer: the wall
and CPU seconds of the invocation, the records reported failed, and with ``profile``
the top of a cProfile of the invocation (CPU clock).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

# The function's code is the repository (bench, testkit) with the deployed artifact, src/, beside
# it: Lambda puts the task root on the path, the artifact's directory is added here.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from bench.hooks import on_new_clients
from bench.probe import RoundTripProbe
from bench.systems import SYSTEM_ENV, LambdaSystem, PowertoolsBaseline, SeedPattern, ThisConsumer
from consumer.config import Settings

SYSTEMS = {system.name: system for system in (ThisConsumer, PowertoolsBaseline, SeedPattern)}
_PROFILE_ENTRIES = 25

_probe = RoundTripProbe()


def _build() -> LambdaSystem:
    settings = Settings(
        idempotency_table_name=os.environ["IDEMPOTENCY_TABLE_NAME"],
        ledger_table_name=os.environ["LEDGER_TABLE_NAME"],
        dead_letter_queue_url=os.environ["DEAD_LETTER_QUEUE_URL"],
        receipt_webhook_url=os.environ["RECEIPT_WEBHOOK_URL"],
    )
    with on_new_clients(_probe.handler_specs()):
        system: LambdaSystem = SYSTEMS[os.environ[SYSTEM_ENV]](settings)
    return system


_system = _build()


# Where a function's own time lands, by the first of these found in its file's path.
_PACKAGES = ("botocore", "urllib3", "consumer", "pydantic", "aws_lambda_powertools", "jmespath", "concurrent", "json")
_BUILTIN = "~"  # pstats' file name for C functions: their time goes to whoever called them


def _package(filename: str) -> str:
    parts = Path(filename).parts
    return next((package for package in _PACKAGES if package in parts), "other stdlib (http.client, email, ...)")


def _profile_summary(profiler: cProfile.Profile) -> dict[str, Any]:
    """The top entries by own and by cumulative time (pstats' text) and own time per package, in CPU seconds."""
    text, cumulative = io.StringIO(), io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(_PROFILE_ENTRIES)
    stats.stream = cumulative  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(_PROFILE_ENTRIES)
    by_package: dict[str, float] = {}
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    for (filename, _, _), (_, _, own_s, _, callers) in raw.items():
        if filename != _BUILTIN:
            shares = [(filename, own_s)]
        else:
            shares = [(caller[0], caller_stats[2]) for caller, caller_stats in callers.items()] or [(filename, own_s)]
        for source, seconds in shares:
            by_package[_package(source)] = by_package.get(_package(source), 0.0) + seconds
    return {"top": text.getvalue(), "cumulative": cumulative.getvalue(), "by_package_s": by_package}


def handler(request: dict[str, Any], context: Any) -> dict[str, Any]:
    _probe.latency_s = float(request.get("latency_ms", 0)) / 1000
    event = request["event"]
    profiler = cProfile.Profile(time.process_time) if request.get("profile") else None
    cpu_before, started = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    response = _system.handle(event, context)
    if profiler is not None:
        profiler.disable()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_before
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "failed": len(response.get("batchItemFailures") or []),
        "profile": _profile_summary(profiler) if profiler is not None else None,
    }
