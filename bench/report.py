"""Everything one run measured; as tables, the targets' verdicts, and docs/benchmarks.md, all from that run alone."""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from bench.coldstart import CONSUMER as COLD_CONSUMER
from bench.coldstart import FLOOR, FULL_CPU, LAMBDA_SHARES, ColdStarts
from bench.costs import CASES, NEW, PRICE_TABLE, PRICES_AS_OF, Cost, CostPerMillion, cost_per_million, sqs_requests
from bench.costs import REGION as PRICES_REGION
from bench.outbox import MEMORY_MB as RELAY_MB
from bench.outbox import WITH, WITHOUT, Outbox
from bench.systems import NAMES, PowertoolsBaseline
from bench.timing import Samples, median_ci
from tests.core.concurrency import racing

# The CPU share the targets are read at.
TARGET_MEMORY_MB = 512
TARGET_LATENCY_MS = 10
TARGET_BATCH = 10

TIMES = "\u00d7"
CONSUMER, BASELINES, POWERTOOLS = NAMES[0], NAMES[1:], PowertoolsBaseline.name
SPEEDUP_TARGET = 10.0
SINGLE_RECORD_TARGET = 2.0
CPU_TARGET = 0.5
FLOOR_TARGET = 0.3
# Three lock messages whose handlers end together: their claims in one transaction, their commits in one.
LOCK_TRIO_CALLS_TARGET = 2
HOT_RETURNED_TARGET = 0.01
COLD_START_TARGET = 1.25
OUTBOX_TARGET = 1.5


@dataclass(frozen=True, order=True)
class TimingKey:
    memory_mb: int
    latency_ms: int
    batch_size: int


@dataclass(frozen=True)
class Floor:
    """A handler's batches of 10 new messages and single messages; only an optimistic handler's is held to the target:
    a lock handler's CPU per message has its webhook's call in it, which its floor (botocore's) leaves out."""

    batch: Samples
    single: Samples
    targeted: bool


@dataclass
class BenchResults:
    memory_sizes_mb: list[int]
    latencies_ms: list[int]
    machine: dict[str, str] = field(default_factory=dict)
    # system -> handler -> case -> cost per message (moto in-process, no latency).
    costs: dict[str, dict[str, dict[str, Cost]]] = field(default_factory=dict)
    timings: dict[TimingKey, dict[str, Samples]] = field(default_factory=dict)
    cold_starts: ColdStarts | None = None
    # This consumer at the target share, no latency: each message at SQS's limits alone, and VALID alone.
    hostile: dict[str, Samples] = field(default_factory=dict)
    # This consumer at the target share and latency, per registered handler: (batches of 10, single messages).
    floors: dict[str, Floor] = field(default_factory=dict)
    # This consumer at the target share and latency, per registered lock-mode handler: batches of three.
    lock_trios: dict[str, Samples] = field(default_factory=dict)
    hot_item: list[racing.HotItem] = field(default_factory=list)
    outbox: Outbox | None = None

    def samples(self, memory_mb: int, latency_ms: int, batch_size: int) -> dict[str, Samples]:
        return self.timings.get(TimingKey(memory_mb, latency_ms, batch_size), {})

    def cost(self, system: str, memory_mb: int, handler: str | None = None) -> CostPerMillion | None:
        """Cost per million new messages of ``handler`` (the timed one by default) at ``memory_mb``: the units
        its new messages took, the Lambda time of the timed handler's batch of 10 at the target latency."""
        samples = self.samples(memory_mb, TARGET_LATENCY_MS, TARGET_BATCH).get(system)
        by_handler = self.costs.get(system, {})
        units = by_handler.get(handler or next(iter(by_handler), ""), {}).get(NEW)
        if samples is None or units is None:
            return None
        return cost_per_million(samples.median_s, TARGET_BATCH, memory_mb, units)


VALID = "one valid message"


def _ms(seconds: float) -> str:
    value = seconds * 1000
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def _interval(median_s: float, interval: tuple[float, float]) -> str:
    return f"{_ms(median_s)} [{_ms(interval[0])}-{_ms(interval[1])}]"


