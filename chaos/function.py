"""The function under test as the pollers see it: Lambda runtimes that crash, restart and run out of time.

One execution environment per poller (``testkit.lambda_runtime.LambdaEnvironment``: the
Runtime Interface Emulator and awslambdaric under Lambda's CPU share), as Lambda has one
per concurrent invocation. Its handler is ``chaos.runtime_handler``, which builds the
consumer with ``consumer.app.wire`` from a session carrying the fault hooks and a skewed
clock, and reads its fault plan from the environment's variables. A crash kills the
runtime process; the emulator reports the invocation as failed and the next one
cold-starts a new runtime.

The runtime's task root is a directory of links standing for the deployment package: the
consumer (``src/consumer``) and the packages the fault plan needs (``chaos``, ``local``,
``testkit``, ``tests`` for the negative controls' consumers).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from chaos import journal
from chaos.faults import FaultKind, FaultLog
from chaos.runtime_handler import PlanVariable
from consumer.config import Settings
from testkit.invocation import Invocation
from testkit.lambda_runtime import LambdaEnvironment, check_handler
from testkit.lambda_venv import venv_python
from testkit.resources import FunctionSpec
from testkit.template import REPO_ROOT


class Consumer(Protocol):
    def process(self, records: Any, remaining_ms: Callable[[], int]) -> Any:
        """A batch result with ``response()`` and, ideally, ``results`` (one per record)."""


class ConsumerFactory(Protocol):
    def __call__(
        # ``Any``: the container's boto3 session, which ``consumer.app.wire`` types by what it uses of it.
        self,
        settings: Settings,
        session: Any,
        *,
        clock: Callable[[], float],
    ) -> Consumer: ...


@dataclass
class InvocationHistory:
    """What every invocation of every execution environment did; thread-safe.

    The poller's side (``started``, ``answered``, ``crashed_invocation``) is recorded as it
    happens; the runtime's side (cold starts, each record's outcome) is replayed from the
    journals once the run is over.
    """

    invocations: int = 0
    crashed: int = 0
    containers: int = 0
    redelivered_records: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    conflicts_absorbed: int = 0
    # messageId -> outcomes of its deliveries that reached a result, with the reason.
    results: defaultdict[str, list[tuple[str, str | None]]] = field(default_factory=lambda: defaultdict(list))
    # batchItemFailures ids that were not ids of the invocation's batch.
    foreign_failure_ids: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def started(self, records: list[dict[str, Any]]) -> None:
        redelivered = sum(
            1 for record in records if int((record.get("attributes") or {}).get("ApproximateReceiveCount", "1")) > 1
        )
        with self._lock:
            self.invocations += 1
            self.redelivered_records += redelivered

    def crashed_invocation(self) -> None:
        with self._lock:
            self.crashed += 1

    def answered(self, response: Any, records: list[dict[str, Any]]) -> None:
        batch_ids = {record["messageId"] for record in records}
        failures = response.get("batchItemFailures", []) if isinstance(response, Mapping) else []
        foreign = [
            str(failure.get("itemIdentifier")) for failure in failures if failure.get("itemIdentifier") not in batch_ids
        ]
        with self._lock:
            self.foreign_failure_ids.extend(foreign)

    def replay(self, entries: Iterable[dict[str, Any]]) -> None:
        """Add the cold starts and record results of journal ``entries``."""
        with self._lock:
            for entry in entries:
                if entry.get("event") == "init":
                    self.containers += 1
                elif entry.get("event") == "results":
                    for message_id, outcome, reason, absorbed in entry["results"]:
                        self.outcomes[outcome] += 1
                        self.conflicts_absorbed += int(absorbed)
                        self.results[message_id].append((outcome, reason))


# What the emulator reports when the runtime process exits during an invocation.
_EXIT_ERROR = "Runtime.ExitError"
_PACKAGES = {
    "consumer": REPO_ROOT / "src" / "consumer",
    **{name: REPO_ROOT / name for name in ("chaos", "local", "testkit", "tests")},
}


@dataclass(frozen=True)
class FaultPlan:
    """What every execution environment of the run shares."""

    settings: Settings
    consumer_factory: ConsumerFactory
    rates: Mapping[FaultKind, float]
    max_skew_ms: int
    max_paused: int
    max_pause_s: float
    deadline_margin_ms: int


class ChaosFunction:
    """One poller's execution environment, and what the poller sees of its invocations."""

    def __init__(self, environment: LambdaEnvironment, history: InvocationHistory) -> None:
        self._environment = environment
        self._history = history

    @property
    def function(self) -> FunctionSpec:
        return self._environment.function

    def invoke(self, event: dict[str, Any]) -> Invocation:
        records = event["Records"]
        self._history.started(records)
        invocation = self._environment.invoke(event)
        if invocation.error_type == _EXIT_ERROR:
            self._history.crashed_invocation()
        elif invocation.succeeded:
            self._history.answered(invocation.response, records)
        return invocation


def _reference(factory: ConsumerFactory) -> str:
    """``module:callable``, for the runtime to import."""
    return f"{factory.__module__}:{getattr(factory, '__qualname__', '')}"


@contextmanager
def chaos_functions(
    function: FunctionSpec,
    environment: Mapping[str, str],
    plan: FaultPlan,
    seeds: list[int],
    history: InvocationHistory,
    log: FaultLog,
) -> Iterator[list[ChaosFunction]]:
    """One started environment per seed; on the way out, stopped, and their journals replayed
    into ``history`` and ``log``."""
    run_dir = Path(tempfile.mkdtemp(prefix="chaos-run-"))
    environments: list[LambdaEnvironment] = []
    try:
        task_root, slots = run_dir / "task", run_dir / "pause-slots"
        task_root.mkdir()
        slots.mkdir()
        for name, source in _PACKAGES.items():
            (task_root / name).symlink_to(source, target_is_directory=True)
        packaged = replace(function, handler="chaos.runtime_handler.handler", code_dir=task_root)
        shared = {
            **environment,
            "PYTHONPATH": str(task_root),
            PlanVariable.SETTINGS: plan.settings.model_dump_json(),
            PlanVariable.RATES: json.dumps({kind.value: rate for kind, rate in plan.rates.items()}),
            PlanVariable.MAX_SKEW_MS: str(plan.max_skew_ms),
            PlanVariable.PAUSE_SLOTS: str(slots),
            PlanVariable.MAX_PAUSED: str(plan.max_paused),
            PlanVariable.MAX_PAUSE_S: str(plan.max_pause_s),
            PlanVariable.DEADLINE_MARGIN_MS: str(plan.deadline_margin_ms),
            PlanVariable.CONSUMER: _reference(plan.consumer_factory),
        }
        python = venv_python()
        check_handler(packaged, shared, python)
        for index, seed in enumerate(seeds):
            variables = {
                **shared,
                PlanVariable.SEED: str(seed),
                PlanVariable.JOURNAL: str(run_dir / f"env-{index}.jsonl"),
            }
            environments.append(LambdaEnvironment(packaged, variables, python=python, name=f"chaos-{index}").start())
        yield [ChaosFunction(environment, history) for environment in environments]
    finally:
        for started in environments:
            started.stop()
        entries = list(journal.read(sorted(run_dir.glob("env-*.jsonl"))))
        history.replay(entries)
        log.replay(entries)
        shutil.rmtree(run_dir, ignore_errors=True)
