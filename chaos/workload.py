"""The workload: payments over accounts, receipts, producer resends and poison, fed at a bounded depth.

Built from the shared message builders (``testkit.messages``), seeded, so a failing run can be
replayed with the same messages.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from testkit.messages import Outgoing, payments, poison, receipts, with_resends


@dataclass(frozen=True)
class WorkloadShape:
    messages: int  # distinct business messages (payments and receipts)
    accounts: int
    receipt_ratio: float
    duplicate_ratio: float  # resends: the same key and body again, with a new messageId
    poison_ratio: float  # of ``messages``; one in four of them reuses a payment's key with another amount


@dataclass(frozen=True)
class Workload:
    messages: list[Outgoing]  # in send order
    distinct_payments: int
    distinct_receipts: int
    resends: int
    poison: int


def build_workload(shape: WorkloadShape, rng: random.Random, run_id: str) -> Workload:
    receipt_count = round(shape.messages * shape.receipt_ratio)
    paid = payments(shape.messages - receipt_count, shape.accounts, rng, prefix=f"pay-{run_id}")
    receipted = receipts(receipt_count, shape.accounts, rng, prefix=f"rcpt-{run_id}")
    originals = [*paid, *receipted]
    mixed = with_resends(originals, shape.duplicate_ratio, rng)
    bad: list[Outgoing] = []
    for _ in range(math.ceil(shape.messages * shape.poison_ratio / 4)):
        bad.extend(poison(1, reused=rng.choice(paid) if paid else None))
    for message in bad:
        mixed.insert(rng.randrange(len(mixed) + 1), message)
    return Workload(mixed, len(paid), len(receipted), len(mixed) - len(originals) - len(bad), len(bad))
