"""`python -m bench`: measure, then write BENCHMARKS.md and its chart and print the table.

Order of a run: DynamoDB calls and capacity units per message (moto in-process), batch
wall time and CPU per record at each injected latency (moto in-process, then DynamoDB
Local), cold starts in fresh processes. Progress goes to stderr; the function's own
output (its JSON logs and metrics) is sent to /dev/null while it runs, as it would
leave the process for CloudWatch in Lambda.
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
from bench.chart import draw_batch_latency_chart
from bench.cold_start import measure_cold_starts
from bench.costs import CostRecorder, message_costs
from bench.hooks import on_new_clients
from bench.machine import describe_machine, load_average
from bench.probe import RoundTripProbe
from bench.report import benchmarks_markdown, stdout_report
from bench.results import DYNAMODB_LOCAL, MOTO, BenchResults, TimingKey
from bench.systems import (
    LambdaSystem,
    PowertoolsBaseline,
    SeedPattern,
    ThisConsumer,
    ThisConsumerQuiet,
    build_systems,
)
from bench.timing import time_batches
from local.dynamodb_local import JavaNotFound, jar_directory, java_runtime
from testkit.messages import MessageFactory
from testkit.webhook import WebhookSink

REPO_ROOT = Path(__file__).resolve().parent.parent
NARRATIVE = Path(__file__).resolve().parent / "methodology.md"


def _integers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--latencies-ms", type=_integers, default=[0, 5, 10], help="injected per request")
    parser.add_argument("--batch-sizes", type=_integers, default=[1, 10, 100])
    parser.add_argument("--repetitions", type=int, default=12, help="timed batches per system, batches up to 10")
    parser.add_argument("--large-repetitions", type=int, default=4, help="timed batches per system, larger ones")
    parser.add_argument("--cost-messages", type=int, default=10, help="messages per case for calls and units")
    parser.add_argument("--cold-starts", type=int, default=20, help="fresh processes per system")
    parser.add_argument("--no-dynamodb-local", action="store_true", help="skip the DynamoDB Local runs")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "BENCHMARKS.md")
    parser.add_argument("--chart", type=Path, default=REPO_ROOT / "bench" / "batch-latency.png")
    return parser.parse_args(argv)


def _progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _function_output_discarded() -> Iterator[None]:
    """Point file descriptor 1 at /dev/null: Powertools' handlers hold the original stdout."""
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


def _time_backend(
    results: BenchResults,
    backend: Backend,
    systems: list[LambdaSystem],
    probe: RoundTripProbe,
    arguments: argparse.Namespace,
) -> None:
    factory = MessageFactory()
    tables = [
        name
        for system in systems
        for name in (system.settings.idempotency_table_name, system.settings.ledger_table_name)
    ]
    for latency in results.latencies_ms:
        probe.latency_s = latency / 1000
        for size in results.batch_sizes:
            repetitions = arguments.repetitions if size <= 10 else arguments.large_repetitions
            _progress(f"{backend.name}: batches of {size}, {latency} ms latency, {repetitions} per system")
            results.timings[TimingKey(backend.name, latency, size)] = time_batches(
                systems,
                factory,
                probe,
                batch_size=size,
                repetitions=repetitions,
                before_batch=lambda: backend.empty_tables(tables),
            )
    probe.latency_s = 0.0


def _run_moto(results: BenchResults, probe: RoundTripProbe, webhook_url: str, arguments: argparse.Namespace) -> None:
    with moto_backend() as backend:
        meter = CapacityMeter(backend.reader)
        with on_new_clients(meter.handler_specs()):
            systems = build_systems(backend, webhook_url)
        _progress(f"{MOTO}: DynamoDB calls and capacity units per message")
        recorder = CostRecorder(probe, meter)
        factory = MessageFactory()
        results.costs = {
            system.name: message_costs(system, factory, recorder, arguments.cost_messages) for system in systems
        }
        meter.enabled = False
        _time_backend(results, backend, systems, probe, arguments)
        consumer = systems[0]
        assert isinstance(consumer, ThisConsumer)
        largest = max(results.batch_sizes)
        _progress(f"{MOTO}: this consumer with logs at INFO and at WARNING in turns, batches of {largest}")
        results.quiet_consumer = time_batches(
            [consumer, ThisConsumerQuiet(consumer)],
            factory,
            probe,
            batch_size=largest,
            repetitions=arguments.large_repetitions,
            before_batch=lambda: backend.empty_tables(
                [consumer.settings.idempotency_table_name, consumer.settings.ledger_table_name]
            ),
        )


def _dynamodb_local_available(results: BenchResults) -> str | None:
    """DynamoDB Local's version, or None (with a note saying why) when it cannot run here."""
    try:
        java_runtime()
        return jar_directory().name.removeprefix("dynamodb_local_")
    except (JavaNotFound, FileNotFoundError) as error:
        results.notes.append(f"The {DYNAMODB_LOCAL} runs were skipped: {error}")
        return None


def _run_dynamodb_local(
    results: BenchResults, probe: RoundTripProbe, webhook_url: str, arguments: argparse.Namespace
) -> None:
    _progress(f"{DYNAMODB_LOCAL}: starting")
    with dynamodb_local_backend() as backend:
        systems = build_systems(backend, webhook_url)
        _time_backend(results, backend, systems, probe, arguments)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    started, load_at_start = time.monotonic(), load_average()
    probe = RoundTripProbe()
    dynamodb_local_version = None
    results = BenchResults(
        machine={},
        systems=[ThisConsumer.name, PowertoolsBaseline.name, SeedPattern.name],
        latencies_ms=arguments.latencies_ms,
        batch_sizes=arguments.batch_sizes,
    )
    if arguments.no_dynamodb_local:
        results.notes.append(f"The {DYNAMODB_LOCAL} runs were skipped (--no-dynamodb-local).")
    else:
        dynamodb_local_version = _dynamodb_local_available(results)
    with _function_output_discarded():
        with on_new_clients(probe.handler_specs()), WebhookSink() as webhook:
            _run_moto(results, probe, webhook.receipts_url, arguments)
            if dynamodb_local_version is not None:
                _run_dynamodb_local(results, probe, webhook.receipts_url, arguments)
        _progress(f"cold starts: {arguments.cold_starts} fresh processes per system")
        results.cold_starts = measure_cold_starts(arguments.cold_starts)
    results.machine = describe_machine(dynamodb_local_version, (load_at_start, load_average()))

    draw_batch_latency_chart(results, arguments.chart)
    chart_link = os.path.relpath(arguments.chart, arguments.output.parent)
    arguments.output.write_text(benchmarks_markdown(results, chart_link, NARRATIVE.read_text()))
    print(stdout_report(results))
    _progress(f"wrote {arguments.output} and {arguments.chart} in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
