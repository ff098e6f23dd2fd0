"""`python -m bench`: measure, then write BENCHMARKS.md and its two charts and print the table.

Order of a run: DynamoDB calls and capacity units per message (moto in-process, where a
hook can read every item's size); then DynamoDB Local behind the conflict emulation, its
JVM warmed, and each system as a Lambda function of its own at each memory size's CPU
share (``bench.timing``); this consumer profiled at the target share; cold starts in
fresh processes under the target share. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.backends import Backend, dynamodb_local_backend, moto_backend
from bench.capacity import CapacityMeter
from bench.chart import draw_batch_latency_chart, draw_cost_chart
from bench.cold_start import measure_cold_starts
from bench.costs import CostRecorder, message_costs
from bench.hooks import on_new_clients
from bench.machine import describe_machine, load_average
from bench.probe import RoundTripProbe
from bench.report import benchmarks_markdown, stdout_report
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
from bench.systems import PowertoolsBaseline, SeedPattern, ThisConsumer, build_systems
from bench.timing import invoke, system_functions, time_batches
from local.aws import DUMMY_CREDENTIALS_ENV
from local.conflict_emulation import ConflictEmulation, ConflictProxy
from local.dynamodb_local import JavaNotFound, jar_directory, java_runtime
from local.lambda_runtime import LambdaEnvironment
from testkit.messages import MessageFactory
from testkit.webhook import WebhookSink

REPO_ROOT = Path(__file__).resolve().parent.parent
NARRATIVE = Path(__file__).resolve().parent / "methodology.md"
_PROFILE_RECORDS = 100


def _integers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--memory-sizes", type=_integers, default=[512, 1024, 1769], help="MB, each its CPU share")
    parser.add_argument("--latencies-ms", type=_integers, default=[0, 10], help="injected per request, at 512 MB")
    parser.add_argument("--min-repetitions", type=int, default=15, help="timed batches per system, at least")
    parser.add_argument("--max-repetitions", type=int, default=40, help="at most, if the 95%% CI stays wider")
    parser.add_argument("--precision", type=float, default=0.10, help="the CI's half-width the run aims at")
    parser.add_argument("--warm-up-batches", type=int, default=20, help="per system, before timing (JVM)")
    parser.add_argument("--cost-messages", type=int, default=10, help="messages per case for calls and units")
    parser.add_argument("--cold-starts", type=int, default=20, help="fresh processes per system")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    parser.add_argument("--chart", type=Path, default=REPO_ROOT / "bench" / "batch-latency.png")
    parser.add_argument("--cost-chart", type=Path, default=REPO_ROOT / "bench" / "cost-per-million.png")
    return parser.parse_args(argv)


def _progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _function_output_discarded() -> Iterator[None]:
    """Point file descriptor 1 at /dev/null: in process, the systems' logs would bury the report."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(devnull)
        os.close(saved)


def _measure_costs(results: BenchResults, webhook_url: str, count: int) -> None:
    probe = RoundTripProbe()
    with on_new_clients(probe.handler_specs()), moto_backend() as backend:
        meter = CapacityMeter(backend.reader)
        with on_new_clients(meter.handler_specs()):
            systems = build_systems(backend, webhook_url)
        _progress("moto in-process: DynamoDB calls and capacity units per message")
        recorder = CostRecorder(probe, meter)
        factory = MessageFactory()
        results.costs = {system.name: message_costs(system, factory, recorder, count) for system in systems}


def _function_variables(backend: Backend, endpoint: str) -> dict[str, dict[str, str]]:
    variables = {}
    for name, prefix in (
        (ThisConsumer.name, "consumer"),
        (PowertoolsBaseline.name, "powertools"),
        (SeedPattern.name, "seed"),
    ):
        tables = backend.create_tables(prefix)
        variables[name] = {
            **DUMMY_CREDENTIALS_ENV,
            "AWS_ENDPOINT_URL_DYNAMODB": endpoint,
            "IDEMPOTENCY_TABLE_NAME": tables.idempotency,
            "LEDGER_TABLE_NAME": tables.ledger,
            "DEAD_LETTER_QUEUE_URL": backend.dead_letter_queue_url,
            # Never called: the benchmark sends only payments.
            "RECEIPT_WEBHOOK_URL": "http://127.0.0.1:9/receipts",
            "POWERTOOLS_SERVICE_NAME": "idempotent-consumer",
            "POWERTOOLS_METRICS_NAMESPACE": "IdempotentConsumer",
            "POWERTOOLS_LOG_LEVEL": "INFO",
        }
    return variables


def _warm_up(results: BenchResults, functions: dict[str, LambdaEnvironment], batches: int) -> None:
    """DynamoDB Local's JVM compiles its hot paths during the first thousands of requests: pay that untimed."""
    factory = MessageFactory()
    _progress(f"warming DynamoDB Local's JVM: {batches} batches of {TARGET_BATCH} per system")
    for _ in range(batches):
        for name, function in functions.items():
            answer = invoke(function, factory.payments(TARGET_BATCH), 0)
            results.warm_up_s.setdefault(name, []).append(answer["wall_s"])


