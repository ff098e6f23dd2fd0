"""What an emitted message costs and how long its chain takes, on the payment example at the 512 MB share, the relay
in Lambda's runtime under the stream poller (methodology.md)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from unittest import mock

from bench import costs
from bench.capacity import CapacityMeter
from bench.costs import Cost, Draws, batch_cost, billed_s
from bench.probe import RoundTripProbe, on_new_clients
from bench.systems import ThisConsumer
from bench.timing import POWERTOOLS_ENV, Samples, bench_function, invoke
from consumer.config import Settings, destination_variable
from consumer.outbox import OUTBOX_TABLE
from local.poller import PollerGroup
from local.stream_poller import StreamPoller
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.dynamodb_local import DynamoDBLocal
from testkit.invocation import Invocation
from testkit.lambda_runtime import LambdaEnvironment, LambdaFleet
from testkit.payloads import Handler
from testkit.resources import StreamTrigger
from testkit.template import Template

# The payment example's field that makes it emit one message; without it, it emits none.
EMITTING_FIELD = "receiptEmail"
WITH, WITHOUT = "with messages", "without"
MEMORY_MB = 512


def emitter(handlers: Sequence[Handler]) -> Handler | None:
    return next((h for h in handlers if h.destinations and EMITTING_FIELD in h.payload_model.model_fields), None)


def emitting_batch(draws: Draws, emit: bool, count: int = 10) -> list[str]:
    """Drawn bodies, each asking for its receipt (at an address of its own key) or none."""
    bodies = [json.loads(body) for body in draws.bodies(count)]
    for body in bodies:
        body["payload"].pop(EMITTING_FIELD, None)
        body["payload"] |= {EMITTING_FIELD: f"{body['metadata']['idempotencyKey']}@example.com"} if emit else {}
    return [json.dumps(body) for body in bodies]


def unit_costs(server: DynamoDBLocal, settings: Settings, draws: Draws, count: int) -> dict[str, Cost]:
    """Per message of a batch of ``count`` with messages and of one without: calls and units (``bench.capacity``:
    DynamoDB Local's ConsumedCapacity counts a transaction's items short), this consumer in process."""
    probe, meter = RoundTripProbe(), CapacityMeter(server.client())
    env = {**DUMMY_CREDENTIALS_ENV, **POWERTOOLS_ENV, "AWS_ENDPOINT_URL_DYNAMODB": server.endpoint_url}
    with mock.patch.dict(os.environ, env), on_new_clients([*probe.handler_specs(), *meter.handler_specs()]):
        consumer = ThisConsumer(settings)
    return {
        name: batch_cost(consumer, emitting_batch(draws, emit, count), probe, meter, count)
        for name, emit in ((WITH, True), (WITHOUT, False))
    }


def relay_batch_size() -> int:
    """The BatchSize of the relay's mapping in template.yaml."""
    (event,) = Template.from_file().resources["RelayFunction"]["Properties"]["Events"].values()
    return int(event["Properties"]["BatchSize"])


@dataclass
class Chain:
    """The chain from the payment function's invocation to the receipt request's arrival on its queue."""

    latencies_s: list[float] = field(default_factory=list)  # each message's, from its batch's invocation
    relay_wall_s: list[float] = field(default_factory=list)  # each relay invocation's, inside the function
    relay_records: list[int] = field(default_factory=list)  # each relay invocation's records
    sent: int = 0  # messages arrived on the destination, copies included: one SendMessage each


_RECEIVE = {"MaxNumberOfMessages": 10, "WaitTimeSeconds": 1, "AttributeNames": ["SentTimestamp"]}


def measure_chain(function: LambdaEnvironment, draws: Draws, clients: Any, stream_arn: str, batches: int) -> Chain:
    """``batches`` batches of 10 emitting payments one after another, each until its messages arrived; the stream's
    earlier items (the other sections') relayed first, untimed, which also warms the relay. ``clients``: sqs, streams,
    the SQS endpoint."""
    sqs, streams, sqs_url = clients
    handler, chain = draws.handler, Chain()
    queue = sqs.create_queue(QueueName=f"bench-outbox-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    trigger = StreamTrigger(OUTBOX_TABLE, stream_arn, relay_batch_size(), True, True, 10)

    spec = replace(bench_function(MEMORY_MB), name="bench-relay", handler="bench.function.relay")
    variables = {**DUMMY_CREDENTIALS_ENV, **POWERTOOLS_ENV, "AWS_ENDPOINT_URL_SQS": sqs_url, "BENCH_LATENCY_MS": "10"}
    variables[destination_variable(handler.destinations[0])] = queue

    def counted(invocation: Invocation) -> None:
        chain.relay_wall_s.append(invocation.response["wall_s"])
        chain.relay_records.append(invocation.response["records"])

    with LambdaFleet(spec, variables, memory_mb=MEMORY_MB) as fleet:
        poller = StreamPoller(streams, sqs, trigger, fleet.add())
        poller.drain()
        sqs.purge_queue(QueueUrl=queue)
        poller.on_batch, group = counted, PollerGroup([poller]).start()
        try:
            for _ in range(batches):
                bodies = emitting_batch(draws, emit=True)
                started = time.time()
                invoke(function, bodies, 10)
                arrived: set[str] = set()
                while len(arrived) < len(bodies):
                    for message in sqs.receive_message(QueueUrl=queue, **_RECEIVE).get("Messages", []):
                        chain.sent += 1
                        key = json.loads(message["Body"])["metadata"]["idempotencyKey"]
                        if key not in arrived:
                            arrived.add(key)
                            chain.latencies_s.append(int(message["Attributes"]["SentTimestamp"]) / 1000 - started)
                        sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
        finally:
            group.stop()
    return chain


@dataclass
class Outbox:
    units: dict[str, Cost]
    chain: Chain
    turns: dict[str, Samples]
    relay_batch_size: int

    @property
    def outbox_write_units(self) -> float:
        """The outbox item's in its message's transaction: with a message less without (each emits one)."""
        return self.units[WITH].write_units - self.units[WITHOUT].write_units

    def parts(self) -> dict[str, tuple[float, float]]:
        """Per emitted message: each part's count and its USD per million (the relay at its records per invocation
        measured; the source's extra Lambda from the batches of 10 with and without, medians, billed to the ms)."""
        chain, records = self.chain, sum(self.chain.relay_records)
        gb_s = sum(map(billed_s, chain.relay_wall_s)) * MEMORY_MB / 1024 / records
        extra = (billed_s(self.turns[WITH].median_s) - billed_s(self.turns[WITHOUT].median_s)) * MEMORY_MB / 1024 / 10
        counts = {
            "outbox item's write units": (self.outbox_write_units, costs.DYNAMODB_PER_WRITE_UNIT),
            "relay invocations": (len(chain.relay_records) / records, costs.LAMBDA_PER_REQUEST),
            f"relay's Lambda GB-s at {MEMORY_MB} MB": (gb_s, costs.LAMBDA_ARM64_PER_GB_S),
            "sends (SQS requests)": (chain.sent / len(chain.latencies_s), costs.SQS_PER_REQUEST),
            "source's extra Lambda GB-s (with - without)": (extra, costs.LAMBDA_ARM64_PER_GB_S),
        }
        return {part: (count, count * price * costs.MILLION) for part, (count, price) in counts.items()}
