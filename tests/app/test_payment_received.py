"""The payment example's own invariants: a balance is the sum of the distinct payments credited to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.handlers.payment_received import PaymentReceivedHandler
from tests.kit import (
    Clock,
    Consumer,
    consumer_of,
    create_template_tables,
    envelope,
    reasons,
    settings_for,
    sort_keys,
    sqs_record,
)

LEDGER = "ledger"
OUTBOX = "outbox"


def payment(
    payment_id: str, account_id: str = "acc-1", amount: int = 1250, key: str | None = None, email: str | None = None
) -> str:
    payload = {"paymentId": payment_id, "accountId": account_id, "amountCents": amount, "currency": "EUR"}
    return envelope("PaymentReceived", key or f"pay-{payment_id}", payload | ({"receiptEmail": email} if email else {}))


def receipt_requests(dynamodb: Any) -> list[dict[str, Any]]:
    """What the payments asked the relay to send: each outbox item's key, destination, group and body."""
    items = dynamodb.scan(TableName=OUTBOX, ConsistentRead=True)["Items"]
    return sorted(
        (
            {
                "key": item["id"]["S"],
                "destination": item["destination"]["S"],
                "group": item["groupId"]["S"],
                "body": json.loads(item["body"]["S"]),
            }
            for item in items
        ),
        key=lambda request: request["key"],
    )


def balance(dynamodb: Any, account_id: str) -> int:
    key = {"accountId": {"S": account_id}, "entryId": {"S": "BALANCE"}}
    item = dynamodb.get_item(TableName=LEDGER, Key=key, ConsistentRead=True).get("Item")
    return int(item["balanceCents"]["N"]) if item else 0


def ledger_entries(dynamodb: Any, account_id: str) -> list[str]:
    return sort_keys(dynamodb, LEDGER, "accountId", account_id)


@pytest.fixture
def payments(dynamodb: Any, sqs: Any, clock: Clock) -> Consumer:
    tables = {"LedgerTable": LEDGER, "OutboxTable": OUTBOX}
    create_template_tables(dynamodb, tables)
    settings = settings_for([PaymentReceivedHandler], tables=tables)
    return consumer_of(dynamodb, sqs, clock, {"PaymentReceived": PaymentReceivedHandler(settings)}, settings)


def test_a_balance_is_the_sum_of_the_distinct_payments_however_often_each_is_delivered(payments: Consumer) -> None:
    batch = [sqs_record(f"m-{i}", payment(f"p-{i}", amount=10 * i)) for i in range(1, 8)]
    copies = [sqs_record(f"copy-{i}", payment("p-1", amount=10)) for i in range(3)]

    assert payments.failed_ids(batch + copies) == []
    assert payments.failed_ids(batch) == []
    assert payments.failed_ids([sqs_record("resent", payment("p-2", amount=20))]) == []

    assert balance(payments.dynamodb, "acc-1") == sum(10 * i for i in range(1, 8))
    assert ledger_entries(payments.dynamodb, "acc-1") == ["BALANCE", *(f"PAYMENT#p-{i}" for i in range(1, 8))]


def test_the_same_payment_under_another_key_is_refused_by_the_ledger(payments: Consumer) -> None:
    payments.process([sqs_record("a", payment("p-1", amount=500, key="key-a"))])

    assert payments.failed_ids([sqs_record("b", payment("p-1", amount=500, key="key-b"))]) == []

    assert reasons(payments.dead_letters()) == {"b": "BusinessConditionFailed"}
    assert balance(payments.dynamodb, "acc-1") == 500


def test_a_payment_in_another_currency_than_the_account_is_refused(payments: Consumer) -> None:
    payments.process([sqs_record("eur", payment("p-1", amount=500))])
    usd = json.loads(payment("p-2", amount=700))
    usd["payload"]["currency"] = "USD"

    assert payments.failed_ids([sqs_record("usd", json.dumps(usd))]) == []

    assert reasons(payments.dead_letters()) == {"usd": "BusinessConditionFailed"}
    assert balance(payments.dynamodb, "acc-1") == 500


