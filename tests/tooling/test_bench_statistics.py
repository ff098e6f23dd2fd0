"""The benchmark's arithmetic: the median's confidence interval, cost per million, hot batches."""

from __future__ import annotations

import itertools
import json
import random
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bench import __main__ as bench_main
from bench import timing
from bench.costs import (
    DYNAMODB_PER_WRITE_UNIT,
    LAMBDA_ARM64_PER_GB_S,
    Cost,
    Draws,
    cost_per_million,
    guarded,
    sqs_requests,
    timed_handler,
)
from bench.report import (
    NAMES,
    TARGET_BATCH,
    TARGET_LATENCY_MS,
    TIMES,
    VALID,
    BenchResults,
    Floor,
    TimingKey,
    _timing_table,
    floor_targets,
    hostile_section,
    hot_item_targets,
    targets,
)
from bench.timing import median_ci
from testkit.lambda_runtime import LambdaEnvironment
from tests.core.concurrency.racing import HOT_MESSAGES, HotItem
from tests.core.handlers import CallHandler, TallyHandler


def test_the_interval_of_twenty_samples_is_the_6th_and_15th_order_statistics() -> None:
    # The binomial(20, 1/2) table: P(B <= 5) = 2.07% <= 2.5% < P(B <= 6), so ranks 6 and 15 (1-based).
    values = [float(value) for value in range(1, 21)]
    random.Random(3).shuffle(values)
    assert median_ci(values) == (6.0, 15.0)


def test_the_interval_covers_the_true_median_about_95_percent_of_the_time() -> None:
    rng = random.Random(7)
    trials, covered = 2000, 0
    for _ in range(trials):
        # Skewed like batch times: a lognormal whose median is exactly 1.
        low, high = median_ci([rng.lognormvariate(0.0, 0.5) for _ in range(25)])
        covered += low <= 1.0 <= high
    assert 0.94 <= covered / trials <= 0.99


def test_too_few_samples_give_the_whole_range() -> None:
    assert median_ci([3.0, 1.0, 2.0]) == (1.0, 3.0)


def test_lambda_bills_each_batch_rounded_up_to_the_millisecond() -> None:
    nothing = Cost(calls=0, write_units=0, read_units=0)
    at_100_1 = cost_per_million(0.1001, 10, 1024, nothing)
    at_101 = cost_per_million(0.101, 10, 1024, nothing)
    assert at_100_1.lambda_usd == pytest.approx(at_101.lambda_usd)
    # 100,000 batches of 101 ms at 1 GB, plus 100,000 requests.
    assert at_101.lambda_usd == pytest.approx(100_000 * (0.101 * LAMBDA_ARM64_PER_GB_S + 0.2e-6))


def test_dynamodb_cost_follows_the_write_units() -> None:
    six = cost_per_million(0.05, 10, 512, Cost(calls=1, write_units=6, read_units=0))
    four = cost_per_million(0.05, 10, 512, Cost(calls=4, write_units=4, read_units=0))
    assert six.dynamodb_usd == pytest.approx(6 * DYNAMODB_PER_WRITE_UNIT * 1e6)
    assert six.dynamodb_usd - four.dynamodb_usd == pytest.approx(2 * DYNAMODB_PER_WRITE_UNIT * 1e6)


def test_sqs_requests_per_message_shrink_with_the_batch() -> None:
    assert sum(sqs_requests(10).values()) == pytest.approx(1.2)
    assert sum(sqs_requests(1).values()) == pytest.approx(3.0)


def test_draws_are_distinct_messages_of_the_handler_each_seeded_once() -> None:
    seeded: list[list[dict[str, object]]] = []
    draws = Draws(TallyHandler, seeded.append)
    bodies = [json.loads(body) for body in draws.bodies(10) + draws.bodies(10)]
    assert {body["eventType"] for body in bodies} == {TallyHandler.event_type}
    assert len({body["metadata"]["idempotencyKey"] for body in bodies}) == 20
    assert len({json.dumps(body["payload"], sort_keys=True) for body in bodies}) == 20
    assert [payload for batch in seeded for payload in batch] == [body["payload"] for body in bodies]


