"""Cold start as Lambda starts a function: fresh Python 3.13 processes on the artifact of ``sam build``.

Init (the handler module's import) and first invocation (one new message of the timed handler), timed inside
each process at each CPU setting, the systems taking turns (methodology.md).
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
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.costs import Backend, Draws, timed_handler
from bench.timing import REPO_ROOT, function_variables, in_turns
from testkit import application, cpu_quota
from testkit.dynamodb_local import DynamoDBLocal
from testkit.lambda_sqs import REGION, sqs_event
from testkit.lambda_venv import find_python, venv_python

CONSUMER, POWERTOOLS, FLOOR = "this consumer", "Powertools", "botocore floor"
# The same functions with and without the build step's bytecode: what it saves, and what it does for Powertools.
NO_BYTECODE, POWERTOOLS_BYTECODE = "this consumer, no bytecode", "Powertools, with bytecode"
# This consumer traced (Tracing=on, every invocation sampled), and built and run on the previous runtime.
TRACED, PREVIOUS_RUNTIME, PREVIOUS_PYTHON = "this consumer, tracing on", "this consumer, Python 3.12", "3.12"
# Lambda's own (LAMBDA_SHARES): init unthrottled (methodology.md), then the process joins the share's cgroup.
FULL_CPU, LAMBDA_SHARES = 0, -1
# What each system's module runs at import, binding ``handler``: its init phase.
INIT_CODE = {
    CONSUMER: f"from {application.ENTRY} import handler",
    POWERTOOLS: (
        "from bench.systems import PowertoolsBaseline\nfrom consumer.config import Settings\n"
        "from consumer.handler import declared_tables\nfrom testkit import application\n"
        "handler = PowertoolsBaseline(Settings.from_env(tables=declared_tables(application.registered()))).handle"
    ),
    FLOOR: (
        "import os, botocore.session\nclient = botocore.session.get_session().create_client('dynamodb')\n"
        "handler = lambda event, context: client.put_item(TableName=os.environ['IDEMPOTENCY_TABLE_NAME'],"
        " Item={'id': {'S': event['Records'][0]['messageId']}}, ConditionExpression='attribute_not_exists(id)')"
    ),
}
INIT_CODE |= {NO_BYTECODE: INIT_CODE[CONSUMER], POWERTOOLS_BYTECODE: INIT_CODE[POWERTOOLS]}
INIT_CODE |= {TRACED: INIT_CODE[CONSUMER], PREVIOUS_RUNTIME: INIT_CODE[CONSUMER]}
PROFILED = (CONSUMER, NO_BYTECODE, POWERTOOLS, POWERTOOLS_BYTECODE, TRACED)
# Lambda's active tracing: the trace header of a sampled invocation, and the daemon's address (nothing listens).
_TRACED_ENV = {
    "TRACING": "true",
    "_X_AMZN_TRACE_ID": "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
    "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:9",
}

# The driver's own imports come before the clock starts; the system's code runs between the marks.
_DRIVER = """
import json, os, sys, time
from testkit.lambda_sqs import LambdaContext
from testkit import application
event, context, namespace = json.loads(sys.argv[1]), LambdaContext(), {}
sys.stderr.write("started\\n")
started = time.perf_counter()
exec(sys.argv[2], namespace)
initialised = time.perf_counter()
sys.stderr.write("initialised\\n")
if sys.argv[3]:
    open(sys.argv[3], "w").write(str(os.getpid()))  # into the share's cgroup, all threads with it
