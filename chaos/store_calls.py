"""Which step of the idempotency state machine a DynamoDB request is, told by what it does to the
record: the store's own exported update expressions (compared, never parsed), or a delete (a release)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from chaos.transport_faults import TransportCall
from consumer.idempotency import calls as store
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
    # The other records a group's transaction writes (each its own message's): what befalls it befalls them.
    others: tuple[str, ...] = ()


_OTHER = StoreCall(Step.OTHER)


def _owner(params: Mapping[str, Any]) -> str | None:
    return ((params.get("ExpressionAttributeValues") or {}).get(store.OWNER) or {}).get("S")


def _record_id(params: Mapping[str, Any]) -> str | None:
    return ((params.get("Key") or {}).get(Attr.ID) or {}).get("S")


_UPDATES = {store.CLAIM_UPDATE: Step.CLAIM, store.COMMIT_UPDATE: Step.COMMIT, store.APPLY_UPDATE: Step.APPLY_ONCE}


def _update(params: Mapping[str, Any]) -> StoreCall:
    step = _UPDATES.get(params.get("UpdateExpression", ""))
    return _OTHER if step is None else StoreCall(step, _record_id(params), _owner(params))


def _action(item: Mapping[str, Any], idempotency_table: str) -> StoreCall:
    update, delete = item.get("Update") or {}, item.get("Delete") or {}
    if delete.get("TableName") == idempotency_table:  # a release (in a transaction, with a guard's undo)
        return StoreCall(Step.RELEASE, _record_id(delete), _owner(delete))
    # A business write may share the table: the record's own write is the one that sets a status.
    return _update(update) if update.get("TableName") == idempotency_table else _OTHER


def classify(call: TransportCall, idempotency_table: str) -> StoreCall:
    """A single write is its one action; a transaction's are its items: a group's writes several messages'
    records, the first naming the step and the others going with it."""
    params = call.params
    single = {"UpdateItem": [{"Update": params}], "DeleteItem": [{"Delete": params}]}.get(call.operation)
    actions = single or (params.get("TransactItems") or [] if call.operation == "TransactWriteItems" else [])
    found = [step for item in actions if (step := _action(item, idempotency_table)).step is not Step.OTHER]
    if call.service != "dynamodb" or not found:
        return _OTHER
    return replace(found[0], others=tuple(str(other.record_id) for other in found[1:]))