def _share(memory_mb: int) -> str:
    return f"{memory_mb} MB ({memory_mb / 1769:.2f} vCPU)"


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: list[str], rows: Iterable[Iterable[str]]) -> list[str]:
    lines = [_row(cells) for cells in rows]  # none: a section this run did not measure
    return [_row(header), "|" + "---|" * len(header), *lines] if lines else []


def _timing_table(results: BenchResults) -> list[str]:
    botocore = "this consumer: botocore's CPU per message in its calls, ms"
    header = ["CPU share", "latency", "batch", *NAMES, *(f"{name} ÷ this" for name in BASELINES), botocore]
    rows = []
    for key, samples in sorted(results.timings.items()):
        walls = [
            f"{_interval(samples[name].median_s, samples[name].ci_s)} (n={len(samples[name].wall_s)})" for name in NAMES
        ]
        ratios = [f"{samples[name].median_s / samples[CONSUMER].median_s:.1f}{TIMES}" for name in BASELINES]
        floor = _ms(statistics.median(samples[CONSUMER].botocore_cpu_s))
        rows.append([_share(key.memory_mb), f"{key.latency_ms} ms", str(key.batch_size), *walls, *ratios, floor])
    return _table(header, rows)


def _cpu_table(results: BenchResults) -> list[str]:
    header = ["CPU share", *NAMES, *(f"{name}: throttled per batch, ms" for name in NAMES)]
    rows = []
    for memory in results.memory_sizes_mb:
        if not (samples := results.samples(memory, TARGET_LATENCY_MS, TARGET_BATCH)):
            continue
        in_order = [samples[name] for name in NAMES]
        cpu = [_interval(each.cpu_per_record_s, median_ci(each.record_cpu_s)) for each in in_order]
        throttled = [f"{_ms(each.throttled_per_batch_s)} ({each.throttled_periods} periods)" for each in in_order]
        rows.append([_share(memory), *cpu, *throttled])
    return _table(header, rows)


def _unit_table(results: BenchResults) -> list[str]:
    header = ["handler", "case", *(f"{name}: calls / WCU / RCU" for name in NAMES)]
    rows = [
        [handler, case, *(" / ".join(f"{value:g}" for value in results.costs[name][handler][case]) for name in NAMES)]
        for handler in results.costs.get(CONSUMER, {})
        for case in CASES
    ]
    return _table(header, rows)


def handler_costs(results: BenchResults) -> list[str]:
    """Per handler, this consumer's write units per new message, duplicate and in-batch duplicate, and its cost
    per million at the target share (a guarded handler's claim is a transaction: 2 write units per item)."""
    header = ["handler", *(f"WCU per {case}" for case in CASES), f"USD per million at {TARGET_MEMORY_MB} MB"]
    rows = []
    for handler, costs in results.costs.get(CONSUMER, {}).items():
        cost = results.cost(CONSUMER, TARGET_MEMORY_MB, handler)
        usd = f"{cost.total_usd:.3f}" if cost else "(not timed)"
        rows.append([handler, *(f"{costs[case].write_units:g}" for case in CASES), usd])
    return _table(header, rows)


def _cost_table(results: BenchResults) -> list[str]:
    header = ["memory", "system", "batch of 10 median, ms", "Lambda", "DynamoDB", "SQS", "total, USD per million"]
    rows = []
    for memory in results.memory_sizes_mb:
        for name in NAMES:
            if cost := results.cost(name, memory):
                wall = results.samples(memory, TARGET_LATENCY_MS, TARGET_BATCH)[name].median_s
                usd = [f"{value:.3f}" for value in (cost.lambda_usd, cost.dynamodb_usd, cost.sqs_usd)]
                rows.append([f"{memory} MB", name, _ms(wall), *usd, f"**{cost.total_usd:.3f}**"])
    return _table(header, rows)


def _cold_share(share: int) -> str:
    if share == LAMBDA_SHARES:
        return f"as Lambda: init at full CPU, invocation at {TARGET_MEMORY_MB} MB"
    return "full CPU (no quota)" if share == FULL_CPU else _share(share)


