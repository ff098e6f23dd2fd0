"""Business writes a handler asks for, applied in the same transaction as the record.

Handlers never write DynamoDB themselves: they return these, and the store puts them
into one ``TransactWriteItems`` with the idempotency record, so the record and the
business effect are applied together or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from consumer.idempotency.attribute_values import attribute_map

# TransactWriteItems takes at most 100 items; one of them is the idempotency record.
MAX_BUSINESS_WRITES = 99


def _expression_fields(
    condition: str | None, names: Mapping[str, str], values: Mapping[str, Any], held_by: str | None = None
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if condition:
        fields["ConditionExpression"] = condition
    if held_by:
        # The item as it was when the condition failed: whose hold it carried tells busy from refused.
        fields["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    if names:
        fields["ExpressionAttributeNames"] = dict(names)
    if values:
        fields["ExpressionAttributeValues"] = attribute_map(values)
    return fields


@dataclass(frozen=True)
class Put:
    table: str
    item: Mapping[str, Any]
    condition: str | None = None
    names: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)
    # Said in the dead letter when the condition fails (each kind has it), e.g. "stock of SKU x below 3".
    reason: str = ""
    # In a guard: the attribute that carries a hold's reservation token. A failed condition while it
    # carries another message's token means "busy, wait" (the message comes back with backoff), not
    # "refused" (dead-lettered); without it, every failure refuses.
    held_by: str | None = None

    def to_transact_item(self) -> dict[str, Any]:
        return {
            "Put": {
                "TableName": self.table,
                "Item": attribute_map(self.item),
                **_expression_fields(self.condition, self.names, self.values, self.held_by),
            }
        }


@dataclass(frozen=True)
class Update:
    table: str
    key: Mapping[str, Any]
    expression: str
    condition: str | None = None
    names: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    held_by: str | None = None

    def to_transact_item(self) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.table,
                "Key": attribute_map(self.key),
                "UpdateExpression": self.expression,
                **_expression_fields(self.condition, self.names, self.values, self.held_by),
            }
        }


@dataclass(frozen=True)
class Delete:
    table: str
    key: Mapping[str, Any]
    condition: str | None = None
    names: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    held_by: str | None = None

    def to_transact_item(self) -> dict[str, Any]:
        return {
            "Delete": {
                "TableName": self.table,
                "Key": attribute_map(self.key),
                **_expression_fields(self.condition, self.names, self.values, self.held_by),
            }
        }


@dataclass(frozen=True)
class ConditionCheck:
    table: str
    key: Mapping[str, Any]
    condition: str
    names: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""
    held_by: str | None = None

    def to_transact_item(self) -> dict[str, Any]:
        return {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": attribute_map(self.key),
                **_expression_fields(self.condition, self.names, self.values, self.held_by),
            }
        }


Write = Put | Update | Delete | ConditionCheck
