"""`python -m bench`: measure, then write docs/benchmarks.md and its two charts and print the table.

Sections in ``main``'s order (methodology.md); ``--only`` runs one section and prints it. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from operator import attrgetter
from pathlib import Path

from bench import report, timing
from bench.capacity import CapacityMeter
from bench.chart import draw_batch_latency_chart, draw_cost_chart
from bench.coldstart import measure_cold_starts
from bench.costs import Backend, Draws, handler_name, message_costs, moto_backend, timed_handler
from bench.outbox import WITH, WITHOUT, Outbox, emitter, emitting_batch, measure_chain, relay_batch_size, unit_costs
from bench.probe import RoundTripProbe, on_new_clients
from bench.report import TARGET_BATCH, TARGET_LATENCY_MS, TARGET_MEMORY_MB, BenchResults, TimingKey
from bench.systems import SYSTEM_ENV, SYSTEMS
from bench.timing import POWERTOOLS_ENV, REPO_ROOT, Turn, invoke, system_functions, time_batches, time_turns
from consumer.config import Settings
from consumer.handler import Mode
from consumer.outbox import OUTBOX_TABLE
from testkit.aws import client
from testkit.dynamodb_local import DynamoDBLocal, JavaNotFound, jar_directory, java_runtime
from testkit.lambda_runtime import LambdaEnvironment
from testkit.moto_server import MotoServer
from testkit.payloads import Handler, registered, valid_payloads
from testkit.servers import LocalServers
from testkit.webhook import WebhookSink
from tests.core.concurrency.racing import CONSUMERS, HOT_MESSAGES, hot_item
from tests.core.hostile import hostile_family

NARRATIVE = Path(__file__).resolve().parent / "methodology.md"
SECTIONS = ("cold-start", "hostile", "floor", "hot-item", "outbox")
_PACKAGES = ("boto3", "botocore", "moto", "aws-lambda-powertools", "pydantic")


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
    parser.add_argument("--cold-starts", type=int, default=9, help="fresh processes per system and CPU share")
    parser.add_argument("--only", choices=SECTIONS, help="one section, printed")
    parser.add_argument("--output", type=Path, default=REPO_ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--chart", type=Path, default=REPO_ROOT / "docs" / "img" / "batch-latency.png")
    parser.add_argument("--cost-chart", type=Path, default=REPO_ROOT / "docs" / "img" / "cost-per-million.png")
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


class _Run:
    def __init__(self, arguments: argparse.Namespace) -> None:
        self.arguments = arguments
        self.results = BenchResults(memory_sizes_mb=arguments.memory_sizes, latencies_ms=arguments.latencies_ms)
        self.settings: list[Settings] = []
        self.draws: Callable[[Handler], Draws] = Draws
        self.messages = Draws(timed_handler())

    def measure_costs(self, webhook_url: str) -> None:
        # In process, the systems read the variables the template gives the function from this process.
        os.environ.update(POWERTOOLS_ENV)
        probe = RoundTripProbe()
        with on_new_clients(probe.handler_specs()), moto_backend() as backend:
            meter = CapacityMeter(backend.reader)
            with on_new_clients(meter.handler_specs()):
                settings = [backend.settings(system.name, webhook_url) for system in SYSTEMS]
                systems = [system(each) for system, each in zip(SYSTEMS, settings, strict=True)]
            _progress("moto in-process: DynamoDB calls and capacity units per message, per handler")
            n = self.arguments.cost_messages
            for handler in registered():
                draws = Draws(handler, functools.partial(backend.seed, settings, handler))
                for system in systems:
                    costs = self.results.costs.setdefault(system.name, {})
                    costs[handler_name(handler)] = message_costs(system, draws, probe, meter, n)

    def measure_on_dynamodb_local(self, only: str | None = None) -> None:
        """Every system at every share; ``only``: this consumer at the target share, for that section alone."""
        _progress("DynamoDB Local behind the conflict emulation, SQS from moto's server (dead letters): starting")
        with DynamoDBLocal() as server, MotoServer() as sqs, WebhookSink() as webhook:
            queue = client("sqs", sqs.endpoint_url).create_queue(QueueName="bench-dead-letters")["QueueUrl"]
            backend = Backend(server.client(), queue)
            self.settings = [backend.settings(system.name, webhook.url) for system in SYSTEMS]
            self.draws = lambda handler: Draws(handler, functools.partial(backend.seed, self.settings, handler))
            self.messages = self.draws(self.messages.handler)
            endpoints = {"AWS_ENDPOINT_URL_DYNAMODB": server.endpoint_url, "AWS_ENDPOINT_URL_SQS": sqs.endpoint_url}
            variables = {
                system.name: {**timing.function_variables(settings), SYSTEM_ENV: system.name, **endpoints}
                for system, settings in zip(SYSTEMS, self.settings, strict=True)
            }
            if only:
                variables = {report.CONSUMER: variables[report.CONSUMER]}
            for index, memory_mb in enumerate([TARGET_MEMORY_MB] if only else self.arguments.memory_sizes):
                _progress(f"starting the functions at {memory_mb} MB")
                with system_functions(variables, memory_mb) as functions:
                    if index == 0:
                        self.warm_up(functions)
                    if memory_mb == TARGET_MEMORY_MB and only in (None, "hostile"):
                        self.time_hostile(functions[report.CONSUMER])
                    if memory_mb == TARGET_MEMORY_MB and only in (None, "floor"):
                        self.time_floors(functions[report.CONSUMER])
                    if memory_mb == TARGET_MEMORY_MB and only in (None, "outbox") and (emits := emitter(registered())):
                        self.measure_outbox(functions[report.CONSUMER], server, sqs.endpoint_url, emits)
                    if only:
                        return
                    # At the target share every latency and batch size; elsewhere the cost chart's point.
                    sizes = (1, TARGET_BATCH) if memory_mb == TARGET_MEMORY_MB else (TARGET_BATCH,)
                    latencies = self.arguments.latencies_ms if memory_mb == TARGET_MEMORY_MB else [TARGET_LATENCY_MS]
                    for key in (TimingKey(memory_mb, latency, size) for latency in latencies for size in sizes):
                        self.time(functions, key)

    def warm_up(self, functions: dict[str, LambdaEnvironment]) -> None:
        """DynamoDB Local's JVM compiles its hot paths during the first thousands of requests: pay that untimed."""
        batches = self.arguments.warm_up_batches
        _progress(f"warming DynamoDB Local's JVM: {batches} batches of {TARGET_BATCH} per system")
        for _ in range(batches):
            for function in functions.values():
                invoke(function, self.messages.bodies(TARGET_BATCH), 0)

    def time_hostile(self, function: LambdaEnvironment) -> None:
        """This consumer on each message at SQS's limits alone, against one valid message alone (no latency)."""
        _progress(f"{TARGET_MEMORY_MB} MB: each message at SQS's limits, alone, against one valid message")
        payload = valid_payloads(self.messages.handler, 1)[0]
        # Bodies alone: the benchmark's events carry no message attributes.
        family = [m for m in hostile_family(self.messages.handler.event_type, payload) if not m.message_attributes]
        batches: dict[str, Callable[[], list[str]]] = {m.name: functools.partial(list, (m.body,)) for m in family}
        for name, batch in {**batches, report.VALID: lambda: self.messages.bodies(1)}.items():
            self.results.hostile[name] = time_batches({name: function}, batch, 0, self.arguments)[name]

    def time_floors(self, function: LambdaEnvironment) -> None:
        """This consumer on each registered handler's batches of 10 new messages and single messages, at 10 ms."""
        for handler in registered():
            _progress(f"{TARGET_MEMORY_MB} MB, {TARGET_LATENCY_MS} ms: {handler.event_type}, batches of 10 and of 1")
            draws, ours = self.draws(handler), {report.CONSUMER: function}
            # The batches of 10 and the single messages take turns, so that the ratio's two sides are read in one
            # stretch of the machine's time (one after the other, a drift between them read as the consumer's), each
            # until its own figure of the target is precise: the batch's CPU per message, the single's botocore CPU.
            turns = {
                "batch": Turn(function, functools.partial(draws.bodies, TARGET_BATCH), attrgetter("record_cpu_s")),
                "single": Turn(function, functools.partial(draws.bodies, 1), attrgetter("botocore_cpu_s")),
            }
            timed = time_turns(turns, TARGET_LATENCY_MS, self.arguments)
            self.results.floors[handler_name(handler)] = report.Floor(
                timed["batch"], timed["single"], targeted=handler.mode is Mode.OPTIMISTIC
            )
            if handler.mode is Mode.LOCK:
                # Three lock messages whose handlers end together (the webhook answers each alike): their calls.
                trio = time_batches(ours, functools.partial(draws.bodies, 3), TARGET_LATENCY_MS, self.arguments)
                self.results.lock_trios[handler_name(handler)] = trio[report.CONSUMER]

    def measure_outbox(
        self, function: LambdaEnvironment, server: DynamoDBLocal, sqs_url: str, handler: Handler
    ) -> None:
        """The emitting handler's batches of 10: their units, their chain through the relay, with against without."""
        _progress(f"{TARGET_MEMORY_MB} MB: an emitted message's units, its chain through the relay, batches of 10")
        draws, settings = self.draws(handler), self.settings[0]  # this consumer's tables
        with _function_output_discarded():
            units = unit_costs(server, settings, draws, TARGET_BATCH)
        described = server.client().describe_table(TableName=settings.table_names[OUTBOX_TABLE])["Table"]
        clients = (client("sqs", sqs_url), client("dynamodbstreams", server.endpoint_url), sqs_url)
        chain = measure_chain(function, draws, clients, described["LatestStreamArn"], batches=20)
        turns = {
            name: Turn(function, functools.partial(emitting_batch, draws, emit))
            for name, emit in ((WITH, True), (WITHOUT, False))
        }
        timed = time_turns(turns, TARGET_LATENCY_MS, self.arguments)
        self.results.outbox = Outbox(units, chain, timed, relay_batch_size())

    def measure_hot_item(self) -> None:
        _progress(f"a hot item: {HOT_MESSAGES} messages on one tally, {CONSUMERS} consumers in this process")
        with LocalServers() as servers, _function_output_discarded():
            self.results.hot_item = [hot_item(servers) for _ in range(5)]  # five runs, for the share's spread

    def time(self, functions: dict[str, LambdaEnvironment], key: TimingKey) -> None:
        _progress(f"{key.memory_mb} MB: batches of {key.batch_size} at {key.latency_ms} ms")
        self.results.timings[key] = time_batches(
            functions, lambda: self.messages.bodies(key.batch_size), key.latency_ms, self.arguments
        )


