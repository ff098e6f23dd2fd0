"""Lock mode's second transition: the record completed with the business writes, if the claim is still ours."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from consumer.idempotency.answers import Claimed, CommitResult, Committed, RecordRefused, Refused
from consumer.idempotency.calls import COMMIT_TOKEN_NAMESPACE, Table, committed_by
from consumer.idempotency.transition import Transition
from consumer.idempotency.writes import Write


@dataclass(frozen=True)
class Commit(Transition[CommitResult]):
    """``IN_PROGRESS --commit--> COMPLETED``, fenced on the claim's owner token: ``Fenced`` when the claim was taken
    over, ``Refused`` when a business write's condition failed. It sends the same request on every attempt: giving
    up on a conflict would leave a made external call unrecorded until the lease runs out."""

    claim: Claimed
    result: object = None
    business: tuple[Write, ...] = ()

    def items(self, table: Table, now_ms: int) -> list[dict[str, Any]]:
        completion = {"Update": table.completion(self.claim, self.result)}
        return [completion, *(write.to_transact_item() for write in self.business)]

    def writes(self) -> Sequence[Write]:
        return self.business

    def landed(self, items: list[dict[str, Any]]) -> CommitResult:
        return Committed()

    def read(self, cancelled: RecordRefused | Refused) -> CommitResult | None:
        if isinstance(cancelled, Refused):
            return cancelled
        return committed_by(self.claim, cancelled.record)

    def alone(self, table: Table, remaining_ms: Callable[[], int] | None) -> CommitResult:
        return table.absorbing(lambda: self._once(table), remaining_ms)

    def _once(self, table: Table) -> CommitResult:
        completion = table.completion(self.claim, self.result)
        if not self.business:
            try:
                table.write(table.client.update_item, **completion)
            except ClientError as error:
                return committed_by(self.claim, table.failed_condition_item_or_none(error))
            return Committed()
        token = str(uuid.uuid5(COMMIT_TOKEN_NAMESPACE, self.claim.owner_token))
        answer = table.transact_with_record({"Update": completion}, self.business, token)
        if answer is None or isinstance(answer, Refused):
            return answer or Committed()
        return committed_by(self.claim, answer.record)
