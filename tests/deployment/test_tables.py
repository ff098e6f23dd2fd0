"""The tables: one per table a handler declares, and the keys and TTL attribute the code relies on."""

from __future__ import annotations

from typing import Any

import pytest

from consumer.handler import declared_tables
from consumer.idempotency import calls as store
from consumer.outbox import OUTBOX_TABLE, Attr
from service.registry import HANDLERS
from tests.deployment.lookups import key_schema, properties, resources_of_type, table_mistakes


def test_each_table_a_handler_declares_is_a_template_table_or_given_by_its_parameter(
    transformed_template: dict[str, Any],
) -> None:
    # Its variable in the function's environment: test_function's test_environment_is_what_the_code_reads.
    mistakes = table_mistakes(transformed_template, declared_tables(HANDLERS))
    if mistakes:
        pytest.fail("\n".join(mistakes), pytrace=False)


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
    attribute = store.NAMES
    assert key_schema(table) == {attribute["#id"]: ("HASH", "S")}
    assert table["TimeToLiveSpecification"] == {"AttributeName": attribute["#expires"], "Enabled": True}


def test_the_outbox_is_keyed_expired_and_streamed_as_the_core_writes_and_the_relay_reads_it(
    transformed_template: dict[str, Any],
) -> None:
    table = properties(transformed_template, OUTBOX_TABLE)
    assert key_schema(table) == {Attr.ID: ("HASH", "S")}
    assert table["TimeToLiveSpecification"] == {"AttributeName": Attr.EXPIRES_AT, "Enabled": True}
    # The relay reads each item from the stream's new image (OutboxItem.from_image).
    assert table["StreamSpecification"] == {"StreamViewType": "NEW_IMAGE"}
    assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
