"""The workload: payments over accounts, receipts, producer resends and poison, fed at a bounded depth.

Built from the shared message builders (``testkit.messages``), seeded, so a failing run can be
replayed with the same messages.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from testkit.messages import Outgoing, payment, payments, poison, receipts, with_resends


@dataclass(frozen=True)
class WorkloadShape:
    messages: int  # distinct business messages (payments and receipts)
    accounts: int
    receipt_ratio: float
    duplicate_ratio: float  # resends: the same key and body again, with a new messageId
    poison_ratio: float  # of ``messages``; one in four of them reuses a payment's key with another amount
    # A share of all payments on a few hot accounts, whose BALANCE item their transactions race for.
    hot_share: float = 0.0
    hot_accounts: int = 2


@dataclass(frozen=True)
class Workload:
    messages: list[Outgoing]  # in send order
    distinct_payments: int
    distinct_receipts: int
    resends: int
    poison: int
    hot_payments: int = 0


def _to_hot_account(message: Outgoing, rng: random.Random, hot_accounts: int) -> Outgoing:
    payload = message.payload or {}
    account = f"acc-hot-{rng.randrange(hot_accounts)}"
    assert message.key is not None
    return payment(message.key, payload["paymentId"], account, int(payload["amountCents"]))


def build_workload(shape: WorkloadShape, rng: random.Random, run_id: str) -> Workload:
    receipt_count = round(shape.messages * shape.receipt_ratio)
    paid = [
        _to_hot_account(message, rng, shape.hot_accounts) if rng.random() < shape.hot_share else message
        for message in payments(shape.messages - receipt_count, shape.accounts, rng, prefix=f"pay-{run_id}")
    ]
    receipted = receipts(receipt_count, shape.accounts, rng, prefix=f"rcpt-{run_id}")
    originals = [*paid, *receipted]
    mixed = with_resends(originals, shape.duplicate_ratio, rng)
    bad: list[Outgoing] = []
    for _ in range(math.ceil(shape.messages * shape.poison_ratio / 4)):
        bad.extend(poison(1, reused=rng.choice(paid) if paid else None))
    for message in bad:
        mixed.insert(rng.randrange(len(mixed) + 1), message)
    hot = sum(1 for message in paid if (message.payload or {}).get("accountId", "").startswith("acc-hot-"))
    return Workload(mixed, len(paid), len(receipted), len(mixed) - len(originals) - len(bad), len(bad), hot)
