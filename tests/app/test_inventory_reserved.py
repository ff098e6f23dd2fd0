"""The inventory example (examples/inventory_reserved.py), with its table exactly as docs/tables.md adds it."""

from __future__ import annotations

import json
from typing import Any

import yaml

from examples.inventory_reserved import InventoryReservedHandler
from testkit.tables import create_table
from tests.kit import Clock, consumer_of, settings_for, sqs_record
from tests.utils import tables_checklist


def reservation(reservation_id: str, quantity: int, key: str | None = None) -> str:
    payload = {"reservationId": reservation_id, "sku": "sku-1", "quantity": quantity}
    metadata = {"idempotencyKey": key or reservation_id}
    return json.dumps({"eventType": "InventoryReserved", "metadata": metadata, "payload": payload})


def test_the_example_inventory_handler_reserves_once_and_never_below_zero(
    dynamodb: Any, sqs: Any, clock: Clock
) -> None:
    # The table exactly as docs/tables.md's checklist adds it to template.yaml.
    _, table, _, _ = tables_checklist()
    create_table(dynamodb, "inventory", yaml.safe_load(table)["InventoryTable"]["Properties"])
    stock = {"sku": {"S": "sku-1"}, "entryId": {"S": "STOCK"}}
    dynamodb.put_item(TableName="inventory", Item={**stock, "stock": {"N": "5"}})
    settings = settings_for([InventoryReservedHandler], tables={"InventoryTable": "inventory"})
    consumer = consumer_of(dynamodb, sqs, clock, {"InventoryReserved": InventoryReservedHandler(settings)}, settings)

    failed = consumer.failed_ids(
        [
            sqs_record("r1", reservation("r-1", 2)),
            sqs_record("r1-again", reservation("r-1", 2)),
            sqs_record("r1-other-key", reservation("r-1", 2, key="k-other")),
            sqs_record("too-many", reservation("r-2", 4)),
        ]
    )

    assert failed == []
    item = dynamodb.get_item(TableName="inventory", Key=stock, ConsistentRead=True)["Item"]
    assert item["stock"] == {"N": "3"}
    letters = {letter.original_message_id: letter.error_message or "" for letter in consumer.dead_letters()}
    assert set(letters) == {"r1-other-key", "too-many"}
    assert "stock of sku-1 below the 4 asked" in letters["too-many"]
