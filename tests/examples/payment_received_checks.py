"""The payment example's own demo check (``make demo`` runs it when PaymentReceived is registered): each account's
balance is the sum of its distinct applied payments, however often each was sent."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from testkit.messages import ledger_balance


def demo_checks(
    dynamodb: Any, table_name: Callable[[str], str], applied: list[dict[str, Any]]
) -> list[tuple[bool, str]]:
    expected: Counter[str] = Counter()
    for payment in {p["paymentId"]: p for p in applied}.values():
        expected[payment["accountId"]] += payment["amountCents"]
    found = {account: ledger_balance(dynamodb, table_name("LedgerTable"), account) for account in expected}
    text = f"every balance is the sum of its distinct payments ({len(expected)} accounts, {expected.total()} cents)"
    return [(found == expected, text)]
