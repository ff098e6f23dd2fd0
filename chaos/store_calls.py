"""Which step of the idempotency state machine a DynamoDB request is, told by what it does to the
record: the store's own exported update expressions (compared, never parsed), or a delete (a release)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from chaos.transport_faults import TransportCall
from consumer.idempotency import store
from consumer.idempotency.record import Attr


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
    return ((params.get("ExpressionAttributeValues") or {}).get(store.OWNER) or {}).get("S")


def _record_id(params: Mapping[str, Any]) -> str | None:
    return ((params.get("Key") or {}).get(Attr.ID) or {}).get("S")


_UPDATES = {store.CLAIM_UPDATE: Step.CLAIM, store.COMMIT_UPDATE: Step.COMMIT, store.APPLY_UPDATE: Step.APPLY_ONCE}


def _update(params: Mapping[str, Any]) -> StoreCall:
    step = _UPDATES.get(params.get("UpdateExpression", ""))
    return _OTHER if step is None else StoreCall(step, _record_id(params), _owner(params))


def classify(call: TransportCall, idempotency_table: str) -> StoreCall:
    params = call.params
    on_records = call.service == "dynamodb" and params.get("TableName") == idempotency_table
    if on_records and call.operation == "UpdateItem":
        return _update(params)
    if on_records and call.operation == "DeleteItem":
        return StoreCall(Step.RELEASE, _record_id(params), _owner(params))
    if call.service == "dynamodb" and call.operation == "TransactWriteItems":
        for item in params.get("TransactItems") or []:
            update, delete = item.get("Update") or {}, item.get("Delete") or {}
            if delete.get("TableName") == idempotency_table:  # a release with a guard's undo
                return StoreCall(Step.RELEASE, _record_id(delete), _owner(delete))
            # A business write may share the table: the record's own write is the one that sets a status.
            found = _update(update) if update.get("TableName") == idempotency_table else _OTHER
            if found.step is not Step.OTHER:
                return found
    return _OTHER
