"""What Lambda's own runtime costs against calling the handler in process, in one run.

``python -m bench.runtime_overhead`` (``make runtime-overhead``): the function's handler on
an empty SQS batch (no AWS call, so what is timed is the way to the handler and back),

- cold: a fresh execution environment (emulator + awslambdaric on Python 3.12 under the
  512 MB CPU share) and its first invocation, against a fresh Python process that
  imports the handler and calls it once (the in-process path's own cold start);
- warm: invocations of a started environment against calls in process, taking turns.

Medians and p95 with the number of samples, and the difference of the medians: the
runtime path's overhead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

from bench.timing import REPO_ROOT, bench_function, fresh_process_s
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.lambda_runtime import LambdaEnvironment
from testkit.lambda_sqs import LambdaContext
from testkit.lambda_venv import venv_python

EMPTY_BATCH: dict[str, list[object]] = {"Records": []}
# Names only: an empty batch makes no AWS call.
ENVIRONMENT = {
    "IDEMPOTENCY_TABLE_NAME": "overhead-idempotency",
    "LEDGER_TABLE_NAME": "overhead-ledger",
    "DEAD_LETTER_QUEUE_URL": "http://127.0.0.1:9/overhead-dlq",
    **DUMMY_CREDENTIALS_ENV,
    "POWERTOOLS_METRICS_NAMESPACE": "Overhead",
    # Both paths quiet alike: the in-process one would print into this report.
    "POWERTOOLS_LOG_LEVEL": "WARNING",
    "POWERTOOLS_METRICS_DISABLED": "true",
}
_IN_PROCESS_COLD = (
    "from consumer.app import handler; from testkit.lambda_sqs import LambdaContext;"
    " handler({'Records': []}, LambdaContext())"
)


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered):7.1f} ms, p95 {p95:7.1f} ms (n={len(ordered)})"


def runtime_ms(environment: LambdaEnvironment) -> float:
    """One invocation of the empty batch through the runtime; a failed one would time something else."""
    started = time.perf_counter()
    invocation = environment.invoke(EMPTY_BATCH)
    elapsed = (time.perf_counter() - started) * 1000
    if not invocation.succeeded:
        raise RuntimeError(f"the runtime's invocation failed: {invocation.error}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime_overhead", description=__doc__)
    parser.add_argument("--cold", type=int, default=10, help="fresh environments and processes each (default 10)")
    parser.add_argument("--warm", type=int, default=200, help="warm invocations each (default 200)")
    parser.add_argument("--memory", type=int, default=512, help="the runtime's memory size, MB (default 512)")
    args = parser.parse_args(argv)
    src = REPO_ROOT / "src"
    function = bench_function(args.memory, handler="consumer.app.handler", code_dir=src)
    python = venv_python()
    in_process_environment = {
        **ENVIRONMENT,
        "PYTHONPATH": os.pathsep.join([str(src), str(REPO_ROOT)]),
        "PATH": "/usr/bin:/bin",
    }

    cold: dict[str, list[float]] = {"runtime": [], "in process": []}
    for _ in range(args.cold):
        with LambdaEnvironment(function, ENVIRONMENT, python=python, name="cold") as environment:
            cold["runtime"].append(runtime_ms(environment))
        in_process_s = fresh_process_s(Path(sys.executable), _IN_PROCESS_COLD, in_process_environment)
        cold["in process"].append(in_process_s * 1000)

    # Loaded as Lambda's runtime loads it: the environment set first (nothing here has imported consumer.app).
    os.environ.update(ENVIRONMENT)
    handler = importlib.import_module("consumer.app").handler
    warm: dict[str, list[float]] = {"runtime": [], "in process": []}
    with LambdaEnvironment(function, ENVIRONMENT, python=python, name="warm") as environment:
        environment.invoke(EMPTY_BATCH)
        handler(EMPTY_BATCH, LambdaContext())
        for _ in range(args.warm):
            warm["runtime"].append(runtime_ms(environment))
            started = time.perf_counter()
            handler(EMPTY_BATCH, LambdaContext())
            warm["in process"].append((time.perf_counter() - started) * 1000)

    print(f"Handler on an empty batch; runtime at {args.memory} MB's CPU share, in process without a quota.")
    for label, samples in (("cold", cold), ("warm", warm)):
        for path, values in samples.items():
            print(f"  {label:<5} {path:<11} {summary(values)}")
        overhead = statistics.median(samples["runtime"]) - statistics.median(samples["in process"])
        print(f"  {label:<5} runtime overhead (difference of medians): {overhead:7.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
