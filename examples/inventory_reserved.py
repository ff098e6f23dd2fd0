"""A handler with a table of its own: reserve stock of a SKU, never below zero, each reservation once.

docs/tables.md ("A handler with its own table") adds it in five steps (this file, its registration,
the table, its variable and its grant in template.yaml); ``tests/tooling/test_making_it_theirs.py``
follows those steps on a copy of the project and checks that ``make test``'s checks catch each
step left out.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from consumer.api import ID_PATTERN, Effect, MessageContext, MessageHandler, Mode, Put, Update


class InventoryReserved(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reservationId: str = Field(pattern=ID_PATTERN)
    sku: str = Field(pattern=ID_PATTERN)
    quantity: StrictInt = Field(gt=0, le=10**6)


class InventoryReservedHandler(MessageHandler[InventoryReserved]):
    event_type: ClassVar[str] = "InventoryReserved"
    # Pure: the stock and the reservation land in one transaction with the idempotency record.
    mode: ClassVar[Mode] = Mode.OPTIMISTIC
    payload_model: ClassVar[type[BaseModel]] = InventoryReserved
    # Keyed (sku, entryId): the stock at "STOCK", one item per reservation. Named to the function
    # as INVENTORY_TABLE_NAME; the role must grant DescribeTable, PutItem and UpdateItem on it.
    tables: ClassVar[tuple[str, ...]] = ("InventoryTable",)

    def contention_key(self, payload: InventoryReserved) -> str:
        # Every reservation of a SKU updates its STOCK item: one after another within a batch.
        return f"InventoryTable/{payload.sku}"

    def handle(self, payload: InventoryReserved, context: MessageContext) -> Effect:
        inventory = self.table_names["InventoryTable"]
        take = Update(
            table=inventory,
            key={"sku": payload.sku, "entryId": "STOCK"},
            expression="ADD stock :taken",
            # Never below zero: a reservation larger than the stock goes to the DLQ, saying so.
            condition="stock >= :quantity",
            values={":taken": -payload.quantity, ":quantity": payload.quantity},
            reason=f"stock of {payload.sku} below the {payload.quantity} asked",
        )
        reservation = Put(
            table=inventory,
            item={"sku": payload.sku, "entryId": f"RESERVATION#{payload.reservationId}", "quantity": payload.quantity},
            # The same reservation under another idempotency key must not take stock twice.
            condition="attribute_not_exists(entryId)",
        )
        return Effect(result={"sku": payload.sku, "reserved": payload.quantity}, writes=(take, reservation))
