"""Batch wall time and CPU per record at Lambda's CPU share, the systems taking turns, each a Lambda function of its
own at the memory size measured, its clocks read inside it (``bench.function``); rounds, intervals: methodology.md."""

from __future__ import annotations

import io
import itertools
import json
import math
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.systems import settings_environment
from consumer.config import Settings
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.lambda_runtime import LambdaEnvironment, LambdaFleet
from testkit.lambda_sqs import sqs_event
from testkit.resources import FunctionSpec

REPO_ROOT = Path(__file__).resolve().parent.parent


def median_ci(values: Sequence[float]) -> tuple[float, float]:
    """Distribution-free 95% interval of the median: the largest ``k`` with P(B < k) <= 2.5%, B binomial(n, 1/2), gives
    [x_(k), x_(n+1-k)] (1-based); exact binomial sums, so it holds for the small ``n`` where a normal approximation
    does not."""
    ordered = sorted(values)
    n = len(ordered)
    if n < 6:
        return ordered[0], ordered[-1]
    below = itertools.accumulate(math.comb(n, i) / 2**n for i in range(n + 1))  # P(B <= i)
    k = max(1, next(i for i, probability in enumerate(below) if probability > 0.025))
    return ordered[k - 1], ordered[n - k]


@dataclass
class Samples:
    wall_s: list[float] = field(default_factory=list)
    record_cpu_s: list[float] = field(default_factory=list)  # each batch's CPU per record
    botocore_cpu_s: list[float] = field(default_factory=list)  # of which botocore's, in its DynamoDB calls
    server_s: list[float] = field(default_factory=list)  # each batch's time at DynamoDB's end (probe.server_s)
    calls: list[int] = field(default_factory=list)  # each batch's DynamoDB calls (probe.calls)
    # The cgroup's own count of time its processes waited for quota, over the timed batches.
    throttled_s: float = 0.0
    throttled_periods: int = 0

    @property
    def median_s(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def ci_s(self) -> tuple[float, float]:
        return median_ci(self.wall_s)

    @property
    def cpu_per_record_s(self) -> float:
        return statistics.median(self.record_cpu_s)

    @property
    def throttled_per_batch_s(self) -> float:
        return self.throttled_s / len(self.wall_s)


def in_turns(names: Sequence[str], repetition: int) -> list[str]:
    """Every system once, each repetition starting one further: a slow moment of the machine is shared out."""
    turn = repetition % len(names)
    return [*names[turn:], *names[:turn]]


def _throttling(function: LambdaEnvironment) -> tuple[int, float]:
    """Periods in which the function's cgroup ran out of quota, and the time it waited: (0, 0.0) without one."""
    if function.quota is None:
        return 0, 0.0
    fields = dict(line.split() for line in (function.quota.path / "cpu.stat").read_text().splitlines())
    # cgroup v1 counts throttled_time in ns, v2 throttled_usec in us.
    if "throttled_time" in fields:
        return int(fields["nr_throttled"]), int(fields["throttled_time"]) / 1e9
    return int(fields["nr_throttled"]), int(fields["throttled_usec"]) / 1e6


def bench_function(memory_mb: int) -> FunctionSpec:
    """The benchmark's handler, the repository as its code, as a Lambda function of ``memory_mb``."""
    return FunctionSpec(
        logical_id="BenchFunction",
        name="bench-function",
        arn="arn:aws:lambda:us-east-1:123456789012:function:bench-function",
        handler="bench.function.handler",
        code_dir=REPO_ROOT,
        timeout_s=120,
        memory_mb=memory_mb,
    )


@contextmanager
def system_functions(
    environments: Mapping[str, Mapping[str, str]], memory_mb: int
) -> Iterator[dict[str, LambdaEnvironment]]:
    """One warm execution environment per system (name -> its function's variables) at ``memory_mb``."""
    with ExitStack() as stack:
        functions = {}
        for name, variables in environments.items():
            log = _LastLog()
            fleet = LambdaFleet(bench_function(memory_mb), variables, memory_mb=memory_mb, log_sink=log)
            functions[name] = stack.enter_context(fleet).add()
            _logs[functions[name]] = log
        yield functions


class _LastLog(io.StringIO):
    """What a function logged during its last invocation (the runtime writes each invocation's log at once)."""

    def write(self, text: str) -> int:
        self.seek(0)
        self.truncate()
        return super().write(text)


_logs: dict[LambdaEnvironment, _LastLog] = {}


def _why_failed(function: LambdaEnvironment) -> str:
    """The warnings and errors the function logged (the consumer's outcome and reason per message)."""
    lines = [json.loads(line) for line in _logs[function].getvalue().splitlines() if line.startswith("{")]
    return "; ".join(
        " ".join(str(line[k]) for k in ("message", "idempotency_key", "error_type", "reason") if k in line)
        for line in lines
        if line.get("level") in ("WARNING", "ERROR")
    )


def invoke(function: LambdaEnvironment, bodies: list[str], latency_ms: float) -> dict[str, Any]:
    invocation = function.invoke({"latency_ms": latency_ms, "event": sqs_event(bodies)})
    if not invocation.succeeded:
        raise RuntimeError(f"{function.name}: the invocation failed: {invocation.error or 'timed out'}")
    answer: dict[str, Any] = invocation.response
    if answer["failed"]:
        raise RuntimeError(f"{function.name}: {answer['failed']} of {len(bodies)} failed: {_why_failed(function)}")
    return answer


@dataclass(frozen=True)
class Turn:
    """One function's part in a timed run: the batches it is given and the figure its precision is aimed at."""

    function: LambdaEnvironment
    batch: Callable[[], list[str]]
    aim: Callable[[Samples], list[float]] = lambda samples: samples.wall_s


def time_batches(
    functions: Mapping[str, LambdaEnvironment], batch: Callable[[], list[str]], latency_ms: float, limits: Any
) -> dict[str, Samples]:
    """Samples per system, each given the same kind of batch, aimed at the wall time (``time_turns``)."""
    return time_turns({name: Turn(function, batch) for name, function in functions.items()}, latency_ms, limits)


def time_turns(turns: Mapping[str, Turn], latency_ms: float, limits: Any) -> dict[str, Samples]:
    """Samples per turn: each repetition runs every turn once on fresh records, in turn, so that a slow moment of the
    machine is shared out and a ratio of two turns is read within one stretch of time, not across two; ``limits``,
    the command line's ``min_repetitions``, ``max_repetitions`` and ``precision``, which each turn's ``aim`` says of
    which figure (a CPU target aims at its CPU figure, whose spread is its own)."""
    for turn in turns.values():
        invoke(turn.function, turn.batch(), latency_ms)  # untimed: connections and lanes, as a warm container
    samples = {name: Samples() for name in turns}
    for repetition in range(limits.max_repetitions):
        for name in in_turns(list(turns), repetition):
            function, bodies = turns[name].function, turns[name].batch()
            periods, waited_s = _throttling(function)
            answer = invoke(function, bodies, latency_ms)
            periods_after, waited_after_s = _throttling(function)
            samples[name].throttled_periods += periods_after - periods
            samples[name].throttled_s += waited_after_s - waited_s
            samples[name].wall_s.append(answer["wall_s"])
            samples[name].record_cpu_s.append(answer["cpu_s"] / len(bodies))
            samples[name].botocore_cpu_s.append(answer["botocore_cpu_s"] / len(bodies))
            samples[name].server_s.append(answer["server_s"])
            samples[name].calls.append(answer["calls"])
        if repetition + 1 >= limits.min_repetitions and all(
            _ci_relative(turns[name].aim(each)) <= limits.precision for name, each in samples.items()
        ):
            break
    return samples


def _ci_relative(values: list[float]) -> float:
    """The interval's farther end from the median, as a fraction of the median."""
    (low, high), median = median_ci(values), statistics.median(values)
    return max(median - low, high - median) / median


# As the template sets them (its Observability mapping): every system's function gets them.
POWERTOOLS_ENV = {
    "POWERTOOLS_SERVICE_NAME": "idempotent-consumer",
    "POWERTOOLS_METRICS_NAMESPACE": "IdempotentConsumer",
}


def function_variables(settings: Settings) -> dict[str, str]:
    """A system's function's variables: dummy credentials, ``settings``, and Powertools' as the template sets them."""
    return {**DUMMY_CREDENTIALS_ENV, **settings_environment(settings), **POWERTOOLS_ENV, "POWERTOOLS_LOG_LEVEL": "INFO"}