def cold_start_section(starts: ColdStarts) -> list[str]:
    """Init, first invocation and their sum per system and share, the ratios, where the init's imports go."""
    rows = []
    for share, system in starts.init_s:
        series = (starts.init_s[share, system], starts.first_s[share, system], starts.total_s(share, system))
        spread = [_interval(statistics.median(values), median_ci(values)) for values in series]
        bases = [statistics.median(starts.total_s(share, name)) for name in (FLOOR, POWERTOOLS, COLD_CONSUMER)]
        ours = statistics.median(series[2])
        rows.append([_cold_share(share), system, *spread, *(f"{ours / base:.2f}{TIMES}" for base in bases)])
    header = ["CPU", "system", "init ms [95% CI]", "first invocation", "init + first", "÷ floor", "÷ Powertools"]
    header.append(f"÷ {COLD_CONSUMER}")
    lines = [*_table(header, rows), "", f"n = {len(next(iter(starts.init_s.values())))} fresh processes per row."]
    if systems := list(starts.import_ms):
        groups = sorted(set().union(*starts.import_ms.values()), key=lambda g: -starts.import_ms[systems[0]].get(g, 0))
        imports = [[g, *(f"{starts.import_ms[s].get(g, 0.0):.1f}" for s in systems)] for g in groups]
        lines += [
            "",
            "`python -X importtime` of each init at full CPU: each module's own time summed by top-level "
            "package, median over the profiled processes (importtime's overhead included), ms:",
            "",
            *_table(["package", *systems], imports),
        ]
    return lines


def cold_start_targets(starts: ColdStarts) -> list[str]:
    """Init + first invocation: at or below Powertools' at every share, within the target of the floor at full CPU."""
    verdicts = []
    for share in dict.fromkeys(share for share, _ in starts.init_s):
        ours, theirs, floor = (
            statistics.median(starts.total_s(share, name)) for name in (COLD_CONSUMER, POWERTOOLS, FLOOR)
        )
        verdict, clause = _against(ours / theirs, 1.0)
        line = f"- {verdict}: cold start, {_cold_share(share)}: {_ms(ours)} ms"
        line += f" against Powertools' {_ms(theirs)} ms ({clause})"
        if share == FULL_CPU:
            verdict, clause = _against(ours / floor, COLD_START_TARGET)
            line += f"; {verdict}: {ours / floor:.2f}{TIMES} the botocore floor's {_ms(floor)} ms ({clause})"
        verdicts.append(line + ".")
    return verdicts


def _against(value: float, target: float, *, at_least: bool = False) -> tuple[str, str]:
    """The verdict on ``value`` against ``target``, and the target's clause: e.g. "target ≤ 2x, over by 1.31x"."""
    met = value >= target if at_least else value <= target
    clause = f"target {'≥' if at_least else '≤'} {target:g}{TIMES}"
    if not met:
        clause += f", short by {target / value:.2f}{TIMES}" if at_least else f", over by {value / target:.2f}{TIMES}"
    return ("**met**" if met else "**missed**"), clause


