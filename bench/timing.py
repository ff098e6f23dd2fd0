"""Batch wall time and CPU per record at Lambda's CPU share, the systems taking turns.

Each system is a function of its own in ``local.lambda_runtime`` (emulator + awslambdaric),
started at the memory size measured, so the cgroup quota gives it that size's share of a
core; DynamoDB Local, the conflict proxy and this harness run outside the quota. The
clocks are read inside the function (``bench.function``). Systems alternate within each
repetition in a rotating order, so a slow moment of the machine is shared out. Repetitions
go on until every system's median has a 95% confidence interval within ``precision`` of
it, or ``max_repetitions`` is reached (then the table says so with the interval).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.runs import BatchFailed
from bench.systems import SYSTEM_ENV
from local.lambda_runtime import LambdaEnvironment, LambdaFleet
from local.resources import FunctionSpec
from testkit.lambda_sqs import sqs_event

REPO_ROOT = Path(__file__).resolve().parent.parent
_CONFIDENCE_Z = 1.959964


def median_ci(values: Sequence[float]) -> tuple[float, float]:
    """Distribution-free 95% interval of the median: order statistics chosen by the binomial(n, 1/2).

    The largest ``k`` with P(B < k) <= 2.5% gives [x_(k), x_(n+1-k)] (1-based); exact
    binomial sums, so it holds for the small ``n`` where a normal approximation does not.
    """
    ordered = sorted(values)
    n = len(ordered)
    if n < 6:
        return ordered[0], ordered[-1]
    cumulative, k = 0.0, 0
    while True:
        cumulative += math.comb(n, k) / 2**n
        if cumulative > 0.025:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


@dataclass
class Samples:
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    records: int = 1
    # The cgroup's own count of time its processes waited for quota, over the timed batches.
    throttled_s: float = 0.0
    throttled_periods: int = 0

    @property
    def throttled_per_batch_s(self) -> float:
        return self.throttled_s / len(self.wall_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def ci_s(self) -> tuple[float, float]:
        return median_ci(self.wall_s)

    @property
    def ci_relative(self) -> float:
        """The interval's farther end from the median, as a fraction of the median."""
        low, high = self.ci_s
        return max(self.median_s - low, high - self.median_s) / self.median_s

    @property
    def cpu_per_record_s(self) -> float:
        return statistics.median(self.cpu_s) / self.records

    @property
    def cpu_per_record_ci_s(self) -> tuple[float, float]:
        low, high = median_ci(self.cpu_s)
        return low / self.records, high / self.records


def throttling(function: LambdaEnvironment) -> tuple[int, float]:
    """Periods in which the function's cgroup ran out of quota, and the time it waited: (0, 0.0) without one."""
    if function.quota is None:
        return 0, 0.0
    fields = dict(line.split() for line in (function.quota.path / "cpu.stat").read_text().splitlines())
    # cgroup v1 counts throttled_time in ns, v2 throttled_usec in us.
    waited_s = (
        int(fields["throttled_time"]) / 1e9 if "throttled_time" in fields else int(fields["throttled_usec"]) / 1e6
    )
    return int(fields["nr_throttled"]), waited_s


def bench_function(
    memory_mb: int,
    *,
    handler: str = "bench.function.handler",
    code_dir: Path = REPO_ROOT,
    environment: Mapping[str, str] | None = None,
) -> FunctionSpec:
    """``handler`` as a Lambda function of ``memory_mb`` (by default the benchmark's, the repository as its code)."""
    name = handler.rpartition(".")[0].replace(".", "-")
    return FunctionSpec(
        logical_id="BenchFunction",
        name=name,
        arn=f"arn:aws:lambda:us-east-1:123456789012:function:{name}",
        handler=handler,
        code_dir=code_dir,
        timeout_s=120,
        memory_mb=memory_mb,
        environment=dict(environment or {}),
        triggers=(),
    )


@contextmanager
def system_functions(
    environments: Mapping[str, Mapping[str, str]], memory_mb: int, *, cpu_share: bool = True
) -> Iterator[dict[str, LambdaEnvironment]]:
    """One warm execution environment per system (name -> its function's variables) at ``memory_mb``."""
    with ExitStack() as stack:
        functions = {}
        for name, variables in environments.items():
            environment = {**variables, SYSTEM_ENV: name}
            fleet = stack.enter_context(
                LambdaFleet(bench_function(memory_mb), environment, memory_mb=memory_mb, cpu_share=cpu_share)
            )
            functions[name] = fleet.add()
        yield functions


def invoke(
    function: LambdaEnvironment, bodies: list[str], latency_ms: float, *, profile: bool = False
) -> dict[str, Any]:
    invocation = function.invoke({"latency_ms": latency_ms, "event": sqs_event(bodies), "profile": profile})
    if not invocation.succeeded:
        raise BatchFailed(f"{function.name}: the invocation failed: {invocation.error or 'timed out'}")
    answer: dict[str, Any] = invocation.response
    if answer["failed"]:
        raise BatchFailed(f"{function.name}: {answer['failed']} of {len(bodies)} records failed")
    return answer


def time_batches(
    functions: Mapping[str, LambdaEnvironment],
    batch: Callable[[], list[str]],
    *,
    latency_ms: float,
    min_repetitions: int,
    max_repetitions: int,
    precision: float = 0.10,
) -> dict[str, Samples]:
    """Samples per system: each repetition runs every system once on fresh records, in turn."""
    names = list(functions)
    for name in names:
        invoke(functions[name], batch(), latency_ms)  # untimed: connections and lanes, as a warm container
    samples: dict[str, Samples] = {name: Samples() for name in names}
    for repetition in range(max_repetitions):
        turn = repetition % len(names)
        for name in [*names[turn:], *names[:turn]]:
            bodies = batch()
            periods, waited_s = throttling(functions[name])
            answer = invoke(functions[name], bodies, latency_ms)
            periods_after, waited_after_s = throttling(functions[name])
            samples[name].throttled_periods += periods_after - periods
            samples[name].throttled_s += waited_after_s - waited_s
            samples[name].records = len(bodies)
            samples[name].wall_s.append(answer["wall_s"])
            samples[name].cpu_s.append(answer["cpu_s"])
        if repetition + 1 >= min_repetitions and all(s.ci_relative <= precision for s in samples.values()):
            break
    return samples
