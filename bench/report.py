"""The results as tables, the targets' verdicts, and BENCHMARKS.md around them.

Every number and ratio here is computed from the run's own measurements.
"""

from __future__ import annotations

import datetime
import re
import statistics

from bench.cold_start import BOTOCORE_FLOOR
from bench.costs import CASES, NEW_OPTIMISTIC
from bench.pricing import PRICES_AS_OF, REGION, SqsRequests, price_table
from bench.results import (
    DIRECT,
    LATENCY_AT_PROXY,
    NO_QUOTA,
    TARGET_BATCH,
    TARGET_LATENCY_MS,
    TARGET_MEMORY_MB,
    BenchResults,
    TimingKey,
)
from bench.systems import PowertoolsBaseline
from bench.timing import REPO_ROOT, Samples

TIMES = "\u00d7"
POWERTOOLS = PowertoolsBaseline.name
SPEEDUP_TARGET = 10.0
SINGLE_RECORD_TARGET = 2.0
CPU_TARGET = 0.5
COLD_START_TARGET = 1.25


def _ms(seconds: float) -> str:
    value = seconds * 1000
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def _with_ci(samples: Samples) -> str:
    low, high = samples.ci_s
    return f"{_ms(samples.median_s)} [{_ms(low)}-{_ms(high)}] (n={len(samples.wall_s)})"


def _verdict(met: bool) -> str:
    return "**met**" if met else "**missed**"


def _share(memory_mb: int) -> str:
    return "no quota (2 cores)" if memory_mb == NO_QUOTA else f"{memory_mb} MB ({memory_mb / 1769:.2f} vCPU)"


