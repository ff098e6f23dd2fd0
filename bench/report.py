"""The results as one table, the targets' verdicts, and BENCHMARKS.md around them.

Every number and ratio here is computed from the run's own measurements.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from bench.costs import (
    CASES,
    DUPLICATE_IN_BATCH,
    DUPLICATE_LOCK,
    DUPLICATE_OPTIMISTIC,
    NEW_LOCK,
    NEW_OPTIMISTIC,
    Cost,
)
from bench.results import DYNAMODB_LOCAL, MOTO, BenchResults
from bench.systems import PowertoolsBaseline
from bench.timing import Samples

TIMES = "\u00d7"
CALL_TARGETS = {NEW_OPTIMISTIC: 1, NEW_LOCK: 2, DUPLICATE_OPTIMISTIC: 1, DUPLICATE_LOCK: 1, DUPLICATE_IN_BATCH: 0}
SPEEDUP_TARGET = 8.0
SINGLE_RECORD_TARGET = 1.5
TARGET_BATCH = 10
TARGET_LATENCY_MS = 10
POWERTOOLS = PowertoolsBaseline.name


def _ms(seconds: float) -> str:
    value = seconds * 1000
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def _number(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _ratio(baseline: float, ours: float) -> str:
    return "—" if ours <= 0 else f"{baseline / ours:.1f}{TIMES}"


class _Table:
    def __init__(self, results: BenchResults) -> None:
        self.results = results
        self.header = [
            "figure",
            *results.systems,
            *(f"{name} ÷ this" for name in results.baselines),
            "target",
        ]
        self.rows: list[list[str]] = []

    def add(
        self, figure: str, values: dict[str, float], show: Callable[[float], str], *, ratio: bool, target: str = ""
    ) -> None:
        ours = values.get(self.results.consumer)
        ratios = (
            {name: _ratio(values[name], ours) for name in self.results.baselines if name in values}
            if ratio and ours is not None
            else {}
        )
        self.add_cells(figure, {name: show(value) for name, value in values.items()}, ratios, target)

    def add_cells(self, figure: str, cells: dict[str, str], ratios: dict[str, str], target: str = "") -> None:
        self.rows.append(
            [
                figure,
                *(cells.get(name, "—") for name in self.results.systems),
                *(ratios.get(name, "") for name in self.results.baselines),
                target,
            ]
        )

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |", "|" + "|".join("---" for _ in self.header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines)


def _cost_rows(table: _Table, costs: dict[str, dict[str, Cost]]) -> None:
    for case in CASES:
        calls = {name: by_case[case].calls for name, by_case in costs.items()}
        table.add(f"DynamoDB calls per message: {case}", calls, _number, ratio=True, target=str(CALL_TARGETS[case]))
    for case in CASES:
        cells = {
            name: f"{_number(by_case[case].write_units)} / {_number(by_case[case].read_units)}"
            for name, by_case in costs.items()
        }
        table.add_cells(f"WCU / RCU per message: {case}", cells, {})


def _timing_rows(table: _Table, results: BenchResults) -> None:
    for backend in results.backends:
        for latency in results.latencies_ms:
            for size in results.batch_sizes:
                samples = results.samples(backend, latency, size)
                if samples is None:
                    continue
                target = (
                    f"≥ {SPEEDUP_TARGET:g}{TIMES} vs {POWERTOOLS}"
                    if (size, latency) == (TARGET_BATCH, TARGET_LATENCY_MS)
                    else ""
                )
                repetitions = len(next(iter(samples.values())).wall_s)
                cells = {name: f"{_ms(s.median_s)} / {_ms(s.p99_s)}" for name, s in samples.items()}
                ours = samples[results.consumer].median_s
                ratios = {name: _ratio(samples[name].median_s, ours) for name in results.baselines}
                figure = f"batch of {size}, {latency} ms latency, {backend}: median / p99 ms (n={repetitions})"
                table.add_cells(figure, cells, ratios, target)
        single = results.samples(backend, TARGET_LATENCY_MS, 1)
        batch = results.samples(backend, TARGET_LATENCY_MS, TARGET_BATCH)
        if single and batch:
            batch_over_single = {name: batch[name].median_s / single[name].median_s for name in single}
            table.add(
                f"batch of {TARGET_BATCH} ÷ single record, {TARGET_LATENCY_MS} ms latency, {backend}",
                batch_over_single,
                lambda value: f"{value:.1f}{TIMES}",
                ratio=False,
                target=f"≤ {SINGLE_RECORD_TARGET:g}{TIMES} (this consumer)",
            )
        if backend == MOTO and batch:
            table.add(
                f"of which moto's own CPU (serialized), batch of {TARGET_BATCH}, ms",
                {name: s.server_cpu_median_s for name, s in batch.items()},
                _ms,
                ratio=False,
            )


def _cpu_rows(table: _Table, results: BenchResults) -> None:
    largest = max(results.batch_sizes)
    for backend in results.backends:
        samples = results.samples(backend, 0, largest)
        if samples is None:
            continue
        excluded = " (moto's CPU excluded)" if backend == MOTO else ""
        table.add(
            f"CPU per record, ms: batch of {largest}, no latency, {backend}{excluded}",
            {name: s.cpu_median_s for name, s in samples.items()},
            _ms,
            ratio=True,
            target=f"≤ {POWERTOOLS}",
        )
    if results.quiet_consumer:
        info, warning = (samples.cpu_median_s for samples in results.quiet_consumer.values())
        table.add_cells(
            f"CPU per record, ms: same, {MOTO}, this consumer with logs at INFO / at WARNING, taking turns",
            {results.consumer: f"{_ms(info)} / {_ms(warning)}"},
            {},
        )
    if results.cold_starts is not None:
        processes = len(next(iter(results.cold_starts.seconds.values())))
        table.add(
            f"cold start: import + init, median of {processes} processes, ms",
            {name: results.cold_starts.median_s(name) for name in results.cold_starts.seconds},
            _ms,
            ratio=True,
            target=f"≤ {POWERTOOLS}",
        )


def results_table(results: BenchResults) -> str:
    table = _Table(results)
    if results.costs:
        _cost_rows(table, results.costs)
    _timing_rows(table, results)
    _cpu_rows(table, results)
    return table.markdown()


# -- verdicts -----------------------------------------------------------------------


def _verdict(met: bool, text: str) -> str:
    return f"- **{'met' if met else 'missed'}**: {text}"


def _call_verdicts(results: BenchResults) -> list[str]:
    ours = results.costs.get(results.consumer)
    if not ours:
        return []
    measured = ", ".join(f"{_number(ours[case].calls)}" for case in CALL_TARGETS)
    wanted = ", ".join(str(target) for target in CALL_TARGETS.values())
    met = all(ours[case].calls <= target for case, target in CALL_TARGETS.items())
    return [_verdict(met, f"DynamoDB calls per message ({', '.join(CALL_TARGETS)}): {measured} (target {wanted}).")]


def _speed_verdicts(results: BenchResults, backend: str) -> list[str]:
    batch = results.samples(backend, TARGET_LATENCY_MS, TARGET_BATCH)
    single = results.samples(backend, TARGET_LATENCY_MS, 1)
    if not batch or POWERTOOLS not in batch:
        return []
    ours, theirs = batch[results.consumer], batch[POWERTOOLS]
    speedup = theirs.median_s / ours.median_s
    why = _why_batch(results, backend, ours)
    verdicts = [
        _verdict(
            speedup >= SPEEDUP_TARGET,
            f"{backend}: batch of {TARGET_BATCH} at {TARGET_LATENCY_MS} ms is {speedup:.1f}{TIMES} faster "
            f"than {POWERTOOLS} "
            f"({_ms(ours.median_s)} ms against {_ms(theirs.median_s)} ms; target ≥ {SPEEDUP_TARGET:g}{TIMES}"
            + ("" if speedup >= SPEEDUP_TARGET else f", short by {SPEEDUP_TARGET / speedup:.2f}{TIMES}; {why}")
            + ").",
        )
    ]
    if single:
        ratio = ours.median_s / single[results.consumer].median_s
        verdicts.append(
            _verdict(
                ratio <= SINGLE_RECORD_TARGET,
                f"{backend}: batch of {TARGET_BATCH} takes {ratio:.1f}{TIMES} a single record's time "
                f"({_ms(ours.median_s)} ms against {_ms(single[results.consumer].median_s)} ms; "
                f"target ≤ {SINGLE_RECORD_TARGET:g}{TIMES}"
                + (
                    ""
                    if ratio <= SINGLE_RECORD_TARGET
                    else f", over by {ratio / SINGLE_RECORD_TARGET:.2f}{TIMES}; {why}"
                )
                + ").",
            )
        )
    return verdicts


def _why_batch(results: BenchResults, backend: str, ours: Samples) -> str:
    client_cpu = ours.cpu_median_s * TARGET_BATCH
    text = (
        f"the {TARGET_BATCH} records' own CPU, {_ms(client_cpu)} ms, runs one thread at a time under the GIL "
        f"while only the {TARGET_LATENCY_MS} ms waits overlap"
    )
    if backend == MOTO:
        text += f", and moto's CPU, {_ms(ours.server_cpu_median_s)} ms, is serialized into the same batch"
    if backend == DYNAMODB_LOCAL:
        text += ", and DynamoDB Local's own work shares the machine's CPUs"
    return text


def _cpu_verdicts(results: BenchResults) -> list[str]:
    verdicts = []
    largest = max(results.batch_sizes)
    for backend in results.backends:
        samples = results.samples(backend, 0, largest)
        if not samples or POWERTOOLS not in samples:
            continue
        ours, theirs = samples[results.consumer].cpu_median_s, samples[POWERTOOLS].cpu_median_s
        verdicts.append(
            _verdict(
                ours <= theirs,
                f"{backend}: CPU per record {_ms(ours)} ms against {POWERTOOLS}' {_ms(theirs)} ms "
                f"({theirs / ours:.1f}{TIMES} less).",
            )
        )
    if results.cold_starts is not None:
        ours, theirs = (results.cold_starts.median_s(name) for name in (results.consumer, POWERTOOLS))
        difference = (
            f"{theirs / ours:.2f}{TIMES} less"
            if ours <= theirs
            else f"{(ours - theirs) * 1000:.0f} ms more: it also imports Logger, Metrics, pydantic models "
            f"and builds two clients (DynamoDB, SQS)"
        )
        verdicts.append(
            _verdict(
                ours <= theirs,
                f"cold start {_ms(ours)} ms against {POWERTOOLS}' idempotency import and persistence layer, "
                f"{_ms(theirs)} ms ({difference}).",
            )
        )
    return verdicts


def verdicts(results: BenchResults) -> str:
    lines = _call_verdicts(results)
    for backend in results.backends:
        lines += _speed_verdicts(results, backend)
    lines += _cpu_verdicts(results)
    return "\n".join(lines)


def stdout_report(results: BenchResults) -> str:
    return "\n\n".join([results_table(results), verdicts(results), *results.notes])


def benchmarks_markdown(results: BenchResults, chart_file: str, narrative: str) -> str:
    machine = "\n".join(f"| {name} | {value} |" for name, value in results.machine.items())
    notes = "\n".join(f"> {note}" for note in results.notes)
    today = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%d")
    return f"""# Benchmarks

Generated by `make bench` (`python -m bench`) on {today}; every figure below comes from one
run, the three systems measured side by side on the same records, table shapes and
injected latency. Re-run it to get this machine's figures: the file is rewritten whole.

| machine | |
|---|---|
{machine}

{notes}

## Results

{results_table(results)}

![Batch wall time against injected DynamoDB latency]({chart_file})

## Targets

{verdicts(results)}

{narrative}
"""
