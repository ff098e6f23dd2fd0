"""Round trips per message, counted by the benchmark's own botocore hook.

A change that adds a DynamoDB call to a message's path (a read before a write, a
second transaction, a call for an in-batch duplicate) fails here before it shows up
in ``make bench``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from bench.capacity import CapacityMeter, item_size, number_size, read_units, write_units
from bench.costs import (
    DUPLICATE,
    DUPLICATE_IN_BATCH,
    NEW,
    Backend,
    Cost,
    Draws,
    message_costs,
    moto_backend,
    run_batch,
)
from bench.probe import RoundTripProbe, on_new_clients
from bench.systems import ThisConsumer
from consumer.handler import MessageHandler
from testkit.messages import envelope
from testkit.webhook import WebhookSink
from tests.core.handlers import CallHandler, TallyHandler, create_test_tables

HANDLERS = (TallyHandler, CallHandler)


@pytest.fixture
def probe() -> RoundTripProbe:
    return RoundTripProbe()


@pytest.fixture
def backend(probe: RoundTripProbe) -> Iterator[Backend]:
    with on_new_clients(probe.handler_specs()), moto_backend() as backend:
        yield replace(backend, handlers=HANDLERS, create_tables=create_test_tables)


@pytest.fixture(params=[True, False], ids=["grouped", "alone"])
def grouped(request: pytest.FixtureRequest) -> bool:
    """Whether the consumer runs a batch's lanes' first messages as a group, each mode's apart (GROUP_COMMIT)."""
    return bool(request.param)


@pytest.fixture
def consumer_costs(backend: Backend, probe: RoundTripProbe, grouped: bool) -> dict[str, dict[str, Cost]]:
    """Per test handler (tests/core/handlers.py), each case's cost per message, in batches of 3."""
    meter = CapacityMeter(backend.reader)
    with WebhookSink() as webhook:
        with on_new_clients(meter.handler_specs()):
            # Which messages share a transaction is the count's to say, not a loaded machine's scheduler: a shared
            # send waits for every lane's thread up to 100 ms (the tests' bound, a tenth of the shortest lease).
            settings = backend.settings(ThisConsumer.name, webhook.url).model_copy(
                update={"group_commit": grouped, "group_commit_wait_ms": 100}
            )
            handlers: dict[str, MessageHandler[Any]] = {
                TallyHandler.event_type: TallyHandler(settings),
                CallHandler.event_type: CallHandler(settings, webhook.url),
            }
            consumer = ThisConsumer(settings, handlers)
        return {
            handler.event_type: message_costs(consumer, Draws(handler), probe, meter, count=3) for handler in HANDLERS
        }


def test_a_new_optimistic_message_costs_one_call_alone_and_a_batch_of_them_one_grouped(
    consumer_costs: dict[str, dict[str, Cost]], grouped: bool
) -> None:
    assert consumer_costs[TallyHandler.event_type][NEW].calls == pytest.approx(1 / 3 if grouped else 1)


def test_a_new_lock_message_costs_two_calls_alone_and_a_batch_of_them_two_grouped(
    consumer_costs: dict[str, dict[str, Cost]], grouped: bool
) -> None:
    # Grouped, the batch's three claims are one transaction, and their three commits another.
    assert consumer_costs[CallHandler.event_type][NEW].calls == pytest.approx(2 / 3 if grouped else 2)


def test_a_duplicate_costs_one_call_in_either_mode_and_a_batch_of_them_one_grouped(
    consumer_costs: dict[str, dict[str, Cost]], grouped: bool
) -> None:
    # Grouped, the batch's three duplicates are one cancelled transaction, each read from its own reason.
    calls = [costs[DUPLICATE].calls for costs in consumer_costs.values()]
    assert calls == [pytest.approx(1 / 3 if grouped else 1)] * 2