def _timing_table(results: BenchResults) -> list[str]:
    header = ["CPU share", "latency", "batch", *results.systems, *(f"{name} ÷ this" for name in results.baselines)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in sorted(results.timings):
        samples = results.timings[key]
        ours = samples[results.consumer].median_s
        batch = f"{key.batch_size}{', one account' if key.hot else ''}"
        latency = f"{key.latency_ms} ms{f', {key.route}' if key.route else ''}"
        cells = [_share(key.memory_mb), latency, batch]
        cells += [_with_ci(samples[name]) for name in results.systems]
        cells += [f"{samples[name].median_s / ours:.1f}{TIMES}" for name in results.baselines]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _cpu_table(results: BenchResults) -> list[str]:
    throttled = [f"{name}: throttled per batch, ms" for name in results.systems]
    header = ["CPU share", *results.systems, *throttled]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for memory in [*results.memory_sizes_mb, NO_QUOTA]:
        samples = results.samples(memory, TARGET_LATENCY_MS, TARGET_BATCH)
        if not samples:
            continue
        cells = []
        for name in results.systems:
            low, high = samples[name].cpu_per_record_ci_s
            cells.append(f"{_ms(samples[name].cpu_per_record_s)} [{_ms(low)}-{_ms(high)}]")
        for name in results.systems:
            cells.append(f"{_ms(samples[name].throttled_per_batch_s)} ({samples[name].throttled_periods} periods)")
        lines.append(f"| {_share(memory)} | " + " | ".join(cells) + " |")
    return lines


def _unit_table(results: BenchResults) -> list[str]:
    lines = [
        "| case | " + " | ".join(f"{name}: calls / WCU / RCU" for name in results.systems) + " |",
        "|---|" + "---|" * len(results.systems),
    ]
    for case in CASES:
        cells = []
        for name in results.systems:
            cost = results.costs[name][case]
            cells.append(f"{cost.calls:g} / {cost.write_units:g} / {cost.read_units:g}")
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return lines


def _cost_table(results: BenchResults) -> list[str]:
    lines = [
        "| memory | system | batch of 10 median, ms | Lambda | DynamoDB | SQS | total, USD per million |",
        "|---|---|---|---|---|---|---|",
    ]
    for memory in results.memory_sizes_mb:
        for name in results.systems:
            cost = results.cost(name, memory)
            if cost is None:
                continue
            wall = results.samples(memory, TARGET_LATENCY_MS, TARGET_BATCH)[name].median_s
            lines.append(
                f"| {memory} MB | {name} | {_ms(wall)} | {cost.lambda_usd:.3f} | {cost.dynamodb_usd:.3f} "
                f"| {cost.sqs_usd:.3f} | **{cost.total_usd:.3f}** |"
            )
    return lines


def _cold_start_table(results: BenchResults) -> list[str]:
    cold = results.cold_starts
    if cold is None:
        return []
    floor = cold.median_s(BOTOCORE_FLOOR)
    lines = ["| init (import + clients) | median ms [95% CI] | ÷ botocore floor |", "|---|---|---|"]
    for name in cold.seconds:
        low, high = cold.ci_s(name)
        lines.append(
            f"| {name} | {_ms(cold.median_s(name))} [{_ms(low)}-{_ms(high)}] "
            f"| {cold.median_s(name) / floor:.2f}{TIMES} |"
        )
    return lines


def targets(results: BenchResults) -> list[str]:
    """One line per performance target, read at 512 MB, 10 ms, batch of 10 new payments."""
    verdicts = []
    batch = results.samples(TARGET_MEMORY_MB, TARGET_LATENCY_MS, TARGET_BATCH)
    single = results.samples(TARGET_MEMORY_MB, TARGET_LATENCY_MS, 1)
    ours, theirs = results.consumer, POWERTOOLS
    if batch and single:
        speedup = batch[theirs].median_s / batch[ours].median_s
        verdicts.append(
            f"- {_verdict(speedup >= SPEEDUP_TARGET)}: batch of 10 is {speedup:.1f}{TIMES} faster than Powertools "
            f"({_ms(batch[ours].median_s)} ms against {_ms(batch[theirs].median_s)} ms; "
            f"target ≥ {SPEEDUP_TARGET:g}{TIMES}"
            + ("" if speedup >= SPEEDUP_TARGET else f", short by {SPEEDUP_TARGET / speedup:.2f}{TIMES}")
            + ")."
        )
        within = batch[ours].median_s / single[ours].median_s
        verdicts.append(
            f"- {_verdict(within <= SINGLE_RECORD_TARGET)}: batch of 10 takes {within:.2f}{TIMES} a single record "
            f"({_ms(batch[ours].median_s)} ms against {_ms(single[ours].median_s)} ms; "
            f"target ≤ {SINGLE_RECORD_TARGET:g}{TIMES}"
            + ("" if within <= SINGLE_RECORD_TARGET else f", over by {within / SINGLE_RECORD_TARGET:.2f}{TIMES}")
            + ")."
        )
        cpu = batch[ours].cpu_per_record_s / batch[theirs].cpu_per_record_s
        verdicts.append(
            f"- {_verdict(cpu <= CPU_TARGET)}: CPU per record {_ms(batch[ours].cpu_per_record_s)} ms against "
            f"Powertools' {_ms(batch[theirs].cpu_per_record_s)} ms, {cpu:.2f} of it (target ≤ {CPU_TARGET:g})."
        )
    if results.cold_starts is not None:
        cold = results.cold_starts
        ratio = cold.median_s(ours) / cold.median_s(BOTOCORE_FLOOR)
        verdicts.append(
            f"- {_verdict(ratio <= COLD_START_TARGET)}: cold start {_ms(cold.median_s(ours))} ms, {ratio:.2f}{TIMES} "
            f"the botocore floor's {_ms(cold.median_s(BOTOCORE_FLOOR))} ms (target ≤ {COLD_START_TARGET:g}{TIMES}"
            + ("" if ratio <= COLD_START_TARGET else f", over by {ratio / COLD_START_TARGET:.2f}{TIMES}")
            + ")."
        )
    ours_cost, their_cost = results.cost(ours, TARGET_MEMORY_MB), results.cost(theirs, TARGET_MEMORY_MB)
    if ours_cost and their_cost:
        verdicts.append(
            f"- {_verdict(ours_cost.total_usd <= their_cost.total_usd)}: cost per million messages "
            f"${ours_cost.total_usd:.3f} against Powertools' ${their_cost.total_usd:.3f} "
            f"(DynamoDB ${ours_cost.dynamodb_usd:.3f} against ${their_cost.dynamodb_usd:.3f}: "
            f"{results.costs[ours][NEW_OPTIMISTIC].write_units:g} write units per new payment against "
            f"{results.costs[theirs][NEW_OPTIMISTIC].write_units:g})."
        )
    hot = results.samples(TARGET_MEMORY_MB, TARGET_LATENCY_MS, TARGET_BATCH, hot=True)
    if hot:
        stats = ", ".join(f"{name} {count}" for name, count in results.hot_proxy_stats.items())
        verdicts.append(
            f"- beside them, the hot account (10 payments on one account, conflict emulation on): "
            f"{_ms(hot[ours].median_s)} ms against Powertools' {_ms(hot[theirs].median_s)} ms "
            f"({hot[theirs].median_s / hot[ours].median_s:.1f}{TIMES}); the proxy counted {stats}."
        )
    return verdicts


def _difference(results: BenchResults) -> list[str]:
    """Why the previous run said 15.7x: each factor as this run measured it."""
    lines = []
    open_ = results.samples(NO_QUOTA, TARGET_LATENCY_MS, TARGET_BATCH)
    quota = results.samples(TARGET_MEMORY_MB, TARGET_LATENCY_MS, TARGET_BATCH)
    ours, theirs = results.consumer, POWERTOOLS
    if open_ and quota:
        lines.append(
            f"- **CPU share.** Without a quota (the previous run's setting: the function had both cores) the batch "
            f"of 10 at 10 ms is {_ms(open_[ours].median_s)} ms for this consumer and {_ms(open_[theirs].median_s)} ms "
            f"for Powertools, {open_[theirs].median_s / open_[ours].median_s:.1f}{TIMES}; at 512 MB's share "
            f"{_ms(quota[ours].median_s)} ms and {_ms(quota[theirs].median_s)} ms, "
            f"{quota[theirs].median_s / quota[ours].median_s:.1f}{TIMES}. The ten records' CPU "
            f"({_ms(quota[ours].cpu_per_record_s * 10)} ms of CPU for this consumer) is spent at 0.29 of a core "
            "only once the quota of the current CFS period (0.29 x the period: 29 ms of every 100 ms by default) "
            f"is used up: the cgroup throttled this consumer {_ms(quota[ours].throttled_per_batch_s)} ms per batch "
            f"and Powertools {_ms(quota[theirs].throttled_per_batch_s)} ms. A batch whose CPU fits in one period's "
            "quota, after an idle gap, runs at full speed: the share slows long or back-to-back invocations, "
            "not a short batch."
        )
    for name, walls in results.warm_up_s.items():
        if len(walls) >= 4:
            quarter = max(1, len(walls) // 4)
            lines.append(
                f"- **JVM warm-up** ({name}): batches of 10 at 0 ms while DynamoDB Local warmed, first "
                f"{quarter}: median {_ms(statistics.median(walls[:quarter]))} ms, last {quarter}: "
                f"{_ms(statistics.median(walls[-quarter:]))} ms (untimed in the tables)."
            )
    for route, what in (
        (LATENCY_AT_PROXY, "the latency slept by a second conflict proxy instead of in the function"),
        (DIRECT, "DynamoDB Local reached directly, without the conflict proxy's hop (as the earlier run did)"),
    ):
        control = results.timings.get(TimingKey(TARGET_MEMORY_MB, TARGET_LATENCY_MS, TARGET_BATCH, route=route))
        if control and quota:
            lines.append(
                f"- **{route.capitalize()}.** With {what}, same tables, same 512 MB functions: batch of 10 "
                f"{_ms(control[ours].median_s)} ms against Powertools' {_ms(control[theirs].median_s)} ms, "
                f"{control[theirs].median_s / control[ours].median_s:.1f}{TIMES} (the standard route: "
                f"{quota[theirs].median_s / quota[ours].median_s:.1f}{TIMES})."
            )
    return lines


def _short_paths(text: str) -> str:
    """site-packages/botocore/x.py rather than the venv's absolute path: the same on every machine."""
    return re.sub(r"/\S*?/(site-packages|python3\.\d+)/", "", text).replace(f"{REPO_ROOT}/", "")


def _profile(results: BenchResults) -> list[str]:
    if not results.profile:
        return []
    by_package: dict[str, float] = results.profile["by_package_s"]
    total = sum(by_package.values())
    lines = [
        f"cProfile (CPU clock) inside this consumer's function at {TARGET_MEMORY_MB} MB, one invocation of "
        f"{results.profile_records} new payments on one account (one lane, so in the profiled thread) "
        f"at {TARGET_LATENCY_MS} ms: "
        f"{total / results.profile_records * 1000:.2f} ms "
        "of CPU per record under the profiler (its own overhead included). Own time by package:",
        "",
        "| package | share of CPU | ms per record |",
        "|---|---|---|",
    ]
    for package, seconds in sorted(by_package.items(), key=lambda item: -item[1]):
        lines.append(f"| {package} | {seconds / total:.0%} | {seconds / results.profile_records * 1000:.3f} |")
    for title, key in (("Top entries by own time", "top"), ("Top entries by cumulative time", "cumulative")):
        lines += ["", f"{title}:", "", "```", _short_paths(results.profile[key]).strip(), "```"]
    return lines


def benchmarks_markdown(results: BenchResults, charts: list[str], narrative: str) -> str:
    today = datetime.date.today().isoformat()
    machine = "\n".join(f"| {name} | {value} |" for name, value in results.machine.items())
    sqs = SqsRequests(TARGET_BATCH)
    parts = [
        "# Benchmarks",
        "",
        f"Generated by `make bench` (`python -m bench`) on {today}; every figure below comes from one run, the "
        "three systems taking turns on the same record shapes. Each system is a Lambda function of its own "
        "(the Runtime Interface Emulator + awslambdaric on Python 3.12) under the cgroup CPU quota of the memory "
        "size in its row; DynamoDB Local behind the conflict emulation, and the harness, run outside it. Times "
        "are medians with their distribution-free 95% confidence interval [low-high] and the number of batches.",
        "",
        "| machine | |",
        "|---|---|",
        machine,
        "",
        "## Targets (512 MB share, 10 ms injected latency, batch of 10 new payments on distinct accounts)",
        "",
        *targets(results),
        "",
        "## Invocation wall time",
        "",
        *_timing_table(results),
        "",
        f"![Batch wall time against injected DynamoDB latency]({charts[0]})",
        "",
        "## CPU per record (batch of 10, 10 ms), ms [95% CI]",
        "",
        *_cpu_table(results),
        "",
        "## Cold start under the 512 MB share (fresh processes, import + init)",
        "",
        *_cold_start_table(results),
        "",
        "## Cost per million messages (new payments, batches of 10, 10 ms latency)",
        "",
        *_cost_table(results),
        "",
        f"![Cost per million messages against memory size]({charts[1]})",
        "",
        f"Prices: {REGION}, as of {PRICES_AS_OF}; not fetched by the run (bench/pricing.py).",
        "",
        "| item | price |",
        "|---|---|",
        *(f"| {name} | {price} |" for name, price in price_table()),
        "",
        f"Lambda: each batch's median duration rounded up to the ms x memory, plus one request, per {TARGET_BATCH} "
        f"messages. SQS requests per message: {sqs.sends:g} send (the producer's), {sqs.receives:g} receive, "
        f"{sqs.deletes:g} delete, {sqs.visibility_changes:g} visibility changes, {sqs.dead_letter_sends:g} DLQ sends. "
        "DynamoDB: the request units of the table below.",
        "",
        "### DynamoDB calls and request units per message (moto in-process, item sizes read around each write)",
        "",
        *_unit_table(results),
        "",
        "## Why this run and the previous 15.7x differ",
        "",
        *_difference(results),
        "",
        "## Where this consumer's CPU goes",
        "",
        *_profile(results),
        "",
        *(f"> {note}" for note in results.notes),
        narrative.strip(),
        "",
    ]
    return "\n".join(parts)


def stdout_report(results: BenchResults) -> str:
    return "\n".join([*_timing_table(results), "", *_cpu_table(results), "", *targets(results)])


__all__ = ["TimingKey", "benchmarks_markdown", "stdout_report", "targets"]