def test_a_key_reused_for_a_different_payment_credits_nothing(payments: Consumer) -> None:
    payments.process([sqs_record("original", payment("p-1", amount=500, key="shared-key"))])

    assert payments.failed_ids([sqs_record("other", payment("p-2", "acc-2", 900, key="shared-key"))]) == []

    assert reasons(payments.dead_letters()) == {"other": "IdempotencyKeyReused"}
    assert (balance(payments.dynamodb, "acc-1"), balance(payments.dynamodb, "acc-2")) == (500, 0)
    assert ledger_entries(payments.dynamodb, "acc-2") == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"amountCents": -5}, "payload.amountCents"),
        ({"amountCents": "12.50"}, "payload.amountCents"),
        ({"currency": "euro"}, "payload.currency"),
    ],
)
def test_a_payment_that_breaks_its_schema_is_poison(payments: Consumer, change: dict[str, Any], field: str) -> None:
    body = json.loads(payment("p-1"))
    body["payload"].update(change)

    assert payments.failed_ids([sqs_record("bad", json.dumps(body))]) == []

    (dead,) = payments.dead_letters()
    assert (dead.error_type, (dead.error_message or "").split(":")[0]) == ("SchemaViolation", field)
    assert balance(payments.dynamodb, "acc-1") == 0


def test_a_payment_with_a_receipt_email_asks_for_its_receipt_once_however_often_it_is_delivered(
    payments: Consumer,
) -> None:
    body = payment("p-1", amount=700, email="ana@example.com")

    assert payments.failed_ids([sqs_record("m1", body), sqs_record("m2", body)]) == []
    assert payments.failed_ids([sqs_record("m3", body)]) == []

    key = "PaymentReceived#pay-p-1#0"
    request = {"receiptId": "p-1", "paymentId": "p-1", "accountId": "acc-1", "amountCents": 700, "currency": "EUR"}
    assert receipt_requests(payments.dynamodb) == [
        {
            "key": key,
            "destination": "ConsumerQueue",
            "group": "acc-1",
            "body": {
                "eventType": "ReceiptRequested",
                "metadata": {"idempotencyKey": key},
                "payload": {**request, "email": "ana@example.com"},
            },
        }
    ]


def test_a_payment_without_an_email_or_refused_asks_for_no_receipt(payments: Consumer) -> None:
    payments.process([sqs_record("eur", payment("p-1", amount=500))])
    usd = json.loads(payment("p-2", amount=700, email="ana@example.com"))
    usd["payload"]["currency"] = "USD"

    assert payments.failed_ids([sqs_record("usd", json.dumps(usd))]) == []

    assert reasons(payments.dead_letters()) == {"usd": "BusinessConditionFailed"}
    assert receipt_requests(payments.dynamodb) == []


def test_a_payment_applied_by_its_resend_is_named() -> None:
    from tests.app.payment_received_checks import not_first_copies, payment  # noqa: PLC0415

    first, other = payment("k1", "p1", "acc-a", 100), payment("k2", "p2", "acc-a", 200)
    sent = {"m1": first, "m2": other, "m3": first}  # m3: a resend of m1
    assert not_first_copies(sent, {"p1": "m1", "p2": "m2"}) == []
    assert not_first_copies(sent, {"p1": "m3", "p2": "m2"}) == ["payment p1: applied by m3, its first copy sent was m1"]


def test_the_docs_test_of_a_handler_of_your_own_passes_as_written(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    """docs/testing.md shows a handler's test on this example: it must run as written (it goes with the example)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text(encoding="utf-8")
    code = page[page.index("```python\n") + len("```python\n") :]
    namespace: dict[str, Any] = {"__name__": "docs_test"}
    exec(compile(code[: code.index("```")], "docs/testing.md", "exec", dont_inherit=True), namespace)
    (test,) = [value for name, value in namespace.items() if name.startswith("test_")]
    test(dynamodb, sqs, clock)
