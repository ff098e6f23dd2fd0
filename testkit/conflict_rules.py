"""DynamoDB's transaction-conflict rules: which items in-flight transactions hold, and the errors.

DynamoDB Local applies transactions one after another, so it never reports a conflict. DynamoDB does (developer guide,
"Transaction conflict handling in DynamoDB"): a ``TransactWriteItems`` touching an item another in-flight one holds is
cancelled (``TransactionConflict`` at that item's index of ``CancellationReasons``, ``None`` at the others), and a
``PutItem``, ``UpdateItem`` or ``DeleteItem`` on such an item fails with ``TransactionConflictException``. The error
documents have the wire shape DynamoDB sends.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

# (table name, canonical JSON of the item's key attributes)
ItemKey = tuple[str, str]
# A table's key attribute names, or None when the table cannot be described.
KeyNames = Callable[[str], Sequence[str] | None]

TRANSACT_WRITE = "TransactWriteItems"
SINGLE_ITEM_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem"})
CONFLICT_MESSAGE = "Transaction is ongoing for the item"
_ERROR_PREFIX = "com.amazonaws.dynamodb.v20120810#"


class ItemHolds:
    """Items held by in-flight transactions; the mutex guards only the look-up and the marking."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: dict[ItemKey, object] = {}

    def hold(self, items: Sequence[ItemKey | None]) -> tuple[object | None, list[int]]:
        """Hold every item for one transaction: its token, or ``None`` and the conflicting indexes."""
        with self._lock:
            conflicting = [index for index, item in enumerate(items) if item is not None and item in self._holders]
            if conflicting:
                return None, conflicting
            token = object()
            self._holders.update((item, token) for item in items if item is not None)
            return token, []

    def release(self, items: Sequence[ItemKey | None], token: object) -> None:
        with self._lock:
            for item in items:
                if item is not None and self._holders.get(item) is token:
                    del self._holders[item]

    def held(self, item: ItemKey | None) -> bool:
        with self._lock:
            return item is not None and item in self._holders


def _canonical(table: Any, key: Mapping[str, Any]) -> ItemKey | None:
    if not isinstance(table, str) or not key:
        return None
    return table, json.dumps(key, sort_keys=True, separators=(",", ":"))


def item_key(action: Mapping[str, Any], key_names: KeyNames) -> ItemKey | None:
    """The item one write names: its ``Key``, or the key attributes of a put's ``Item``; ``None`` for a malformed
    request (forwarded as it is: DynamoDB Local refuses it itself)."""
    table = action.get("TableName")
    if isinstance(key := action.get("Key"), Mapping):
        return _canonical(table, key)
    item = action.get("Item")
    if not isinstance(item, Mapping) or not isinstance(table, str):
        return None
    names = key_names(table)
    if names is None or any(name not in item for name in names):
        return None
    return _canonical(table, {name: item[name] for name in names})


def transaction_items(request: Mapping[str, Any], key_names: KeyNames) -> list[ItemKey | None]:
    actions = request.get("TransactItems")
    if not isinstance(actions, list):
        return []
    items: list[ItemKey | None] = []
    for entry in actions:
        # Each entry holds exactly one of Put, Update, Delete, ConditionCheck.
        specs = list(entry.values()) if isinstance(entry, Mapping) else []
        items.append(item_key(specs[0], key_names) if len(specs) == 1 and isinstance(specs[0], Mapping) else None)
    return items


def transaction_cancelled(actions: int, conflicting: Collection[int]) -> dict[str, Any]:
    reasons: list[dict[str, str]] = [
        {"Code": "TransactionConflict", "Message": CONFLICT_MESSAGE} if index in conflicting else {"Code": "None"}
        for index in range(actions)
    ]
    codes = ", ".join(reason["Code"] for reason in reasons)
    return {
        "__type": f"{_ERROR_PREFIX}TransactionCanceledException",
        "CancellationReasons": reasons,
        "Message": f"Transaction cancelled, please refer cancellation reasons for specific reasons [{codes}]",
    }


# Lower-case ``message``, as the service model has it.
TRANSACTION_CONFLICT = {"__type": f"{_ERROR_PREFIX}TransactionConflictException", "message": CONFLICT_MESSAGE}