def test_each_drawn_message_names_business_items_of_its_own() -> None:
    # Polyfactory's identifiers are short and repeat within a few hundred draws: each message names a tally and
    # an entry of its own, so that none is refused for another's unit or entry.
    draws = Draws(TallyHandler)
    payloads = [json.loads(body)["payload"] for _ in range(30) for body in draws.bodies(10)]
    for field in ("tallyId", "entryId"):
        assert len({payload[field] for payload in payloads}) == 300


def test_a_failed_invocation_names_what_the_function_logged_as_warnings_and_errors() -> None:
    function = cast(LambdaEnvironment, object())
    timing._logs[function] = log = timing._LastLog()
    log.write("START\n" + json.dumps({"level": "INFO", "message": "applied"}))
    warning = {"level": "WARNING", "message": "dead-lettered", "idempotency_key": "k-1", "reason": "unit refused"}
    log.write("START\n" + json.dumps(warning) + "\nEND\n")  # only the last invocation's log is kept
    assert timing._why_failed(function) == "dead-lettered k-1 unit refused"


def test_the_timed_handler_is_the_first_optimistic_one_and_a_guard_is_seen() -> None:
    assert timed_handler((CallHandler, TallyHandler)) is TallyHandler
    with pytest.raises(SystemExit, match="none is registered"):
        timed_handler((CallHandler,))

    class Guarded(TallyHandler):
        def guard(self, payload: object, context: object) -> None:
            return None

    assert (guarded(TallyHandler), guarded(Guarded)) == (False, True)


def test_messages_at_sqs_limits_are_listed_slowest_first_with_their_ratio_to_a_valid_message() -> None:
    def samples(*seconds: float) -> timing.Samples:
        return timing.Samples(wall_s=list(seconds))

    results = BenchResults(memory_sizes_mb=[512], latencies_ms=[0])
    # Fewer than six samples: the interval is the lowest and the highest.
    results.hostile = {VALID: samples(0.01, 0.02), "wide": samples(0.2, 0.3), "long": samples(0.03, 0.05)}

    table = hostile_section(results)

    assert [row.split(" | ")[0].strip("| ") for row in table[2:]] == ["wide", "long", VALID]
    # Medians 0.25 and 0.015: 16.7; the range pairs 0.2 with 0.02 and 0.3 with 0.01.
    assert table[2].endswith("| 16.7 [10.0-30.0] |")
    assert hostile_section(BenchResults(memory_sizes_mb=[512], latencies_ms=[0])) == []


