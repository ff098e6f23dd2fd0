"""The Lambda handler the benchmark deploys: one system (``BENCH_SYSTEM``), timed from inside its own process.

Event: ``{"latency_ms": 10, "event": <SQS event>, "profile": false}``. Answer: the wall and CPU
seconds around the system's handler (so the emulator's hop is left out, as from Lambda's billed
duration), the records reported failed, and with ``profile`` a cProfile of it (CPU clock).
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

# The function's code is the repository (bench, testkit) with the deployed artifact, src/, beside
# it: Lambda puts the task root on the path, the artifact's directory is added here.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from bench.probe import RoundTripProbe, on_new_clients
from bench.systems import SYSTEM_ENV, SYSTEMS
from consumer.config import Settings
from consumer.handlers import declared_settings, declared_tables

# Where a function's own time lands, by the first of these found in its file's path.
_PACKAGES = ("botocore", "urllib3", "consumer", "pydantic", "aws_lambda_powertools", "jmespath", "concurrent", "json")
_BUILTIN = "~"  # pstats' file name for C functions: their time goes to whoever called them

_probe = RoundTripProbe()
# Installed before the system creates its clients: the latency is slept per HTTP request, in this process.
with on_new_clients(_probe.handler_specs()):
    _settings = Settings.from_env(tables=declared_tables(), handler_settings=declared_settings())
    _system = {system.name: system for system in SYSTEMS}[os.environ[SYSTEM_ENV]](_settings)


def _package(filename: str) -> str:
    parts = Path(filename).parts
    return next((package for package in _PACKAGES if package in parts), "other stdlib (http.client, email, ...)")


def _profile_summary(profiler: cProfile.Profile) -> dict[str, Any]:
    """Own time per package, in CPU seconds."""
    stats = pstats.Stats(profiler)
    by_package: defaultdict[str, float] = defaultdict(float)
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    for (filename, _, _), (_, _, own_s, _, callers) in raw.items():
        if filename != _BUILTIN:
            shares = [(filename, own_s)]
        else:
            shares = [(caller[0], caller_stats[2]) for caller, caller_stats in callers.items()] or [(filename, own_s)]
        for source, seconds in shares:
            by_package[_package(source)] += seconds
    return {"by_package_s": dict(by_package)}


def handler(request: dict[str, Any], context: Any) -> dict[str, Any]:
    _probe.latency_s = float(request.get("latency_ms", 0)) / 1000
    profiler = cProfile.Profile(time.process_time) if request.get("profile") else None
    cpu_before, started = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    response = _system.handle(request["event"], context)
    if profiler is not None:
        profiler.disable()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_before
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "failed": len(response.get("batchItemFailures") or []),
        "profile": _profile_summary(profiler) if profiler is not None else None,
    }
