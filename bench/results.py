"""Everything one run measured, keyed the way the report reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bench.cold_start import ColdStarts
from bench.costs import NEW_OPTIMISTIC, Cost
from bench.pricing import CostPerMillion, cost_per_million
from bench.timing import Samples

# The CPU share the targets are read at, and the configuration every system's function had
# in the run that reported 15.7x: no quota at all (the harness's two cores).
TARGET_MEMORY_MB = 512
TARGET_LATENCY_MS = 10
TARGET_BATCH = 10
NO_QUOTA = 0
# Controls for what changed since the earlier benchmark: where the latency is slept, and the
# conflict proxy's own hop (the earlier run went to DynamoDB Local directly).
VIA_PROXY = ""
LATENCY_AT_PROXY = "latency slept by the proxy"
DIRECT = "direct, no conflict proxy"


@dataclass(frozen=True, order=True)
class TimingKey:
    memory_mb: int  # NO_QUOTA: the function's process had the whole machine
    latency_ms: int
    batch_size: int
    hot: bool = False  # all records on one account, through the conflict emulation
    # How the calls reach DynamoDB Local: VIA_PROXY as everywhere, or one of the controls.
    route: str = ""


@dataclass
class BenchResults:
    machine: dict[str, str]
    # Display order; the first is this consumer, the others are the baselines.
    systems: list[str]
    memory_sizes_mb: list[int]
    latencies_ms: list[int]
    # system -> case -> cost per message (moto in-process, no latency).
    costs: dict[str, dict[str, Cost]] = field(default_factory=dict)
    timings: dict[TimingKey, dict[str, Samples]] = field(default_factory=dict)
    # Batches of 10 at 0 ms run while DynamoDB Local's JVM warms up, per system, in order.
    warm_up_s: dict[str, list[float]] = field(default_factory=dict)
    cold_starts: ColdStarts | None = None
    # This consumer under cProfile at the target share: records profiled and the summary.
    profile_records: int = 0
    profile: dict[str, Any] | None = None
    # The conflict proxy's counts over the hot-account batches.
    hot_proxy_stats: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def consumer(self) -> str:
        return self.systems[0]

    @property
    def baselines(self) -> list[str]:
        return self.systems[1:]

    def samples(self, memory_mb: int, latency_ms: int, batch_size: int, *, hot: bool = False) -> dict[str, Samples]:
        return self.timings.get(TimingKey(memory_mb, latency_ms, batch_size, hot), {})

    def cost(self, system: str, memory_mb: int) -> CostPerMillion | None:
        """Cost per million new payments at ``memory_mb``, from the batch of 10 at the target latency."""
        samples = self.samples(memory_mb, TARGET_LATENCY_MS, TARGET_BATCH).get(system)
        units = self.costs.get(system, {}).get(NEW_OPTIMISTIC)
        if samples is None or units is None:
            return None
        return cost_per_million(samples.median_s, TARGET_BATCH, memory_mb, units)
