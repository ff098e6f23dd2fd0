"""The payment example's own demo check (``make demo`` runs it when PaymentReceived is registered): each account's
balance is the sum of its distinct applied payments, however often each was sent."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from testkit.messages import Outgoing, envelope


def demo_checks(
    dynamodb: Any, table_name: Callable[[str], str], applied: list[dict[str, Any]]
) -> list[tuple[bool, str]]:
    expected: Counter[str] = Counter()
    for payment in {p["paymentId"]: p for p in applied}.values():
        expected[payment["accountId"]] += payment["amountCents"]
    found = {account: ledger_balance(dynamodb, table_name("LedgerTable"), account) for account in expected}
    text = f"every balance is the sum of its distinct payments ({len(expected)} accounts, {expected.total()} cents)"
    return [(found == expected, text)]


def ledger_balance(dynamodb: Any, table: str, account: str) -> int:
    """An account's balance in the example ledger (0 before its first payment), read consistently."""
    key = {"accountId": {"S": account}, "entryId": {"S": "BALANCE"}}
    item = dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item")
    return int(item["balanceCents"]["N"]) if item else 0


def payment(key: str, payment_id: str, account_id: str, amount_cents: int) -> Outgoing:
    """A payment whose FIFO group is its account, so one account's payments apply in order."""
    payload = {"paymentId": payment_id, "accountId": account_id, "amountCents": amount_cents, "currency": "EUR"}
    return Outgoing(envelope("PaymentReceived", key, payload), "payment", key, group=account_id)


def receipt(key: str, receipt_id: str, account_id: str, payment_id: str, amount_cents: int) -> Outgoing:
    payload = {
        "receiptId": receipt_id,
        "paymentId": payment_id,
        "accountId": account_id,
        "amountCents": amount_cents,
        "currency": "EUR",
        "email": f"{account_id}@example.com",
    }
    return Outgoing(envelope("ReceiptRequested", key, payload), "receipt", key, group=account_id)


def not_first_copies(sent: Mapping[str, Outgoing], applied_by: Mapping[str, str]) -> list[str]:
    """A line per payment applied by another message than its first copy sent (``applied_by``: payment -> messageId)."""
    first_copy: dict[str, str] = {}
    for message_id, message in sent.items():
        if message.kind == "payment" and message.payload is not None:
            first_copy.setdefault(message.payload["paymentId"], message_id)
    return [
        f"payment {payment_id}: applied by {applied_by.get(payment_id)}, its first copy sent was {message_id}"
        for payment_id, message_id in first_copy.items()
        if applied_by.get(payment_id) != message_id
    ]
