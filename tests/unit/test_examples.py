"""The README's handler example is a real file; it runs here as a user would register it."""

from __future__ import annotations

import json
from typing import Any

from examples.refund_issued import RefundIssuedHandler
from testkit.lambda_sqs import sqs_record
from testkit.messages import payment_body
from tests.unit.conftest import LEDGER_TABLE, Clock, balance, make_consumer


def refund(refund_id: str, amount: int) -> str:
    payload = {"refundId": refund_id, "accountId": "acc-1", "amountCents": amount}
    return json.dumps({"eventType": "RefundIssued", "metadata": {"idempotencyKey": refund_id}, "payload": payload})


def test_the_example_refund_handler_debits_once_and_refuses_an_overdraft(dynamodb: Any, sqs: Any, clock: Clock) -> None:
    consumer = make_consumer(dynamodb, sqs, clock, extra_handlers={"RefundIssued": RefundIssuedHandler(LEDGER_TABLE)})
    consumer.process([sqs_record("pay", payment_body("p-1", amount=1000))])

    failed = consumer.failed_ids(
        [
            sqs_record("r1", refund("r-1", 300)),
            sqs_record("r1-again", refund("r-1", 300)),
            sqs_record("big", refund("r-2", 5000)),
        ]
    )

    assert failed == []
    assert balance(dynamodb, "acc-1") == 700
    dead = consumer.dead_letters()
    assert [letter.error_type for letter in dead] == ["BusinessConditionFailed"]
    assert "balance of account acc-1 below the refund of 5000 cents" in (dead[0].error_message or "")