def targets(results: BenchResults) -> list[str]:
    """One line per performance target, read at 512 MB, 10 ms, batch of 10 new messages."""
    verdicts = []
    batch = results.samples(TARGET_MEMORY_MB, TARGET_LATENCY_MS, TARGET_BATCH)
    single = results.samples(TARGET_MEMORY_MB, TARGET_LATENCY_MS, 1)
    ours, theirs = CONSUMER, POWERTOOLS
    if batch and single:
        ours_s, theirs_s = batch[ours].median_s, batch[theirs].median_s
        verdict, clause = _against(theirs_s / ours_s, SPEEDUP_TARGET, at_least=True)
        verdicts.append(
            f"- {verdict}: batch of 10 is {theirs_s / ours_s:.1f}{TIMES} faster than Powertools "
            f"({_ms(ours_s)} ms against {_ms(theirs_s)} ms; {clause})."
        )
        within = ours_s / single[ours].median_s
        verdict, clause = _against(within, SINGLE_RECORD_TARGET)
        server = [statistics.median(samples[ours].server_s) for samples in (batch, single)]
        one_s = single[ours].median_s
        verdicts.append(
            f"- {verdict}: batch of 10 takes {within:.2f}{TIMES} a single record ({_ms(ours_s)} ms against "
            f"{_ms(one_s)} ms; {clause}). DynamoDB Local's own time in the calls: {_ms(server[0])} against "
            f"{_ms(server[1])} ms; the rest, {(ours_s - server[0]) / (one_s - server[1]):.2f}{TIMES}."
        )
        cpu = batch[ours].cpu_per_record_s / batch[theirs].cpu_per_record_s
        verdict, _ = _against(cpu, CPU_TARGET)
        verdicts.append(
            f"- {verdict}: CPU per record {_ms(batch[ours].cpu_per_record_s)} ms against "
            f"Powertools' {_ms(batch[theirs].cpu_per_record_s)} ms, {cpu:.2f} of it (target ≤ {CPU_TARGET:g})."
        )
    verdicts += floor_targets(results) + outbox_target(results)
    if results.cold_starts:
        verdicts += cold_start_targets(results.cold_starts)
    ours_cost, their_cost = results.cost(ours, TARGET_MEMORY_MB), results.cost(theirs, TARGET_MEMORY_MB)
    if ours_cost and their_cost:
        verdict, _ = _against(ours_cost.total_usd, their_cost.total_usd)
        verdicts.append(
            f"- {verdict}: cost per million messages "
            f"${ours_cost.total_usd:.3f} against Powertools' ${their_cost.total_usd:.3f} "
            f"(DynamoDB ${ours_cost.dynamodb_usd:.3f} against ${their_cost.dynamodb_usd:.3f}: "
            f"{next(iter(results.costs[ours].values()))[NEW].write_units:g} write units per new message against "
            f"{next(iter(results.costs[theirs].values()))[NEW].write_units:g})."
        )
    return verdicts


def ratio_range(top: list[float], bottom: list[float]) -> tuple[float, float, float]:
    """The ratio of two medians, and its spread from their intervals, each end at its least favourable."""
    (top_low, top_high), (bottom_low, bottom_high) = median_ci(top), median_ci(bottom)
    return statistics.median(top) / statistics.median(bottom), top_low / bottom_high, top_high / bottom_low


def outbox_target(results: BenchResults) -> list[str]:
    """A batch of 10 payments that each emit one message against the same batch without, taking turns: wall time."""
    if not (outbox := results.outbox):
        return []
    (ours, base) = (outbox.turns[WITH], outbox.turns[WITHOUT])
    ratio, low, high = ratio_range(ours.wall_s, base.wall_s)
    verdict, clause = _against(ratio, OUTBOX_TARGET)
    return [
        f"- {verdict}: a batch of 10 payments that each emit a message takes {ratio:.2f}{TIMES} [{low:.2f}-{high:.2f}]"
        f" the same batch without ({_interval(ours.median_s, ours.ci_s)} ms, n={len(ours.wall_s)}, against "
        f"{_interval(base.median_s, base.ci_s)} ms, n={len(base.wall_s)}; {clause})."
    ]


