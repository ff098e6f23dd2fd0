"""The refund example (examples/refund_issued.py) as a user would register it: a debit once, never an overdraft."""

from __future__ import annotations

import json
from typing import Any

from examples.refund_issued import RefundIssuedHandler
from tests.kit import Clock, consumer_of, create_template_tables, settings_for, sqs_record

LEDGER = "ledger"
BALANCE = {"accountId": {"S": "acc-1"}, "entryId": {"S": "BALANCE"}}


def refund(refund_id: str, amount: int) -> str:
    payload = {"refundId": refund_id, "accountId": "acc-1", "amountCents": amount}
    return json.dumps({"eventType": "RefundIssued", "metadata": {"idempotencyKey": refund_id}, "payload": payload})


def test_the_example_refund_handler_debits_once_and_refuses_an_overdraft(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    create_template_tables(dynamodb, {"LedgerTable": LEDGER})
    settings = settings_for([RefundIssuedHandler], tables={"LedgerTable": LEDGER})
    consumer = consumer_of(dynamodb, sqs, clock, {"RefundIssued": RefundIssuedHandler(settings)}, settings)
    # The account's balance as payments left it.
    dynamodb.put_item(TableName=LEDGER, Item={**BALANCE, "balanceCents": {"N": "1000"}})

    failed = consumer.failed_ids(
        [
            sqs_record("r1", refund("r-1", 300)),
            sqs_record("r1-again", refund("r-1", 300)),
            sqs_record("big", refund("r-2", 5000)),
        ]
    )

    assert failed == []
    item = dynamodb.get_item(TableName=LEDGER, Key=BALANCE, ConsistentRead=True)["Item"]
    assert item["balanceCents"] == {"N": "700"}
    dead = consumer.dead_letters()
    assert [letter.error_type for letter in dead] == ["BusinessConditionFailed"]
    assert "balance of account acc-1 below the refund of 5000 cents" in (dead[0].error_message or "")
