"""Business writes a handler asks for, applied in the same transaction as the record.

Handlers never write DynamoDB themselves: they return these, and the store puts them
into one ``TransactWriteItems`` with the idempotency record, so the record and the
business effect are applied together or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from consumer.idempotency.attribute_values import attribute_map

# TransactWriteItems takes at most 100 items; one of them is the idempotency record.
MAX_BUSINESS_WRITES = 99

_W = TypeVar("_W")


# The attributes every write has, said once and added to each write's docstring (``help(Put)`` shows them).
_SHARED_FIELDS = """
    Attributes shared by every write
    --------------------------------
    table:
        The table's name: ``self.table_names["<LogicalId>"]``, never a literal (a declared table, checked).
    condition:
        A DynamoDB condition expression; when it fails the whole transaction lands nothing, and the message is
        dead-lettered as ``BusinessConditionFailed`` with ``reason`` (in a guard: refused, or busy, see ``held_by``).
    names:
        Placeholders for attribute names, ``{"#status": "status"}``: a name DynamoDB reserves (``status``,
        ``name``, ``count``, ``ttl``...) or one with a dot or a dash must go through one in ``expression`` and
        ``condition``; others may be written as they are.
    values:
        Placeholders for values, ``{":amount": 1250}``, as plain Python values (str, int, Decimal, bool, None,
        bytes, lists, dicts, sets): the core types them for DynamoDB (``attribute_values.py``).
    reason:
        What the dead letter says when ``condition`` fails, in the handler's own words.
    held_by:
        In a guard only: the attribute that carries a hold's reservation token (``context.reservation_token``).
        A failed condition while it carries another message's token is "busy" (retried with backoff), not
        "refused" (dead-lettered).
"""


def _documented(kind: type[_W]) -> type[_W]:
    kind.__doc__ = (kind.__doc__ or "") + _SHARED_FIELDS
    return kind


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


@_documented
@dataclass(frozen=True)
class Put:
    """Write a whole item (``PutItem`` in the record's transaction).

    item:
        The whole item, its key attributes among them, as plain Python values (see ``values``).

    Example
    -------
    ``Put(table=self.table_names["LedgerTable"], item={"accountId": a, "entryId": f"PAY#{p}", "amount": 1250},
    condition="attribute_not_exists(entryId)", reason=f"payment {p} was entered before")``
    """

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


@_documented
@dataclass(frozen=True)
class Update:
    """Change an item in place (``UpdateItem`` in the record's transaction); it is created if absent, unless
    ``condition`` requires it.

    key:
        The item's key attributes, as plain Python values.
    expression:
        The update expression (``SET``, ``ADD``, ``REMOVE``, ``DELETE``), with ``names`` and ``values``.

    Example
    -------
    ``Update(table=self.table_names["AccountsTable"], key={"accountId": a}, expression="SET #status = :s ADD
    balance :amount", names={"#status": "status"}, values={":s": "ACTIVE", ":amount": 1250})``
    """

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


@_documented
@dataclass(frozen=True)
class Delete:
    """Delete an item (``DeleteItem`` in the record's transaction); deleting one that is absent is no error
    unless ``condition`` says so.

    key:
        The item's key attributes, as plain Python values.

    Example
    -------
    ``Delete(table=self.table_names["HoldsTable"], key={"holdId": h}, condition="attribute_exists(holdId)")``
    """

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


@_documented
@dataclass(frozen=True)
class ConditionCheck:
    """Require ``condition`` of an item without writing it: the transaction (and the message's effect) lands only
    if it holds. In a guard, a check that must hold before the side effect.

    key:
        The item's key attributes, as plain Python values.

    Example
    -------
    ``ConditionCheck(table=self.table_names["ShipmentsTable"], key={"shipmentId": s}, condition="#status <>
    :cancelled", names={"#status": "status"}, values={":cancelled": "CANCELLED"}, reason=f"shipment {s} is
    cancelled")``
    """

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
