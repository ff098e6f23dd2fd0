"""Batch wall time and CPU per record, the systems taking turns on fresh records.

The systems alternate within each repetition (in a rotating order), so a slow moment
of the machine is shared out instead of landing on one system's samples. Events are
built before the clock starts; each system first runs one untimed batch, which opens
its connections and starts its threads as a warm container would have. Before every
batch the tables are emptied (outside the clock): moto's ``TransactWriteItems`` copies
whole tables, so a growing table would tax the transactional system alone.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from bench.probe import RoundTripProbe
from bench.runs import invoke, run_batch
from bench.systems import LambdaSystem
from testkit.lambda_sqs import sqs_event
from testkit.messages import MessageFactory

# Enough records to open every worker's connection; a full batch of 100 would only cost time.
_WARM_UP_RECORDS = 10


@dataclass
class Samples:
    wall_s: list[float] = field(default_factory=list)
    # Process CPU less the CPU moto spent answering in process: the function's own.
    cpu_per_record_s: list[float] = field(default_factory=list)
    # moto's CPU inside each batch: simulated server work, serialized under the GIL.
    server_cpu_s: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def p99_s(self) -> float:
        return percentile(self.wall_s, 99)

    @property
    def cpu_median_s(self) -> float:
        return statistics.median(self.cpu_per_record_s)

    @property
    def server_cpu_median_s(self) -> float:
        return statistics.median(self.server_cpu_s)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics; with few samples p99 is near the maximum."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def time_batches(
    systems: Sequence[LambdaSystem],
    factory: MessageFactory,
    probe: RoundTripProbe,
    *,
    batch_size: int,
    repetitions: int,
    before_batch: Callable[[], None],
) -> dict[str, Samples]:
    samples = {system.name: Samples() for system in systems}
    for system in systems:
        run_batch(system, factory.payments(min(batch_size, _WARM_UP_RECORDS)))
    before_batch()
    for repetition in range(repetitions):
        turn = repetition % len(systems)
        for system in [*systems[turn:], *systems[:turn]]:
            event = sqs_event(factory.payments(batch_size))
            server_cpu_before = probe.reading().server_cpu_s
            cpu_before, started = time.process_time(), time.perf_counter()
            invoke(system, event)
            wall = time.perf_counter() - started
            server_cpu = probe.reading().server_cpu_s - server_cpu_before
            cpu = time.process_time() - cpu_before - server_cpu
            samples[system.name].wall_s.append(wall)
            samples[system.name].cpu_per_record_s.append(cpu / batch_size)
            samples[system.name].server_cpu_s.append(server_cpu)
            before_batch()
    return samples
