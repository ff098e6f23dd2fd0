"""The benchmark's outbox section: the bodies it draws, what an emitted message adds, its parts' prices, the report."""

from __future__ import annotations

import functools
import json
import statistics

import pytest

from bench import costs
from bench.capacity import CapacityMeter
from bench.costs import Cost, Draws, batch_cost, moto_backend
from bench.outbox import EMITTING_FIELD, MEMORY_MB, WITH, WITHOUT, Chain, Outbox, emitter, emitting_batch
from bench.probe import RoundTripProbe, on_new_clients
from bench.report import OUTBOX_TARGET, TIMES, BenchResults, outbox_section, outbox_target, targets
from bench.systems import ThisConsumer
from bench.timing import POWERTOOLS_ENV, Samples
from testkit.payloads import refusal, registered
from testkit.webhook import WebhookSink


def _outbox(
    with_ms: float = 130.4, without_ms: float = 120.1, latencies_ms: tuple[float, ...] = (100.0,), sent: int = 1
) -> Outbox:
    chain = Chain(
        latencies_s=[ms / 1000 for ms in latencies_ms],
        relay_wall_s=[0.1004, 0.2],  # billed 101 and 200 ms
        relay_records=[4, 16],
        sent=sent,
    )
    turns = {WITH: Samples(wall_s=[with_ms / 1000] * 6), WITHOUT: Samples(wall_s=[without_ms / 1000] * 6)}
    units = {WITH: Cost(calls=0.1, write_units=8.0, read_units=0.0), WITHOUT: Cost(0.1, 6.0, 0.0)}
    return Outbox(units, chain, turns, relay_batch_size=100)


def test_drawn_payments_ask_for_a_receipt_or_not_and_stay_valid() -> None:
    handler = emitter(registered())
    assert handler is not None and handler.destinations
    draws = Draws(handler)
    for emit in (True, False):
        bodies = [json.loads(body) for body in emitting_batch(draws, emit, count=5)]
        assert all((EMITTING_FIELD in body["payload"]) is emit for body in bodies)
        assert all(refusal(handler.payload_model, body["payload"]) is None for body in bodies)
        assert len({body["metadata"]["idempotencyKey"] for body in bodies}) == 5


def test_an_emitted_message_adds_its_outbox_items_write_units_to_its_transaction_and_no_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in POWERTOOLS_ENV.items():
        monkeypatch.setenv(name, value)
    handler, probe = emitter(registered()), RoundTripProbe()
    assert handler is not None
    with on_new_clients(probe.handler_specs()), moto_backend() as backend, WebhookSink() as webhook:
        meter = CapacityMeter(backend.reader)
        with on_new_clients(meter.handler_specs()):
            settings = backend.settings(ThisConsumer.name, webhook.url)
            consumer = ThisConsumer(settings)
        draws = Draws(handler, functools.partial(backend.seed, [settings], handler))
        with_, without = (
            batch_cost(consumer, emitting_batch(draws, emit, 3), probe, meter, 3) for emit in (True, False)
        )
    assert with_.calls == without.calls == pytest.approx(1 / 3)  # the three in one transaction either way
    # One more item under 1 KB per message, inside a transaction: 2 write units.
    assert with_.write_units - without.write_units == pytest.approx(2)


def test_an_emitted_messages_parts_are_priced_from_the_counts_measured() -> None:
    parts = _outbox(sent=3, latencies_ms=(100.0, 200.0)).parts()
    gb_s = (0.101 + 0.200) * MEMORY_MB / 1024 / 20  # billed to the ms, over the 20 records relayed
    expected = {
        "outbox item's write units": (8.0 - 6.0, costs.DYNAMODB_PER_WRITE_UNIT),
        "relay invocations": (2 / 20, costs.LAMBDA_PER_REQUEST),
        f"relay's Lambda GB-s at {MEMORY_MB} MB": (gb_s, costs.LAMBDA_ARM64_PER_GB_S),
        "sends (SQS requests)": (3 / 2, costs.SQS_PER_REQUEST),  # a copy sent twice counts
        "source's extra Lambda GB-s (with - without)": (
            (0.131 - 0.121) * MEMORY_MB / 1024 / 10,
            costs.LAMBDA_ARM64_PER_GB_S,
        ),
    }
    assert list(parts) == list(expected)
    for part, (count, price) in expected.items():
        assert parts[part] == pytest.approx((count, count * price * 1e6)), part


def test_the_section_gives_the_chains_median_and_p99_and_the_relays_records_per_invocation() -> None:
    latencies = tuple(float(ms) for ms in range(1, 101))
    results = BenchResults(memory_sizes_mb=[512], latencies_ms=[10], outbox=_outbox(latencies_ms=latencies, sent=100))
    section = "\n".join(outbox_section(results))
    p99 = statistics.quantiles(latencies, n=100, method="inclusive")[98]
    assert f"median {statistics.median(latencies):.1f} ms, p99 {p99:.1f} ms (n=100;" in section
    assert "2 invocations of 20 records, 10.0 each [4-16]" in section
    assert "full batches of the mapping's 100: 0.01 invocations" in section
    total = sum(usd for _, usd in results.outbox.parts().values()) if results.outbox else 0.0
    assert f"| **total** |  | **{total:.3f}** |" in section
    assert outbox_section(BenchResults(memory_sizes_mb=[512], latencies_ms=[10])) == []


@pytest.mark.parametrize("with_ms", [149.0, 151.0])
def test_the_batch_with_messages_is_held_within_the_target_of_the_batch_without(with_ms: float) -> None:
    results = BenchResults(memory_sizes_mb=[512], latencies_ms=[10], outbox=_outbox(with_ms=with_ms, without_ms=100))
    [line] = outbox_target(results)
    ratio = with_ms / 100
    assert line.startswith(f"- **{'met' if ratio <= OUTBOX_TARGET else 'missed'}**: a batch of 10 payments")
    assert f"takes {ratio:.2f}{TIMES} [{ratio:.2f}-{ratio:.2f}] the same batch without" in line
    assert line in targets(results)
