"""DynamoDB calls and capacity units per message, by case, for one system.

Each case is a batch of fresh messages; its counts divided by the messages give the
cost of one. A duplicate inside one batch is measured as what a batch of pairs costs
beyond its new messages, so only the copies are left.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.capacity import CapacityMeter
from bench.probe import RoundTripProbe
from bench.runs import run_batch
from bench.systems import LambdaSystem
from testkit.messages import MessageFactory

NEW_OPTIMISTIC = "new, optimistic (PaymentReceived)"
NEW_LOCK = "new, lock (ReceiptRequested + webhook)"
DUPLICATE_OPTIMISTIC = "duplicate, optimistic"
DUPLICATE_LOCK = "duplicate, lock"
DUPLICATE_IN_BATCH = "duplicate inside one batch"
CASES = (NEW_OPTIMISTIC, NEW_LOCK, DUPLICATE_OPTIMISTIC, DUPLICATE_LOCK, DUPLICATE_IN_BATCH)


@dataclass(frozen=True)
class Cost:
    calls: float
    write_units: float
    read_units: float

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.calls - other.calls, self.write_units - other.write_units, self.read_units - other.read_units)

    def scaled(self, factor: float) -> Cost:
        return Cost(self.calls * factor, self.write_units * factor, self.read_units * factor)


class CostRecorder:
    def __init__(self, probe: RoundTripProbe, meter: CapacityMeter) -> None:
        self._probe = probe
        self._meter = meter

    def measure(self, action: Callable[[], None], messages: int) -> Cost:
        """What ``action`` cost, per message."""
        before = self._total()
        action()
        return (self._total() - before).scaled(1 / messages)

    def _total(self) -> Cost:
        capacity = self._meter.reading()
        return Cost(self._probe.calls(), capacity.write_units, capacity.read_units)


def message_costs(system: LambdaSystem, factory: MessageFactory, recorder: CostRecorder, count: int) -> dict[str, Cost]:
    payments, receipts, paired = factory.payments(count), factory.receipts(count), factory.payments(count)
    costs = {
        NEW_OPTIMISTIC: recorder.measure(lambda: run_batch(system, payments), count),
        NEW_LOCK: recorder.measure(lambda: run_batch(system, receipts), count),
        # Redelivered bodies under new messageIds: the keys are already COMPLETED.
        DUPLICATE_OPTIMISTIC: recorder.measure(lambda: run_batch(system, payments), count),
        DUPLICATE_LOCK: recorder.measure(lambda: run_batch(system, receipts), count),
    }
    pairs = [body for body in paired for _ in range(2)]
    with_copies = recorder.measure(lambda: run_batch(system, pairs), count)
    costs[DUPLICATE_IN_BATCH] = with_copies - costs[NEW_OPTIMISTIC]
    return costs