def test_cpu_per_message_is_read_against_botocores_own_cpu_in_one_messages_call_for_each_handler() -> None:
    def batch(cpu_ms: float, botocore_ms: float) -> timing.Samples:
        return timing.Samples(
            wall_s=[0.05] * 6,
            record_cpu_s=[cpu_ms / 1000] * 6,
            botocore_cpu_s=[botocore_ms / 1000] * 6,
            server_s=[0.02] * 6,
        )

    results = BenchResults(memory_sizes_mb=[512], latencies_ms=[TARGET_LATENCY_MS])
    # Per handler (a batch of 10, one message): one message's calls cost botocore 4 ms; the batch's messages 2 ms of
    # CPU each, over the 0.3 target. A lock handler's floor (its claim and commit): 10 ms, read against no target.
    results.floors = {
        "Tally (optimistic)": Floor(batch(2.0, 0.3), batch(6.0, 4.0), targeted=True),
        "Call (lock)": Floor(batch(5.0, 1), batch(12, 10), targeted=False),
    }
    results.timings[TimingKey(512, TARGET_LATENCY_MS, 1)] = {name: batch(6.0, 4.0) for name in NAMES}
    results.timings[TimingKey(512, TARGET_LATENCY_MS, TARGET_BATCH)] = {name: batch(2.0, 0.3) for name in NAMES}

    tally, call = floor_targets(results)
    assert tally.startswith(f"- **missed**: Tally (optimistic): CPU per message 0.50{TIMES} [0.50-0.50] botocore's own")
    assert tally.endswith(f"against 4.00 [4.00-4.00] ms; target ≤ 0.3{TIMES}, over by 1.67{TIMES}).")
    assert call.startswith(f"- measured: Call (lock): CPU per message 0.50{TIMES} [0.50-0.50]")
    assert call.endswith("; no target: its webhook's call is in it, not in the floor).")
    assert targets(results)[-2:] == [tally, call]
    # The ratio's interval takes each side's interval at its least favourable end: 1.5/5 and 2.5/3.
    spread = Floor(
        timing.Samples(wall_s=[0.05] * 3, record_cpu_s=[0.0015, 0.002, 0.0025]),
        timing.Samples(wall_s=[0.05] * 3, botocore_cpu_s=[0.004, 0.005, 0.003]),
        targeted=True,
    )
    spread_results = BenchResults(memory_sizes_mb=[512], latencies_ms=[TARGET_LATENCY_MS], floors={"Tally": spread})
    assert f"CPU per message 0.50{TIMES} [0.30-0.83] botocore's own" in floor_targets(spread_results)[0]
    assert floor_targets(BenchResults(memory_sizes_mb=[512], latencies_ms=[TARGET_LATENCY_MS])) == []
    # Three lock messages whose handlers end together: the median batch's DynamoDB calls against two.
    results.lock_trios = {"Call (lock)": timing.Samples(calls=[2, 3, 2, 2, 3])}
    assert floor_targets(results)[-1] == (
        "- **met**: Call (lock): three lock messages whose handlers end together take 2 DynamoDB calls, median of 5"
        " batches [2-3] (target ≤ 2: the claims in one transaction, the commits in one)."
    )
    results.lock_trios = {"Call (lock)": timing.Samples(calls=[3, 3, 2])}
    assert floor_targets(results)[-1].startswith("- **missed**: Call (lock): three lock messages")
    assert "| 0.30 |" in _timing_table(results)[3] and "| 4.00 |" in _timing_table(results)[2]


def test_the_batch_against_one_message_is_also_read_without_dynamodb_locals_own_time_in_the_calls() -> None:
    def samples(wall_ms: float, server_ms: float) -> timing.Samples:
        return timing.Samples(
            wall_s=[wall_ms / 1000] * 6,
            record_cpu_s=[0.001] * 6,
            botocore_cpu_s=[0.001] * 6,
            server_s=[server_ms / 1000] * 6,
        )

    results = BenchResults(memory_sizes_mb=[512], latencies_ms=[TARGET_LATENCY_MS])
    # 60 ms against 25: 2.40x; 30 and 10 of them at DynamoDB Local's end, so the rest is 30 against 15: 2.00x.
    results.timings[TimingKey(512, TARGET_LATENCY_MS, 1)] = {name: samples(25, 10) for name in NAMES}
    results.timings[TimingKey(512, TARGET_LATENCY_MS, TARGET_BATCH)] = {name: samples(60, 30) for name in NAMES}
    [line] = [line for line in targets(results) if "a single record" in line]
    assert line.startswith(f"- **missed**: batch of 10 takes 2.40{TIMES} a single record")
    assert line.endswith(f"DynamoDB Local's own time in the calls: 30.0 against 10.0 ms; the rest, 2.00{TIMES}.")


def test_the_hot_items_returned_share_is_a_median_with_its_range_and_a_failed_check_is_printed_as_failed() -> None:
    def run(returned: int, total: int = sum(range(1, HOT_MESSAGES + 1)), dead: int = 0) -> HotItem:
        return HotItem(returned=returned, total=total, entries=HOT_MESSAGES, dead_lettered=dead)

    results = BenchResults(memory_sizes_mb=[512], latencies_ms=[TARGET_LATENCY_MS])
    results.hot_item = [run(1), run(0), run(3)]
    share, checks = hot_item_targets(results)
    assert (
        share
        == "- **met**: 0.5% of the messages handed back at least once, median of 3 runs [0.0%-1.5%] (target < 1%)."
    )
    assert checks.startswith("- **passed**:") and checks.endswith("in 3 of 3 runs.")

    results.hot_item = [run(4, total=7), run(2), run(2, dead=1)]
    share, checks = hot_item_targets(results)
    assert share.startswith("- **missed**: 1.0% of the messages")
    assert checks.startswith("- **FAILED**:") and "in 1 of 3 runs" in checks
    assert "run 1: the total 7, not 20100" in checks and "run 3: 1 dead-lettered" in checks
    assert hot_item_targets(BenchResults(memory_sizes_mb=[512], latencies_ms=[0])) == []