def outbox_section(results: BenchResults) -> list[str]:
    """An emitted message's parts and their cost per million, and its chain's latency (methodology.md)."""
    if not (outbox := results.outbox):
        return []
    chain, parts = outbox.chain, outbox.parts()
    rows = [[part, f"{count:.3g}", f"{usd:.3f}"] for part, (count, usd) in parts.items()]
    rows.append(["**total**", "", f"**{sum(usd for _, usd in parts.values()):.3f}**"])
    per = [f"{getattr(outbox.units[name], unit):g}" for unit in ("calls", "write_units") for name in (WITH, WITHOUT)]
    records, latencies = chain.relay_records, chain.latencies_s
    p99 = statistics.quantiles(latencies, n=100, method="inclusive")[98]
    return [
        *_table(["per emitted message", "count", "USD per million"], rows),
        "",
        f"Per payment, with a message against without: {per[0]} against {per[1]} DynamoDB calls, {per[2]} against "
        f"{per[3]} write units. Relay: {len(records)} invocations of {sum(records)} records, "
        f"{sum(records) / len(records):.1f} each [{min(records)}-{max(records)}], as the figures assume (full batches"
        f" of the mapping's {outbox.relay_batch_size}: {1 / outbox.relay_batch_size:g} invocations), median "
        f"{_ms(statistics.median(chain.relay_wall_s))} ms each; {chain.sent} sends for {len(latencies)} messages.",
        "",
        f"- measured: the chain, from the payment function's invocation to the message's SentTimestamp: median "
        f"{_ms(statistics.median(latencies))} ms, p99 {_ms(p99)} ms "
        f"(n={len(latencies)}; 0-250 ms of each is the stream poller's wait for its next poll).",
    ]


def floor_targets(results: BenchResults) -> list[str]:
    """Per registered handler, this consumer's CPU per message in a batch of 10 new messages over botocore's own CPU in
    one message's DynamoDB calls (methodology.md: a lock handler's are its claim and its commit)."""
    verdicts = []
    for name, floor in results.floors.items():
        batch, single = floor.batch, floor.single.botocore_cpu_s
        floor_s = statistics.median(single)
        ratio, low, high = ratio_range(batch.record_cpu_s, single)
        untargeted = ("measured", "no target: its webhook's call is in it, not in the floor")
        verdict, clause = _against(ratio, FLOOR_TARGET) if floor.targeted else untargeted
        verdicts.append(
            f"- {verdict}: {name}: CPU per message {ratio:.2f}{TIMES} [{low:.2f}-{high:.2f}] botocore's own in "
            f"one message's calls ({_interval(batch.cpu_per_record_s, median_ci(batch.record_cpu_s))} ms, "
            f"n={len(batch.wall_s)}, against {_interval(floor_s, median_ci(single))} ms; {clause})."
        )
    for name, trio in results.lock_trios.items():
        calls = statistics.median(trio.calls)
        verdict = "**met**" if calls <= LOCK_TRIO_CALLS_TARGET else "**missed**"
        verdicts.append(
            f"- {verdict}: {name}: three lock messages whose handlers end together take {calls:g} DynamoDB calls, "
            f"median of {len(trio.calls)} batches [{min(trio.calls)}-{max(trio.calls)}] (target ≤ "
            f"{LOCK_TRIO_CALLS_TARGET}: the claims in one transaction, the commits in one)."
        )
    return verdicts


def hot_item_targets(results: BenchResults) -> list[str]:
    """The share of the hot item's messages handed back at least once, and the checks every run must pass: on the
    core's optimistic test handler (tests/core/handlers.py), a tally whose total proves each message applied once."""
    if not (runs := results.hot_item):
        return []
    shares = sorted(run.returned / racing.HOT_MESSAGES for run in runs)
    failed = [f"run {n}: {', '.join(run.failed_checks())}" for n, run in enumerate(runs, 1) if run.failed_checks()]
    return [
        f"- {'**met**' if statistics.median(shares) < HOT_RETURNED_TARGET else '**missed**'}: "
        f"{statistics.median(shares):.1%} of the messages handed back at least once, median of {len(runs)} runs "
        f"[{shares[0]:.1%}-{shares[-1]:.1%}] (target < {HOT_RETURNED_TARGET:.0%}).",
        f"- {'**FAILED**' if failed else '**passed**'}: the tally exact (its total, one entry a message) and none "
        f"dead-lettered, in {len(runs) - len(failed)} of {len(runs)} runs{''.join(f'; {line}' for line in failed)}.",
    ]


