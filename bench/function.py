"""The Lambda handlers the benchmark deploys: one system (``BENCH_SYSTEM``), or the relay, timed from inside. Event:
``{"latency_ms": 10, "event": <SQS event>}``; answer: the wall and CPU seconds around the system's handler (the
emulator's hop left out, as from Lambda's billed duration) and the records reported failed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

# The function's code is the repository (bench, testkit) with the deployed artifact, src/, beside
# it: Lambda puts the task root on the path, the artifact's directory is added here.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from botocore import handlers as botocore_handlers

from bench.probe import RoundTripProbe, on_new_clients
from bench.systems import SYSTEM_ENV, SYSTEMS
from consumer.config import Settings
from consumer.handler import declared_settings, declared_tables
from testkit import application

_probe = RoundTripProbe()
if SYSTEM_ENV in os.environ:
    # Installed before the system creates its clients: the latency is slept per HTTP request, in this process.
    with on_new_clients(_probe.handler_specs()):
        _handlers = application.registered()
        _settings = Settings.from_env(tables=declared_tables(_handlers), handler_settings=declared_settings(_handlers))
        _system = {system.name: system for system in SYSTEMS}[os.environ[SYSTEM_ENV]](_settings)
else:  # The relay's function: its clients, made at its first send, sleep BENCH_LATENCY_MS per request.
    _latency_s = float(os.environ.get("BENCH_LATENCY_MS", "0")) / 1000
    botocore_handlers.BUILTIN_HANDLERS.append(("before-send.sqs", lambda **_: time.sleep(_latency_s)))
    from consumer import relay as _relay


def handler(request: dict[str, Any], context: Any) -> dict[str, Any]:
    _probe.latency_s, _probe.botocore_cpu_s, _probe.server_s = float(request.get("latency_ms", 0)) / 1000, 0.0, 0.0
    _probe.calls = 0
    cpu_before, started = time.process_time(), time.perf_counter()
    failed = len(_system.handle(request["event"], context).get("batchItemFailures") or [])
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_before
    figures = {"botocore_cpu_s": _probe.botocore_cpu_s, "server_s": _probe.server_s, "calls": _probe.calls}
    return {"wall_s": wall, "cpu_s": cpu, "failed": failed, **figures}


def relay(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """``consumer.relay.handler`` unchanged, its wall time read around it as the systems' is."""
    started = time.perf_counter()
    response = _relay.handler(event, context)
    return {**response, "wall_s": time.perf_counter() - started, "records": len(event["Records"])}