def _time(
    results: BenchResults,
    functions: dict[str, LambdaEnvironment],
    key: TimingKey,
    arguments: argparse.Namespace,
) -> None:
    factory = MessageFactory()
    batch = factory.payments_on_one_account if key.hot else factory.payments
    share = "no quota" if key.memory_mb == NO_QUOTA else f"{key.memory_mb} MB"
    hot = ", one account" if key.hot else ""
    where = f" ({key.route})" if key.route else ""
    _progress(f"{share}: batches of {key.batch_size}{hot} at {key.latency_ms} ms{where}")
    results.timings[key] = time_batches(
        functions,
        lambda: batch(key.batch_size),
        latency_ms=0 if key.route == LATENCY_AT_PROXY else key.latency_ms,
        min_repetitions=arguments.min_repetitions,
        max_repetitions=arguments.max_repetitions,
        precision=arguments.precision,
    )


def _profile(results: BenchResults, consumer: LambdaEnvironment) -> None:
    """cProfile sees one thread: records on one account share one lane, which runs in the handler's thread.

    Each record still costs what a new payment costs (its own transaction), the lane pool aside.
    """
    _progress(f"{TARGET_MEMORY_MB} MB: this consumer under cProfile, {_PROFILE_RECORDS} records in one lane")
    bodies = MessageFactory().payments_on_one_account(_PROFILE_RECORDS)
    answer = invoke(consumer, bodies, TARGET_LATENCY_MS, profile=True)
    results.profile, results.profile_records = answer["profile"], _PROFILE_RECORDS


def _run_dynamodb_local(results: BenchResults, arguments: argparse.Namespace) -> None:
    _progress("DynamoDB Local behind the conflict emulation: starting")
    with dynamodb_local_backend() as backend:
        variables = _function_variables(backend, os.environ["AWS_ENDPOINT_URL_DYNAMODB"])
        shares = [*arguments.memory_sizes, NO_QUOTA]
        for index, memory_mb in enumerate(shares):
            _progress(f"starting the three functions at {memory_mb or 'no quota'} MB")
            with system_functions(variables, memory_mb or 1769, cpu_share=memory_mb != NO_QUOTA) as functions:
                if index == 0:
                    _warm_up(results, functions, arguments.warm_up_batches)
                if memory_mb == TARGET_MEMORY_MB:
                    for latency in arguments.latencies_ms:
                        for size in (1, TARGET_BATCH):
                            _time(results, functions, TimingKey(memory_mb, latency, size), arguments)
                else:  # the cost chart's point and the earlier run's setting: batches of 10 only
                    _time(results, functions, TimingKey(memory_mb, TARGET_LATENCY_MS, TARGET_BATCH), arguments)
                if memory_mb == TARGET_MEMORY_MB:
                    before = backend.proxy_stats() if backend.proxy_stats else {}
                    _time(results, functions, TimingKey(memory_mb, TARGET_LATENCY_MS, TARGET_BATCH, True), arguments)
                    after = backend.proxy_stats() if backend.proxy_stats else {}
                    results.hot_proxy_stats = {name: after[name] - before.get(name, 0) for name in after}
                    _profile(results, functions[ThisConsumer.name])
        _time_controls(results, backend, variables, arguments)


def _time_controls(
    results: BenchResults, backend: Backend, variables: dict[str, dict[str, str]], arguments: argparse.Namespace
) -> None:
    """The same tables and 512 MB functions, reached another way: latency at a proxy, or no proxy at all."""
    assert backend.upstream_url is not None
    emulation = ConflictEmulation(latency_ms=TARGET_LATENCY_MS)
    with ConflictProxy(backend.upstream_url, emulation) as proxy:
        for route, endpoint in ((LATENCY_AT_PROXY, proxy.endpoint_url), (DIRECT, backend.upstream_url)):
            routed = {name: {**values, "AWS_ENDPOINT_URL_DYNAMODB": endpoint} for name, values in variables.items()}
            with system_functions(routed, TARGET_MEMORY_MB) as functions:
                key = TimingKey(TARGET_MEMORY_MB, TARGET_LATENCY_MS, TARGET_BATCH, route=route)
                _time(results, functions, key, arguments)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    started, load_at_start = time.monotonic(), load_average()
    results = BenchResults(
        machine={},
        systems=[ThisConsumer.name, PowertoolsBaseline.name, SeedPattern.name],
        memory_sizes_mb=arguments.memory_sizes,
        latencies_ms=arguments.latencies_ms,
    )
    try:
        java_runtime()
        dynamodb_local_version = jar_directory().name.removeprefix("dynamodb_local_")
    except (JavaNotFound, FileNotFoundError) as error:
        print(f"make bench needs DynamoDB Local: {error}", file=sys.stderr)
        return 2
    with WebhookSink() as webhook, _function_output_discarded():
        _measure_costs(results, webhook.receipts_url, arguments.cost_messages)
    _run_dynamodb_local(results, arguments)
    _progress(f"cold starts: {arguments.cold_starts} fresh processes per system at {TARGET_MEMORY_MB} MB")
    results.cold_starts = measure_cold_starts(arguments.cold_starts, TARGET_MEMORY_MB)
    results.machine = describe_machine(dynamodb_local_version, (load_at_start, load_average()))

    draw_batch_latency_chart(results, arguments.chart)
    draw_cost_chart(results, arguments.cost_chart)
    charts = [os.path.relpath(chart, arguments.output.parent) for chart in (arguments.chart, arguments.cost_chart)]
    arguments.output.write_text(benchmarks_markdown(results, charts, NARRATIVE.read_text()))
    print(stdout_report(results))
    _progress(f"wrote {arguments.output} and its charts in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
