"""Everything one run measured, keyed the way the report reads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.cold_start import ColdStarts
from bench.costs import Cost
from bench.timing import Samples

MOTO = "moto in-process"
DYNAMODB_LOCAL = "DynamoDB Local"


@dataclass(frozen=True, order=True)
class TimingKey:
    backend: str
    latency_ms: int
    batch_size: int


@dataclass
class BenchResults:
    machine: dict[str, str]
    # Display order; the first is this consumer, the others are the baselines.
    systems: list[str]
    latencies_ms: list[int]
    batch_sizes: list[int]
    # system -> case -> cost per message (moto in-process, no latency).
    costs: dict[str, dict[str, Cost]] = field(default_factory=dict)
    timings: dict[TimingKey, dict[str, Samples]] = field(default_factory=dict)
    # This consumer with logs at INFO, then at WARNING, taking turns: largest batch, no latency.
    quiet_consumer: dict[str, Samples] = field(default_factory=dict)
    cold_starts: ColdStarts | None = None
    # Why a part of the run is missing, if one is.
    notes: list[str] = field(default_factory=list)

    @property
    def consumer(self) -> str:
        return self.systems[0]

    @property
    def baselines(self) -> list[str]:
        return self.systems[1:]

    @property
    def backends(self) -> list[str]:
        return sorted({key.backend for key in self.timings}, key=[MOTO, DYNAMODB_LOCAL].index)

    def samples(self, backend: str, latency_ms: int, batch_size: int) -> dict[str, Samples] | None:
        return self.timings.get(TimingKey(backend, latency_ms, batch_size))
