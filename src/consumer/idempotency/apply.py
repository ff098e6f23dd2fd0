"""Optimistic mode's one transition: the record completed with the business writes, in one write."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from consumer.errors import TransientError
from consumer.idempotency.answers import Applied, ApplyRequest, ApplyResult, RecordRefused, Refused
from consumer.idempotency.calls import APPLY_UPDATE, Table, existing
from consumer.idempotency.record import Status, encode_result
from consumer.idempotency.transition import Transition
from consumer.idempotency.writes import Write


@dataclass(frozen=True)
class Apply(Transition[ApplyResult]):
    """``(absent | expired) --apply--> COMPLETED`` with ``request``'s writes, owned by ``token`` on every attempt, so
    that a write of it whose answer was lost (shared or its own) is recognised as this message's."""

    request: ApplyRequest
    token: str

    @property
    def record_id(self) -> str:
        return self.request.record_id

    def record_item(self, table: Table, now_ms: int) -> dict[str, Any]:
        values = {
            ":completed": {"S": Status.COMPLETED.value},
            ":result": {"S": encode_result(self.request.result, table.result_max_bytes)},
        }
        request = self.request
        return table.claiming_write(request.record_id, APPLY_UPDATE, now_ms, self.token, request.payload_hash, values)

    def items(self, table: Table, now_ms: int) -> list[dict[str, Any]]:
        return [{"Update": self.record_item(table, now_ms)}, *(write.to_transact_item() for write in self.writes())]

    def writes(self) -> Sequence[Write]:
        return self.request.writes

    def landed(self, items: list[dict[str, Any]]) -> ApplyResult:
        return Applied(self.record_id, self.token)

    def read(self, cancelled: RecordRefused | Refused) -> ApplyResult | None:
        if isinstance(cancelled, Refused):
            return cancelled
        if cancelled.record is None:
            return None
        if cancelled.record.owner_token == self.token:
            return Applied(self.record_id, self.token)
        return existing(cancelled.record, self.request.payload_hash)

    def alone(self, table: Table, remaining_ms: Callable[[], int] | None) -> ApplyResult:
        return table.absorbing(lambda: self._once(table), remaining_ms)

    def _once(self, table: Table) -> ApplyResult:
        record_write = self.record_item(table, table.now_ms())
        if self.writes():
            # The owner token outlives this attempt, so each attempt's request has a token of its own.
            answer = table.transact_with_record({"Update": record_write}, self.writes(), table.new_token())
            if isinstance(answer, Refused):
                return answer
            current = None if answer is None else answer.record
            if answer is not None and current is None:
                # "Claimable" holds for an absent item, so this cannot happen; retry if it does.
                raise TransientError(f"condition on {self.record_id} failed and no item came back")
        else:
            try:
                table.write(table.client.update_item, **record_write)
                current = None
            except ClientError as error:
                current = table.failed_condition_item(error)
        if current is None or current.owner_token == self.token:
            # The second case is ambiguous success: a retried write that found its own.
            return Applied(self.record_id, self.token)
        return existing(current, self.request.payload_hash)
