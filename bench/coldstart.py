"""Cold start as Lambda starts a function: a fresh Python 3.12 process per start, from the artifact of ``sam build``.

Each process imports the system's handler module (what Lambda's Init Duration times) and answers one new
payment against DynamoDB Local (its first invocation), both timed inside it, at full CPU and at the 512 MB
share, the systems taking turns. ``python -m bench --only cold-start`` runs this alone. See methodology.md.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.costs import Backend
from bench.systems import settings_environment
from bench.timing import POWERTOOLS_ENV, REPO_ROOT, in_turns
from testkit import cpu_quota
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.dynamodb_local import DynamoDBLocal
from testkit.lambda_sqs import REGION, sqs_event
from testkit.lambda_venv import find_python, venv_python
from testkit.messages import MessageFactory

CONSUMER, POWERTOOLS, FLOOR = "this consumer", "Powertools", "botocore floor"
# The same functions with and without the build step's bytecode: what it saves, and what it does for Powertools.
NO_BYTECODE, POWERTOOLS_BYTECODE = "this consumer, no bytecode", "Powertools, with bytecode"
FULL_CPU = 0  # no quota: the process has the machine
# Lambda's own: the init phase unthrottled (methodology.md), the process joins the share's cgroup before its invocation.
LAMBDA_SHARES = -1
# What each system's module runs at import, binding ``handler``: its init phase.
INIT_CODE = {
    CONSUMER: "from consumer.app import handler",
    POWERTOOLS: (
        "from bench.systems import PowertoolsBaseline\nfrom consumer.config import Settings\n"
        "handler = PowertoolsBaseline(Settings.from_env()).handle"
    ),
    FLOOR: (
        "import os, botocore.session\nclient = botocore.session.get_session().create_client('dynamodb')\n"
        "def handler(event, context):\n"
        "    for record in event['Records']:\n"
        "        client.put_item(TableName=os.environ['IDEMPOTENCY_TABLE_NAME'],"
        " Item={'id': {'S': record['messageId']}}, ConditionExpression='attribute_not_exists(id)')"
    ),
}
INIT_CODE |= {NO_BYTECODE: INIT_CODE[CONSUMER], POWERTOOLS_BYTECODE: INIT_CODE[POWERTOOLS]}
# The driver's own imports come before the clock starts; the system's code runs between the marks.
_DRIVER = """
import json, os, sys, time
from testkit.lambda_sqs import LambdaContext
event, context, namespace = json.loads(sys.argv[1]), LambdaContext(), {}
sys.stderr.write("started\\n")
started = time.perf_counter()
exec(sys.argv[2], namespace)
initialised = time.perf_counter()
sys.stderr.write("initialised\\n")
if sys.argv[3]:
    with open(sys.argv[3], "w") as procs:
        procs.write(str(os.getpid()))
answer = namespace["handler"](event, context) or {}
done = time.perf_counter()
print(json.dumps([initialised - started, done - initialised, len(answer.get("batchItemFailures") or [])]))
"""
_IN_CGROUP = 'echo $$ > "$0" && exec "$@"'  # the child joins the cgroup, then execs Python: all of it is under quota
_WARM_UP_ROUNDS = 3
_UNUSED_QUEUE_URL = f"https://sqs.{REGION}.amazonaws.com/000000000000/bench-cold-unused"
_HOST_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine().lower()]


@dataclass
class ColdStarts:
    # (memory MB or FULL_CPU, system) -> seconds, one entry per fresh process, in order
    init_s: dict[tuple[int, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    first_s: dict[tuple[int, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    # system -> import group -> own import time in ms at full CPU, median over processes (python -X importtime)
    import_ms: dict[str, dict[str, float]] = field(default_factory=dict)

    def total_s(self, share: int, system: str) -> list[float]:
        return [
            init + first for init, first in zip(self.init_s[share, system], self.first_s[share, system], strict=True)
        ]


def _run(command: list[str], **options: object) -> str:
    answer = subprocess.run(command, capture_output=True, text=True, check=False, **options)  # type: ignore[call-overload]
    if answer.returncode != 0:
        raise RuntimeError(f"`{' '.join(command[:4])} ...` failed: {(answer.stderr or answer.stdout).strip()[-2000:]}")
    return str(answer.stdout) + str(answer.stderr)


@contextmanager
def artifacts() -> Iterator[dict[str, list[Path]]]:
    """Each system's code path: ``sam build``'s artifact (for this machine), SAM's pip builder's, Lambda's runtime."""
    python = find_python()
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as work:
        built, unpacked, compiled = Path(work) / "sam", Path(work) / "pip", Path(work) / "compiled"
        environment = {**os.environ, "PATH": f"{python.parent}:{os.environ['PATH']}", "FUNCTION_ARCH": _HOST_ARCH}
        sam = [str(REPO_ROOT / ".venv-sam" / "bin" / "sam"), "build", "--no-cached", "--build-dir", str(built)]
        _run([*sam, "--template-file", str(REPO_ROOT / "template.yaml"), "ConsumerFunction"], cwd=work, env=environment)
        # SAM's pip builder unpacks the wheels and compiles nothing: what a function without a build step ships.
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
        _run([*pip, "--target", str(unpacked), "-r", str(REPO_ROOT / "src" / "requirements.txt")])
        for package in (REPO_ROOT / "src" / "consumer", REPO_ROOT / "bench", REPO_ROOT / "testkit"):
            skipped = shutil.ignore_patterns("__pycache__", "*.png", "java")
            shutil.copytree(package, unpacked / package.name, ignore=skipped)
            if package.name != "consumer":  # the Powertools function's own code, compiled as the build step does
                shutil.copytree(package, compiled / package.name, ignore=skipped)
        _run([str(python), "-m", "compileall", "-q", "--invalidation-mode", "checked-hash", str(compiled)])
        # The floor's botocore is the runtime's, compiled, as Lambda's own runtime ships it; REPO_ROOT for the driver.
        yield {
            CONSUMER: [built / "ConsumerFunction", REPO_ROOT],
            NO_BYTECODE: [unpacked, REPO_ROOT],
            POWERTOOLS: [unpacked, REPO_ROOT],
            POWERTOOLS_BYTECODE: [built / "ConsumerFunction", compiled, REPO_ROOT],
            FLOOR: [REPO_ROOT],
        }