def hostile_section(results: BenchResults) -> list[str]:
    """Each message at SQS's limits against one valid message: the ratio of medians, with the range their intervals
    allow (the lower end over the valid message's upper end, and the reverse)."""
    if (valid := results.hostile.get(VALID)) is None:
        return []
    (valid_low, valid_high), rows = valid.ci_s, []
    for name, samples in sorted(results.hostile.items(), key=lambda item: item[1].median_s, reverse=True):
        low, high = samples.ci_s
        ratio = f"{samples.median_s / valid.median_s:.1f} [{low / valid_high:.1f}-{high / valid_low:.1f}]"
        rows.append([name, _interval(samples.median_s, samples.ci_s), ratio])
    return _table(["alone in its batch", "wall ms [95% CI]", "x one valid message [range]"], rows)


def benchmarks_markdown(results: BenchResults, charts: list[str], narrative: str) -> str:
    today = datetime.date.today().isoformat()
    sqs = ", ".join(f"{count:g} {request}" for request, count in sqs_requests(TARGET_BATCH).items())
    sections = {
        "## Targets (512 MB share, 10 ms injected latency, batch of 10 new messages on distinct keys)": (
            targets(results)
        ),
        "## Invocation wall time": [
            *_timing_table(results),
            "",
            f"![Batch wall time against injected DynamoDB latency]({charts[0]})",
        ],
        "## CPU per record (batch of 10, 10 ms), ms [95% CI]": _cpu_table(results),
        f"## Messages at SQS's limits (tests.core.hostile), this consumer at {_share(TARGET_MEMORY_MB)}, no latency": (
            hostile_section(results)
        ),
        f"## A hot item ({racing.HOT_MESSAGES} messages on one item, {racing.CONSUMERS} consumers, each its share)": (
            hot_item_targets(results)
        ),
        f"## An emitted message (the payment example's receipt request through the outbox, {_share(RELAY_MB)})": (
            outbox_section(results)
        ),
        "## Cold start (fresh processes from the built artifact: init, then one new message)": (
            cold_start_section(results.cold_starts) if results.cold_starts else []
        ),
        "## Cost per million messages (new messages, batches of 10, 10 ms latency)": [
            *_cost_table(results),
            "",
            f"![Cost per million messages against memory size]({charts[1]})",
            "",
            f"Prices: {PRICES_REGION}, as of {PRICES_AS_OF}; not fetched by the run (bench/costs.py).",
            "",
            *_table(["item", "price"], PRICE_TABLE),
            "",
            f"Lambda: each batch's median duration rounded up to the ms x memory, plus one request, per "
            f"{TARGET_BATCH} messages. SQS requests per message: {sqs}. "
            "DynamoDB: the request units of the table below.",
        ],
        "### What each registered handler costs (this consumer)": handler_costs(results),
        "### DynamoDB calls and request units per message (moto in-process, item sizes read around each write)": (
            _unit_table(results)
        ),
    }
    lines = [
        "# Benchmarks",
        "",
        f"Generated by `make bench` (`python -m bench`) on {today}; every figure below comes from one run, the "
        "three systems taking turns on the same record shapes. Each system is a Lambda function of its own "
        "(the Runtime Interface Emulator + awslambdaric on Python 3.13) under the cgroup CPU quota of the memory "
        "size in its row; DynamoDB Local behind the conflict emulation, and the harness, run outside it. Times "
        "are medians with their distribution-free 95% confidence interval [low-high] and the number of batches.",
        "",
        "| machine | |",
        "|---|---|",
        *(_row(fact) for fact in results.machine.items()),
        *(line for heading, body in sections.items() for line in ("", heading, "", *body)),
        "",
        narrative.strip(),
        "",
    ]
    return "\n".join(lines)


def stdout_report(results: BenchResults) -> str:
    """What this run measured (every section, or the one ``--only`` names), the targets' verdicts last."""
    cold = cold_start_section(results.cold_starts) if results.cold_starts else []
    parts = [_timing_table(results), _cpu_table(results), hostile_section(results), cold, handler_costs(results)]
    outbox = [line for line in outbox_section(results) if line not in outbox_target(results)]
    return "\n\n".join(
        "\n".join(part) for part in [*parts, outbox, targets(results), hot_item_targets(results)] if part
    )