class _SteadyWallNoisyCpu:
    """A function whose every batch takes the same wall time, while its CPU per record swings by half each time; it
    notes the size of each batch it is given, in the order given."""

    name, quota = "steady", None

    def __init__(self, sizes: list[int] | None = None) -> None:
        self.invocations = 0
        self.sizes = [] if sizes is None else sizes

    def invoke(self, request: dict[str, Any]) -> object:
        self.invocations += 1
        self.sizes.append(len(request["event"]["Records"]))
        cpu = 0.001 if self.invocations % 2 else 0.002
        response = {"wall_s": 0.01, "cpu_s": cpu, "failed": 0, "botocore_cpu_s": cpu, "server_s": 0.0, "calls": 1}

        return SimpleNamespace(succeeded=True, error=None, response=response)


_LIMITS = type("Limits", (), {"min_repetitions": 15, "max_repetitions": 40, "precision": 0.10})


@pytest.mark.parametrize(("aim", "repetitions"), [(None, 15), ("record_cpu_s", 40)])
def test_a_cpu_target_is_timed_until_its_cpu_figure_is_precise_not_only_its_wall_time(
    aim: str | None, repetitions: int
) -> None:
    # The floor's verdict reads the CPU per record: a run stopped once the wall time was precise left its spread wide.
    function = cast(LambdaEnvironment, _SteadyWallNoisyCpu())
    turn = timing.Turn(function, lambda: ["{}"])
    if aim is not None:
        turn = timing.Turn(function, lambda: ["{}"], lambda samples: getattr(samples, aim))

    samples = timing.time_turns({"steady": turn}, 0, _LIMITS)["steady"]

    assert len(samples.wall_s) == repetitions


def test_the_floors_two_sides_take_turns_so_their_ratio_is_read_in_one_stretch_of_time() -> None:
    # Batches of 10 first and single messages after, a drift of the machine between the two was read as the consumer's
    # (seven runs of the floor read 0.21x to 0.34x). Taking turns, no more than two of one kind run in a row.
    sizes: list[int] = []
    function = cast(LambdaEnvironment, _SteadyWallNoisyCpu(sizes))
    turns = {"batch": timing.Turn(function, lambda: ["{}"] * 10), "single": timing.Turn(function, lambda: ["{}"])}

    samples = timing.time_turns(turns, 0, _LIMITS)

    timed = sizes[2:]  # after one untimed batch of each
    assert len(samples["batch"].wall_s) == len(samples["single"].wall_s) == 15
    assert sorted(set(timed)) == [1, 10]
    longest = max(len(list(run)) for _, run in itertools.groupby(timed))
    assert longest <= 2


def test_the_bench_times_each_handlers_floor_with_its_two_sides_in_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    # The floor's own runner, not only the timing loop: a return to the batches first and the singles after fails here.
    monkeypatch.setattr(bench_main, "registered", lambda: [TallyHandler])
    monkeypatch.setattr(bench_main, "timed_handler", lambda: TallyHandler)
    run = bench_main._Run(bench_main.parse_arguments(["--min-repetitions", "15", "--max-repetitions", "15"]))
    run.draws = lambda handler: cast(Draws, type("Bodies", (), {"bodies": staticmethod(lambda n: ["{}"] * n)})())
    sizes: list[int] = []

    run.time_floors(cast(LambdaEnvironment, _SteadyWallNoisyCpu(sizes)))

    (floor,) = run.results.floors.values()
    assert (len(floor.batch.wall_s), len(floor.single.wall_s)) == (15, 15)
    timed = sizes[2:]  # after one untimed batch of each
    assert max(len(list(run)) for _, run in itertools.groupby(timed)) <= 2