def test_a_duplicate_inside_one_batch_costs_nothing(consumer_costs: dict[str, dict[str, Cost]]) -> None:
    assert [costs[DUPLICATE_IN_BATCH] for costs in consumer_costs.values()] == [Cost(0, 0, 0)] * 2


def test_write_units_follow_the_transaction_items(consumer_costs: dict[str, dict[str, Cost]]) -> None:
    # A tally's commit is a transaction of three items (the record, the total, the entry): 2 units per item
    # under 1 KB; a duplicate's same transaction, cancelled on the record's condition, is billed as much.
    assert consumer_costs[TallyHandler.event_type][NEW].write_units == 6
    assert consumer_costs[TallyHandler.event_type][DUPLICATE].write_units == 6


def test_no_message_reads_dynamodb(consumer_costs: dict[str, dict[str, Cost]]) -> None:
    # Failed conditions return the old item: a duplicate is recognised without a GetItem.
    assert all(cost.read_units == 0 for costs in consumer_costs.values() for cost in costs.values())


def test_a_message_refused_by_its_handler_stops_the_cost_measurement(probe: RoundTripProbe) -> None:
    """Dead-lettered, it is no failure of its batch; but its cost is a refusal's, not an applied message's."""

    def body(key: str, unit: str) -> str:
        return envelope(TallyHandler.event_type, key, {"entryId": key, "tallyId": "t", "amount": 1, "unit": unit})

    refused = pytest.raises(RuntimeError, match="1 measured messages were dead-lettered")
    with refused, on_new_clients(probe.handler_specs()), moto_backend() as moto:
        settings = replace(moto, handlers=HANDLERS, create_tables=create_test_tables).settings("refused", "")
        consumer = ThisConsumer(settings, {TallyHandler.event_type: TallyHandler(settings)})
        run_batch(consumer, [body("a", "PTS"), body("b", "EUR")])  # a tally counts in one unit


def test_the_latency_hook_delays_requests_answered_by_moto_in_process(backend: Backend, probe: RoundTripProbe) -> None:
    client = backend.reader  # created inside the probe's hooks, like the systems' clients
    table = backend.settings("latency", "").idempotency_table_name
    probe.latency_s = 0.05
    started = time.perf_counter()
    client.get_item(TableName=table, Key={"id": {"S": "absent"}})
    assert time.perf_counter() - started >= 0.05
    assert probe.calls == 1


def test_the_probe_counts_botocores_own_cpu_in_a_call_and_not_its_latency(
    backend: Backend, probe: RoundTripProbe
) -> None:
    client = backend.reader
    table = backend.settings("floor", "").idempotency_table_name
    probe.latency_s, probe.botocore_cpu_s = 0.2, 0.0
    client.get_item(TableName=table, Key={"id": {"S": "absent"}})
    # The call's serialising, signing and parsing (and, in process, moto's own answer), never the sleep.
    assert 0 < probe.botocore_cpu_s < 0.2


def test_item_size_follows_dynamodb_rules() -> None:
    # Names and string values by their UTF-8 bytes: "id" + "ab" = 4, "é" is 2 bytes.
    assert item_size({"id": {"S": "ab"}}) == 4
    assert item_size({"k": {"S": "é"}}) == 3
    # Numbers: one byte per two significant digits, plus one; leading/trailing zeros trimmed.
    assert number_size("12345") == 4
    assert number_size("1000") == 2
    assert number_size("-0.0125") == 3
    # Maps: 3 bytes, plus one per element, plus the elements' names and values.
    assert item_size({"m": {"M": {"a": {"BOOL": True}}}}) == 1 + 3 + 1 + 1 + 1


def test_capacity_units_round_up_per_item() -> None:
    assert write_units(0) == 1
    assert write_units(1024) == 1
    assert write_units(1025) == 2
    assert read_units(4096, consistent=True) == 1
    assert read_units(4097, consistent=True) == 2
    assert read_units(100, consistent=False) == 0.5
