"""The tables: one per table a handler declares, and the keys and TTL attribute the code relies on."""

from __future__ import annotations

from typing import Any

from consumer.handlers import declared_tables
from consumer.handlers.base import MessageContext
from consumer.handlers.payment_received import PaymentReceived, PaymentReceivedHandler
from consumer.idempotency import store
from consumer.idempotency.writes import Put
from tests.infrastructure.lookups import properties, resources_of_type
from tests.utils import settings_for_tests


def _key_schema(table: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Key attribute -> (key type, attribute type)."""
    types = {definition["AttributeName"]: definition["AttributeType"] for definition in table["AttributeDefinitions"]}
    return {key["AttributeName"]: (key["KeyType"], types[key["AttributeName"]]) for key in table["KeySchema"]}


def test_each_table_a_handler_declares_is_a_template_table(transformed_template: dict[str, Any]) -> None:
    # Its variable in the function's environment: test_function's test_environment_is_what_the_code_reads.
    tables = resources_of_type(transformed_template, "AWS::DynamoDB::Table")
    for table in ("IdempotencyTable", *declared_tables()):
        assert table in tables, f"a handler declares {table}: add an AWS::DynamoDB::Table of that name to template.yaml"
    assert set(tables) == {"IdempotencyTable", *declared_tables()}, "a table in template.yaml that no handler declares"


def test_tables_are_on_demand_and_encrypted_with_kms(transformed_template: dict[str, Any]) -> None:
    tables = resources_of_type(transformed_template, "AWS::DynamoDB::Table")
    for name, table in tables.items():
        assert table["Properties"]["BillingMode"] == "PAY_PER_REQUEST", name
        assert table["Properties"]["SSESpecification"] == {"SSEEnabled": True}, name


def test_idempotency_table_is_keyed_and_expired_by_the_attributes_the_store_writes(
    transformed_template: dict[str, Any],
) -> None:
    table = properties(transformed_template, "IdempotencyTable")
    # The store's expression attribute names are the attributes it reads and writes.
    attribute = store._NAMES
    assert _key_schema(table) == {attribute["#id"]: ("HASH", "S")}
    assert table["TimeToLiveSpecification"] == {"AttributeName": attribute["#expires"], "Enabled": True}


def test_ledger_table_is_keyed_by_what_the_payment_handler_writes(transformed_template: dict[str, Any]) -> None:
    table = properties(transformed_template, "LedgerTable")
    schema = _key_schema(table)
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
