"""Which step of the idempotency state machine a DynamoDB request is, read from the request itself.

Fault points are named after the state machine (after the claim, before the commit,
after the commit), but the hooks only see requests in transport. The step is read
from what the request does to the record, not from the store's placeholder names:

- the store's claim update (``store.CLAIM_UPDATE``): a claim;
- its commit update: a commit; its claim-and-apply update: optimistic mode's apply;
- a delete of a record: a release.

The updates are the store's own exported expressions, compared for equality: nothing
here parses an expression. The fencing token is the value of ``store.OWNER``.

Optimistic mode may carry the record on a business item instead (a payment's ledger
entry, in whatever table): a ``TransactWriteItems`` whose ``Put`` writes ``ownerToken``
with ``status`` COMPLETED is a claim-and-apply too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from consumer.idempotency import store
from consumer.idempotency.record import Attr, Status


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


def _owner(params: Mapping[str, Any]) -> str | None:
    """The fencing token a store request writes or is conditioned on."""
    return ((params.get("ExpressionAttributeValues") or {}).get(store.OWNER) or {}).get("S")


def _record_id(params: Mapping[str, Any]) -> str | None:
    return ((params.get("Key") or {}).get(Attr.ID) or {}).get("S")


_UPDATES = {
    store.CLAIM_UPDATE: Step.CLAIM,
    store.COMMIT_UPDATE: Step.COMMIT,
    store.APPLY_UPDATE: Step.APPLY_ONCE,
}


def _update(params: Mapping[str, Any]) -> StoreCall:
    step = _UPDATES.get(params.get("UpdateExpression", ""))
    return _OTHER if step is None else StoreCall(step, _record_id(params), _owner(params))


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
        return StoreCall(Step.RELEASE, _record_id(params), _owner(params))
    return _OTHER