def _cpu_model() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    models = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return models[0] if models else platform.processor() or "unknown"


def _describe_machine(dynamodb_local_version: str, load_at_start: float) -> dict[str, str]:
    # The load average counts runnable processes: above the CPU count, other work shared the machine.
    return {
        "CPUs usable (nproc)": str(len(os.sched_getaffinity(0))),
        "load average (1 min) at start / end of the run": f"{load_at_start:.2f} / {os.getloadavg()[0]:.2f}",
        "CPU model": _cpu_model(),
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        **{package: metadata.version(package) for package in _PACKAGES},
        "DynamoDB Local": dynamodb_local_version,
    }


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    started, load_at_start = time.monotonic(), os.getloadavg()[0]
    try:
        java_runtime()
        dynamodb_local_version = jar_directory().name.removeprefix("dynamodb_local_")
    except (JavaNotFound, FileNotFoundError) as error:
        print(f"make bench needs DynamoDB Local: {error}", file=sys.stderr)
        return 2
    run = _Run(arguments)
    results, only = run.results, arguments.only
    if only is None:
        with WebhookSink() as webhook, _function_output_discarded():
            run.measure_costs(webhook.url)
    if only in (None, "hostile", "floor", "outbox"):
        run.measure_on_dynamodb_local(only)
    if only in (None, "hot-item"):
        run.measure_hot_item()
    if only in (None, "cold-start"):
        _progress(f"cold starts: sam build, then {arguments.cold_starts} fresh processes per system at each CPU share")
        results.cold_starts = measure_cold_starts(arguments.cold_starts, TARGET_MEMORY_MB)
    if only is not None:
        print(report.stdout_report(results))
        return 0
    results.machine = _describe_machine(dynamodb_local_version, load_at_start)

    draw_batch_latency_chart(results, arguments.chart)
    draw_cost_chart(results, arguments.cost_chart)
    charts = [os.path.relpath(chart, arguments.output.parent) for chart in (arguments.chart, arguments.cost_chart)]
    arguments.output.write_text(report.benchmarks_markdown(results, charts, NARRATIVE.read_text()))
    print(report.stdout_report(results))
    _progress(f"wrote {arguments.output} and its charts in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