def fresh_process(
    python: Path,
    system: str,
    path: list[Path],
    environment: Mapping[str, str],
    *,
    quota: cpu_quota.CpuQuota | None = None,
    init_unthrottled: bool = False,
    importtime: bool = False,
) -> tuple[float, float, str]:
    """One cold start of ``system``: its init and first invocation in seconds, and its stderr."""
    event = json.dumps(sqs_event(MessageFactory().payments(1)))
    procs = str(quota.path / "cgroup.procs") if quota is not None and init_unthrottled else ""
    command = [
        str(python),
        *(["-X", "importtime"] if importtime else []),
        "-c",
        _DRIVER,
        event,
        INIT_CODE[system],
        procs,
    ]
    if quota is not None and not init_unthrottled:
        command = ["/bin/sh", "-c", _IN_CGROUP, str(quota.path / "cgroup.procs"), *command]
    variables = {**environment, "PYTHONPATH": os.pathsep.join(map(str, path))}
    answer = subprocess.run(
        command, env=variables, cwd=path[0], capture_output=True, text=True, timeout=120, check=False
    )
    if answer.returncode != 0:
        raise RuntimeError(f"{system}: a cold start failed: {answer.stderr.strip()[-2000:]}")
    init_s, first_s, failed = json.loads(answer.stdout.strip().splitlines()[-1])
    if failed:
        raise RuntimeError(f"{system}: its first invocation reported its record failed")
    return init_s, first_s, answer.stderr


def import_groups(stderr: str, floor_modules: set[str]) -> dict[str, float]:
    """Own import time (ms) of the init's modules by top-level package; what the floor imports too in one group."""
    groups: defaultdict[str, float] = defaultdict(float)
    for line in stderr.split("started\n", 1)[-1].split("initialised\n", 1)[0].splitlines():
        if line.startswith("import time:") and "self [us]" not in line:
            own_us, _, module = line.removeprefix("import time:").split("|")
            name = module.strip()
            group = "imported by the floor too" if name in floor_modules else name.split(".")[0]
            groups[group] += int(own_us) / 1000
    return dict(groups)


def _modules(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def measure_cold_starts(processes: int, memory_mb: int, profiles: int = 5) -> ColdStarts:
    """``processes`` cold starts per system and share, taking turns; then ``profiles`` under -X importtime."""
    python, results = venv_python(), ColdStarts()
    inherited = {name: value for name, value in os.environ.items() if not name.startswith(("AWS_", "PYTHON"))}
    with artifacts() as paths, DynamoDBLocal() as server:
        backend = Backend(server.client(), _UNUSED_QUEUE_URL)
        environments = {
            system: {
                **inherited,
                **DUMMY_CREDENTIALS_ENV,
                **settings_environment(backend.settings(f"cold-{number}", "http://127.0.0.1:9/receipts")),
                **POWERTOOLS_ENV,
                "POWERTOOLS_LOG_LEVEL": "INFO",
                # Straight to DynamoDB Local: the conflict proxy's hold on transactions is not a cold start's.
                "AWS_ENDPOINT_URL_DYNAMODB": server.direct_endpoint_url,
                "PYTHONDONTWRITEBYTECODE": "1",  # /var/task is read-only
                "AWS_LAMBDA_FUNCTION_NAME": "ColdStart",
            }
            for number, system in enumerate(INIT_CODE)
        }
        try:
            quota: cpu_quota.CpuQuota | None = cpu_quota.create(cpu_quota.unique_name("bench-cold"), memory_mb)
        except cpu_quota.CpuQuotaUnavailable as error:
            print(f"cold starts at {memory_mb} MB run without a quota: {error}", file=sys.stderr)
            quota = None
        try:
            for _ in range(_WARM_UP_ROUNDS):  # untimed: DynamoDB Local's JVM compiles its paths for each table
                for system in INIT_CODE:
                    fresh_process(python, system, paths[system], environments[system])
            for index in range(processes):
                for share, limit in ((FULL_CPU, None), (memory_mb, quota), (LAMBDA_SHARES, quota)):
                    for system in in_turns(list(INIT_CODE), index):
                        init_s, first_s, _ = fresh_process(
                            python,
                            system,
                            paths[system],
                            environments[system],
                            quota=limit,
                            init_unthrottled=share == LAMBDA_SHARES,
                        )
                        results.init_s[share, system].append(init_s)
                        results.first_s[share, system].append(first_s)
        finally:
            if quota is not None:
                quota.remove()
        runs: defaultdict[str, list[dict[str, float]]] = defaultdict(list)
        floor_modules = _modules(fresh_process(python, FLOOR, paths[FLOOR], environments[FLOOR], importtime=True)[2])
        for _ in range(profiles):
            for system in (CONSUMER, NO_BYTECODE, POWERTOOLS, POWERTOOLS_BYTECODE):
                stderr = fresh_process(python, system, paths[system], environments[system], importtime=True)[2]
                runs[system].append(import_groups(stderr, floor_modules))
    for system, groups in runs.items():
        names = {name for run in groups for name in run}
        results.import_ms[system] = {name: statistics.median(run.get(name, 0.0) for run in groups) for name in names}
    return results
