"""The ledger table that the payment and receipt examples write: it goes with them."""

from __future__ import annotations

from typing import Any

import pytest

from consumer.api import MessageContext, Put
from service.handlers.payment_received import PaymentReceived, PaymentReceivedHandler
from testkit.template import load_template
from tests.deployment.lookups import key_schema, properties, transform
from tests.utils import settings_for_tests


@pytest.fixture(scope="module")
def transformed_template() -> dict[str, Any]:
    return transform(load_template())


def test_ledger_table_is_keyed_by_what_the_payment_handler_writes(transformed_template: dict[str, Any]) -> None:
    table = properties(transformed_template, "LedgerTable")
    schema = key_schema(table)
    assert schema == {"accountId": ("HASH", "S"), "entryId": ("RANGE", "S")}

    payment = PaymentReceived(paymentId="p-1", accountId="acc-1", amountCents=100, currency="EUR")
    context = MessageContext(message_id="m-1", idempotency_key="k-1", receive_count=1, remaining_ms=lambda: 1_000)
    writes = PaymentReceivedHandler(settings_for_tests()).handle(payment, context).writes
    assert writes
    for write in writes:
        key = (
            {name: value for name, value in write.item.items() if name in schema}
            if isinstance(write, Put)
            else write.key
        )
        assert set(key) == set(schema), write
        assert all(isinstance(value, str) for value in key.values()), write


def test_ledger_survives_the_stack_and_can_be_restored(transformed_template: dict[str, Any]) -> None:
    ledger = transformed_template["Resources"]["LedgerTable"]
    assert ledger["DeletionPolicy"] == "Retain"
    assert ledger["UpdateReplacePolicy"] == "Retain"
    assert ledger["Properties"]["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert ledger["Properties"]["DeletionProtectionEnabled"] is True
