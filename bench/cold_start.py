"""Cold start: import and initialisation time in fresh interpreters at Lambda's CPU share.

Each sample is a new process of the function's own Python (the Lambda venv's 3.12), started
inside a cgroup with the CPU quota of ``memory_mb`` before its first instruction, timing from
inside what a Lambda init phase runs before the first event: for this consumer, importing
``consumer.app`` and calling ``build_consumer()``; for Powertools, importing its idempotency
utility and creating the ``DynamoDBPersistenceLayer``; for the seed pattern, importing boto3
and creating a DynamoDB client; the floor, importing botocore and creating a DynamoDB client,
which any function that talks to DynamoDB pays. Interpreter start-up itself is the same for
all and left out. One untimed process per system first writes the bytecode caches, as a
deployed package's would already be in place.
"""

from __future__ import annotations

import os
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.systems import PowertoolsBaseline, SeedPattern, ThisConsumer
from bench.timing import median_ci
from local import cpu_quota
from local.aws import DUMMY_CREDENTIALS_ENV
from local.lambda_venv import venv_python
from testkit.lambda_sqs import REGION

REPO_ROOT = Path(__file__).resolve().parent.parent

BOTOCORE_FLOOR = "botocore floor"
# The child joins the cgroup itself, then execs Python: nothing it runs escapes the quota.
_IN_CGROUP = 'echo $$ > "$0" && exec "$@"'
INITIALISATION = {
    ThisConsumer.name: "import consumer.app; consumer.app.build_consumer()",
    PowertoolsBaseline.name: (
        "from aws_lambda_powertools.utilities.idempotency import"
        " DynamoDBPersistenceLayer, IdempotencyConfig, idempotent_function;"
        " DynamoDBPersistenceLayer(table_name='idempotency')"
    ),
    SeedPattern.name: "import boto3; boto3.session.Session().client('dynamodb')",
    BOTOCORE_FLOOR: "import botocore.session; botocore.session.get_session().create_client('dynamodb')",
}

_FUNCTION_ENVIRONMENT = {
    "IDEMPOTENCY_TABLE_NAME": "idempotency",
    "LEDGER_TABLE_NAME": "ledger",
    "DEAD_LETTER_QUEUE_URL": f"https://sqs.{REGION}.amazonaws.com/000000000000/dead-letters",
    "RECEIPT_WEBHOOK_URL": "http://127.0.0.1:9/receipts",
    "POWERTOOLS_SERVICE_NAME": "idempotent-consumer",
    "POWERTOOLS_METRICS_NAMESPACE": "IdempotentConsumer",
}


@dataclass(frozen=True)
class ColdStarts:
    seconds: dict[str, list[float]]
    # The CPU share's memory size; None where the machine allowed no quota.
    memory_mb: int | None

    def median_s(self, system: str) -> float:
        return statistics.median(self.seconds[system])

    def ci_s(self, system: str) -> tuple[float, float]:
        return median_ci(self.seconds[system])


def _timed_script(statement: str) -> str:
    return f"import time; started = time.perf_counter(); {statement}; print(time.perf_counter() - started)"


def _environment() -> dict[str, str]:
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith(("AWS_ENDPOINT_URL", "PYTHON"))
    }
    environment.update(DUMMY_CREDENTIALS_ENV)
    environment.update(_FUNCTION_ENVIRONMENT)
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "src"), str(REPO_ROOT)])
    return environment


def _one_process(statement: str, environment: dict[str, str], quota: cpu_quota.CpuQuota | None) -> float:
    command = [str(venv_python()), "-c", _timed_script(statement)]
    if quota is not None:
        command = ["/bin/sh", "-c", _IN_CGROUP, str(quota.path / "cgroup.procs"), *command]
    completed = subprocess.run(
        command,
        env=environment,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"cold start process failed: {completed.stderr.strip()[-2000:]}")
    return float(completed.stdout.strip().splitlines()[-1])


def measure_cold_starts(processes: int, memory_mb: int) -> ColdStarts:
    """``processes`` fresh processes per system, taking turns, each under ``memory_mb``'s CPU share."""
    environment = _environment()
    names = list(INITIALISATION)
    try:
        quota: cpu_quota.CpuQuota | None = cpu_quota.create(cpu_quota.unique_name("bench-cold"), memory_mb)
    except cpu_quota.CpuQuotaUnavailable:
        quota = None
    try:
        for name in names:
            _one_process(INITIALISATION[name], environment, quota)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        for index in range(processes):
            turn = index % len(names)
            for name in [*names[turn:], *names[:turn]]:
                seconds[name].append(_one_process(INITIALISATION[name], environment, quota))
    finally:
        if quota is not None:
            quota.remove()
    return ColdStarts(seconds, memory_mb if quota is not None else None)