answer, done = namespace["handler"](event, context), time.perf_counter()
print(json.dumps([initialised - started, done - initialised, len(answer.get("batchItemFailures") or [])]))
"""
_IN_CGROUP = 'echo $$ > "$0" && exec "$@"'  # the child joins the cgroup, then execs Python: all of it is under quota
_WARM_UP_ROUNDS = 3
_HOST_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine().lower()]


@dataclass
class ColdStarts:
    # (memory MB or FULL_CPU, system) -> seconds, one entry per fresh process, in order
    init_s: dict[tuple[int, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    first_s: dict[tuple[int, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    # system -> import group -> own import time in ms at full CPU, median over processes (python -X importtime)
    import_ms: dict[str, dict[str, float]] = field(default_factory=dict)

    def total_s(self, share: int, system: str) -> list[float]:
        pairs = zip(self.init_s[share, system], self.first_s[share, system], strict=True)
        return [init + first for init, first in pairs]


def _run(what: str, command: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    answer = subprocess.run(command, capture_output=True, text=True, check=False, **options)
    if answer.returncode != 0:
        raise RuntimeError(f"{what} failed: {(answer.stderr or answer.stdout).strip()[-2000:]}")
    return answer


@contextmanager
def artifacts() -> Iterator[dict[str, list[Path]]]:
    """Each system's code path: ``sam build``'s artifact (for this machine), SAM's pip builder's, Lambda's runtime."""
    python = find_python()
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as work:
        built, unpacked = Path(work) / "sam", Path(work) / "pip"
        environment = {**os.environ, "PATH": f"{python.parent}:{os.environ['PATH']}", "FUNCTION_ARCH": _HOST_ARCH}
        sam = [str(REPO_ROOT / ".venv-sam" / "bin" / "sam"), "build", "--no-cached", "--build-dir", str(built)]
        _run("sam build", [*sam, "--template-file", str(REPO_ROOT / "template.yaml")], env=environment)
        # The previous runtime's artifact: the build's own recipe (sam build runs it in a copy of src/), on 3.12.
        previous, older = Path(work) / "previous", find_python(PREVIOUS_PYTHON)
        make = ["make", "-s", "-f", str(REPO_ROOT / "Makefile"), "build-ConsumerFunction", f"ARTIFACTS_DIR={previous}"]
        older_env = {**environment, "PATH": f"{older.parent}:{os.environ['PATH']}"}
        _run("the 3.12 build", [*make, f"FUNCTION_PYTHON={PREVIOUS_PYTHON}"], env=older_env, cwd=REPO_ROOT / "src")
        # SAM's pip builder unpacks the wheels and compiles nothing: what a function without a build step ships.
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
        _run("pip install", [*pip, "--target", str(unpacked), "-r", str(REPO_ROOT / "src" / "requirements.txt")])
        cached = shutil.ignore_patterns("__pycache__")
        for package in ("consumer", application.PACKAGE):  # the core and the application, as the artifact holds them
            shutil.copytree(REPO_ROOT / "src" / package, unpacked / package, ignore=cached)
        # The floor's botocore is the runtime's, compiled, as Lambda's runtime ships it. The Powertools function's
        # own code (bench.systems) and the driver come from the repository.
        yield {
            CONSUMER: [built / "ConsumerFunction", REPO_ROOT],
            NO_BYTECODE: [unpacked, REPO_ROOT],
            POWERTOOLS: [unpacked, REPO_ROOT],
            POWERTOOLS_BYTECODE: [built / "ConsumerFunction", REPO_ROOT],
            FLOOR: [REPO_ROOT],
            TRACED: [built / "ConsumerFunction", REPO_ROOT],
            PREVIOUS_RUNTIME: [previous, REPO_ROOT],
        }


