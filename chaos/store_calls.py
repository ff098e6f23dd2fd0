"""Which step of the idempotency state machine a DynamoDB request is, read from the request itself.

Fault points are named after the state machine (after the claim, before the commit,
after the commit), but the hooks only see requests in transport. The step is read
from what the request does to the record, not from the store's placeholder names:

- sets ``status`` to IN_PROGRESS: a claim;
- sets ``status`` to COMPLETED under a condition on ``ownerToken``: a commit;
- sets ``status`` to COMPLETED without one: optimistic mode's claim-and-apply;
- deletes the record: a release.

Optimistic mode may carry the record on a business item instead (a payment's ledger
entry, in whatever table): a ``TransactWriteItems`` whose ``Put`` writes ``ownerToken``
with ``status`` COMPLETED is a claim-and-apply too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from consumer.idempotency.record import Attr, Status

_COMPARISON = re.compile(r"(#\w+)\s*=\s*(:\w+)")


class Step(StrEnum):
    CLAIM = "claim"
    COMMIT = "commit"
    APPLY_ONCE = "apply_once"
    RELEASE = "release"
    OTHER = "other"


@dataclass(frozen=True)
class StoreCall:
    step: Step
    record_id: str | None = None
    # The fencing token the request writes (claim, apply) or is conditioned on (commit, release).
    owner_token: str | None = None


_OTHER = StoreCall(Step.OTHER)


def _assignments(expression: str, params: Mapping[str, Any]) -> dict[str, str]:
    """``#name = :value`` pairs of an expression, as attribute name -> string value."""
    names = params.get("ExpressionAttributeNames") or {}
    values = params.get("ExpressionAttributeValues") or {}
    found: dict[str, str] = {}
    for placeholder, value in _COMPARISON.findall(expression or ""):
        attribute = names.get(placeholder, placeholder)
        typed = values.get(value) or {}
        if "S" in typed:
            found[attribute] = typed["S"]
    return found


def _record_id(params: Mapping[str, Any]) -> str | None:
    return ((params.get("Key") or {}).get(Attr.ID) or {}).get("S")


def _update(params: Mapping[str, Any]) -> StoreCall:
    written = _assignments(params.get("UpdateExpression", ""), params)
    required = _assignments(params.get("ConditionExpression", ""), params)
    record_id = _record_id(params)
    status = written.get(Attr.STATUS)
    if status == Status.IN_PROGRESS:
        return StoreCall(Step.CLAIM, record_id, written.get(Attr.OWNER_TOKEN))
    if status == Status.COMPLETED and Attr.OWNER_TOKEN in required:
        return StoreCall(Step.COMMIT, record_id, required[Attr.OWNER_TOKEN])
    if status == Status.COMPLETED:
        return StoreCall(Step.APPLY_ONCE, record_id, written.get(Attr.OWNER_TOKEN))
    return _OTHER


def _carried(put: Mapping[str, Any]) -> StoreCall | None:
    """A ``Put`` that carries a completed record on its business item, as ``apply_once`` writes it."""
    item = put.get("Item") or {}
    if Attr.OWNER_TOKEN not in item or (item.get(Attr.STATUS) or {}).get("S") != Status.COMPLETED:
        return None
    return StoreCall(Step.APPLY_ONCE, (item.get(Attr.ID) or {}).get("S"), item[Attr.OWNER_TOKEN].get("S"))


def classify(operation: str, params: Mapping[str, Any], idempotency_table: str) -> StoreCall:
    """The state-machine step a DynamoDB request performs on the record, if any."""
    if operation == "TransactWriteItems":
        for item in params.get("TransactItems") or []:
            update = item.get("Update") or {}
            # A business write may share the table: the record's own write is the one that sets a status.
            found = _update(update) if update.get("TableName") == idempotency_table else _carried(item.get("Put") or {})
            if found is not None and found.step is not Step.OTHER:
                return found
        return _OTHER
    if params.get("TableName") != idempotency_table:
        return _OTHER
    if operation == "UpdateItem":
        return _update(params)
    if operation == "DeleteItem":
        required = _assignments(params.get("ConditionExpression", ""), params)
        return StoreCall(Step.RELEASE, _record_id(params), required.get(Attr.OWNER_TOKEN))
    return _OTHER
