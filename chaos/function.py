"""The function under test as the pollers see it: containers that crash, restart and run out of time.

``ChaosFunction`` stands where ``local.function_runtime.FunctionRuntime`` stands for
``local.poller.Poller`` (``invoke(event) -> Invocation``, ``function``), but builds its
consumer with ``consumer.app.wire`` from its own session and clock, so faults and
clock skew reach the real code path. One ``ChaosFunction`` per poller: one warm
container per concurrent invocation, as Lambda has. A crash kills the container; the
next invocation starts a new one (a cold start, with a new clock skew).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from chaos.faults import ContainerFaults, FaultKind, FaultLog, InvocationCrashed, Zombies
from chaos.transport_faults import install_faults
from consumer.config import Settings
from local.aws import session as local_session
from local.invocation import Invocation
from local.resources import FunctionSpec
from testkit.lambda_sqs import LambdaContext


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
    """What every invocation of every container did; thread-safe."""

    invocations: int = 0
    crashed: int = 0
    containers: int = 0
    redelivered_records: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
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

    def container_started(self) -> None:
        with self._lock:
            self.containers += 1

    def crashed_invocation(self) -> None:
        with self._lock:
            self.crashed += 1

    def finished(self, batch: Any, records: list[dict[str, Any]]) -> None:
        batch_ids = {record["messageId"] for record in records}
        response = batch.response()
        foreign = [
            str(failure.get("itemIdentifier"))
            for failure in response.get("batchItemFailures", [])
            if failure.get("itemIdentifier") not in batch_ids
        ]
        with self._lock:
            for result in getattr(batch, "results", ()):
                self.outcomes[str(result.outcome)] += 1
                self.results[result.message_id].append((str(result.outcome), result.reason))
            self.foreign_failure_ids.extend(foreign)


@dataclass(frozen=True)
class ContainerSetup:
    """What every container of the run shares."""

    settings: Settings
    consumer_factory: ConsumerFactory
    rates: Mapping[FaultKind, float]
    log: FaultLog
    zombies: Zombies
    max_skew_ms: int


class Container:
    """One execution environment: its session (with the fault hooks), its clock, its consumer."""

    def __init__(self, setup: ContainerSetup, rng: random.Random) -> None:
        self.faults = ContainerFaults(
            setup.rates, random.Random(rng.random()), setup.log, setup.settings.idempotency_table_name, setup.zombies
        )
        self.skew_s = rng.uniform(-setup.max_skew_ms, setup.max_skew_ms) / 1000
        session = local_session()
        install_faults(session, self.faults, services=("dynamodb", "sqs"))
        self.consumer = setup.consumer_factory(setup.settings, session, clock=self.clock)

    def clock(self) -> float:
        return time.time() + self.skew_s


class ChaosFunction:
    """Invoked by one poller; answers as the function would, or dies trying."""

    def __init__(
        self,
        function: FunctionSpec,
        setup: ContainerSetup,
        history: InvocationHistory,
        rng: random.Random,
        deadline_margin_ms: int,
    ) -> None:
        self.function = function
        self._setup = setup
        self._history = history
        self._rng = rng
        self._deadline_margin_ms = deadline_margin_ms
        self._container = self._start_container()

    def _start_container(self) -> Container:
        self._history.container_started()
        return Container(self._setup, self._rng)

    def _timeout_s(self) -> float:
        """The function's Timeout; or, for a deadline fault, one that runs out partway through the batch."""
        if self._rng.random() < self._setup.rates.get(FaultKind.DEADLINE, 0.0):
            self._setup.log.add(FaultKind.DEADLINE)
            return (self._deadline_margin_ms + self._rng.uniform(0, 400)) / 1000
        return float(self.function.timeout_s)

    def invoke(self, event: dict[str, Any]) -> Invocation:
        context = LambdaContext(
            function_name=self.function.name,
            invoked_function_arn=self.function.arn,
            memory_limit_in_mb=self.function.memory_mb,
            timeout_s=self._timeout_s(),
        )
        records = event["Records"]
        self._history.started(records)
        started = time.monotonic()
        response: Any = None
        error: BaseException | None = None
        try:
            batch = self._container.consumer.process(records, context.get_remaining_time_in_millis)
            response = batch.response()
            self._history.finished(batch, records)
        except InvocationCrashed as crash:
            # Lambda reports the dead invocation as an error; the next one gets a new container.
            self._history.crashed_invocation()
            self._container = self._start_container()
            error = RuntimeError(f"invocation crashed: {crash}")
        except Exception as raised:
            error = raised
        return Invocation(response, error, context.timed_out(), time.monotonic() - started, context.aws_request_id)