@dataclass(frozen=True)
class _Starts:
    pythons: dict[str, Path]
    paths: dict[str, list[Path]]
    environments: dict[str, dict[str, str]]
    quota: cpu_quota.CpuQuota | None
    draws: Draws

    def start(self, system: str, share: int = FULL_CPU, *, importtime: bool = False) -> tuple[float, float, str]:
        """One cold start of ``system`` at ``share``: its init and first invocation in seconds, and its stderr."""
        event = json.dumps(sqs_event(self.draws.bodies(1)))
        procs = str(self.quota.path / "cgroup.procs") if self.quota is not None and share != FULL_CPU else ""
        python = [str(self.pythons.get(system, self.pythons[CONSUMER])), *(["-X", "importtime"] if importtime else [])]
        command = [*python, "-c", _DRIVER, event, INIT_CODE[system], procs * (share == LAMBDA_SHARES)]
        if procs and share != LAMBDA_SHARES:
            command = ["/bin/sh", "-c", _IN_CGROUP, procs, *command]
        variables = {**self.environments[system], "PYTHONPATH": os.pathsep.join(map(str, self.paths[system]))}
        task_root = self.paths[system][0]  # the first entry of sys.path, as in Lambda
        answer = _run(f"{system}: a cold start", command, env=variables, cwd=task_root, timeout=120)
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
            groups["imported by the floor too" if name in floor_modules else name.split(".")[0]] += int(own_us) / 1000
    return dict(groups)


def measure_cold_starts(processes: int, memory_mb: int, profiles: int = 5) -> ColdStarts:
    """``processes`` cold starts per system and share, taking turns; then ``profiles`` under -X importtime."""
    results, inherited = ColdStarts(), {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON"))}
    with ExitStack() as stack:
        paths, server = stack.enter_context(artifacts()), stack.enter_context(DynamoDBLocal())
        quota: cpu_quota.CpuQuota | None = None
        try:
            quota = cpu_quota.create(cpu_quota.unique_name("bench-cold"), memory_mb)
            stack.callback(quota.remove)
        except cpu_quota.CpuQuotaUnavailable as error:
            print(f"cold starts at {memory_mb} MB run without a quota: {error}", file=sys.stderr)
        backend = Backend(server.client(), f"https://sqs.{REGION}.amazonaws.com/000000000000/unused")
        settings = [backend.settings(f"cold-{number}", "http://127.0.0.1:9/unused") for number in range(len(INIT_CODE))]
        environments = {
            system: {
                **inherited,
                **function_variables(settings[number]),
                "AWS_LAMBDA_FUNCTION_NAME": "ColdStart",
                # Straight to DynamoDB Local: the conflict proxy's hold on transactions is not a cold start's.
                "AWS_ENDPOINT_URL_DYNAMODB": server.direct_endpoint_url,
                "PYTHONDONTWRITEBYTECODE": "1",  # /var/task is read-only
            }
            for number, system in enumerate(INIT_CODE)
        }
        handler = timed_handler()
        draws = Draws(handler, lambda payloads: backend.seed(settings, handler, payloads))
        environments[TRACED] |= _TRACED_ENV
        pythons = {CONSUMER: venv_python(), PREVIOUS_RUNTIME: venv_python(PREVIOUS_PYTHON)}
        starts = _Starts(pythons, paths, environments, quota, draws)
        for _ in range(_WARM_UP_ROUNDS):  # untimed: DynamoDB Local's JVM compiles its paths for each table
            for system in INIT_CODE:
                starts.start(system)
        for index in range(processes):
            for share in (FULL_CPU, memory_mb, LAMBDA_SHARES):
                for system in in_turns(list(INIT_CODE), index):
                    init_s, first_s, _ = starts.start(system, share)
                    results.init_s[share, system].append(init_s)
                    results.first_s[share, system].append(first_s)
        floor_lines = starts.start(FLOOR, importtime=True)[2].splitlines()
        floor_modules = {line.rsplit("|", 1)[1].strip() for line in floor_lines if line.startswith("import time:")}
        runs = {system: [starts.start(system, importtime=True)[2] for _ in range(profiles)] for system in PROFILED}
    for system, stderrs in runs.items():
        groups = [import_groups(stderr, floor_modules) for stderr in stderrs]
        names = {name for run in groups for name in run}
        medians = {name: statistics.median(run.get(name, 0.0) for run in groups) for name in names}
        results.import_ms[system] = {name: ms for name, ms in medians.items() if ms >= 1}
    return results
