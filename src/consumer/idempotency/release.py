"""Lock mode, on failure: the claim deleted if still ours, with the undo of its guard's reservations."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from consumer.errors import BusinessConditionFailed, TransactionConflict
from consumer.idempotency.answers import Claimed, Conflicted, RecordRefused, Refused
from consumer.idempotency.calls import OWNED, OWNER, RELEASE_NAMES, RELEASE_TOKEN_NAMESPACE, Table
from consumer.idempotency.record import Status
from consumer.idempotency.transition import Transition
from consumer.idempotency.writes import Write


@dataclass(frozen=True)
class Release(Transition[bool]):
    """``IN_PROGRESS --release--> (absent)`` if still ours, so that a retry can claim at once.

    ``undo`` (a guard's, taking its reservation back) goes in the same transaction, fenced by the same condition:
    the reservation goes with the claim, or neither does. Answers True when no record of the key stands after it
    (this claim deleted now, or by an earlier attempt whose answer was lost), False when another one does: the key
    was taken over (the newer owner's record, and the reservation it took over with it, are left alone) or
    completed. The message's outcome is then that record's, not this worker's to give. Raises
    ``BusinessConditionFailed`` when an undo write's condition failed, and ``TransactionConflict`` when conflicts
    outlasted the time (the same request each time, and a reservation left standing costs more than the wait):
    nothing was released, and the lease runs out.
    """

    claim: Claimed
    undo: tuple[Write, ...] = ()

    def delete(self, table: Table) -> dict[str, Any]:
        return {
            "TableName": table.name,
            "Key": table.key(self.claim.record_id),
            "ConditionExpression": OWNED,
            "ExpressionAttributeNames": RELEASE_NAMES,
            "ExpressionAttributeValues": {
                OWNER: {"S": self.claim.owner_token},
                ":in_progress": {"S": Status.IN_PROGRESS.value},
            },
            # A refusal tells a record that stands (another owner's) from none (released already).
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def items(self, table: Table, now_ms: int) -> list[dict[str, Any]]:
        return [{"Delete": self.delete(table)}, *(write.to_transact_item() for write in self.undo)]

    def writes(self) -> Sequence[Write]:
        return self.undo

    def landed(self, items: list[dict[str, Any]]) -> bool:
        return True

    def read(self, cancelled: RecordRefused | Refused) -> bool | None:
        # A refused undo is told in its own words by its own transaction.
        return None if isinstance(cancelled, Refused) else cancelled.record is None

    def alone(self, table: Table, remaining_ms: Callable[[], int] | None) -> bool:
        released = table.absorbing(lambda: self._once(table, self.undo), remaining_ms)
        if isinstance(released, Conflicted):
            raise TransactionConflict(released.reason)
        return released

    def abandoned(self, table: Table) -> bool:
        """A dead worker's claim released with its undo, fenced on its owner token as its own release would be;
        False when another worker took the key over meanwhile (left alone)."""
        left = list(self.undo)
        while True:
            try:
                return self._once(table, left)
            except BusinessConditionFailed as refused:
                # That part of the reservation is gone already (settled, or cleared by hand): the claim and the
                # rest of the reservation are still to be released. One write fewer each time, so this ends.
                left.remove(refused.write)

    def _once(self, table: Table, undo: Sequence[Write]) -> bool:
        delete = self.delete(table)
        if undo:
            token = str(uuid.uuid5(RELEASE_TOKEN_NAMESPACE, self.claim.owner_token))
            answer = table.transact_with_record({"Delete": delete}, undo, token)
            if isinstance(answer, Refused):
                raise BusinessConditionFailed(answer.write)
            return answer is None or answer.record is None
        try:
            table.write(table.client.delete_item, **delete)
        except ClientError as error:
            return table.failed_condition_item_or_none(error) is None
        return True
