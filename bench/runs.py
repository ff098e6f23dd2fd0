"""One invocation of a system, checked: a benchmark over failed records would measure nothing."""

from __future__ import annotations

from typing import Any

from bench.systems import LambdaSystem
from testkit.lambda_sqs import LambdaContext, sqs_event


class BatchFailed(RuntimeError):
    """A system reported records as failed: its figures would not be comparable."""


def invoke(system: LambdaSystem, event: dict[str, Any]) -> None:
    response = system.handle(event, LambdaContext(timeout_s=60.0))
    failures = response.get("batchItemFailures") or []
    if failures:
        raise BatchFailed(f"{system.name}: {len(failures)} of {len(event['Records'])} records failed")


def run_batch(system: LambdaSystem, bodies: list[str]) -> None:
    invoke(system, sqs_event(bodies))
