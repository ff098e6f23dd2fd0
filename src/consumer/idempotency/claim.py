"""Lock mode's first transition: the key taken for a lease, with the guard's conditions and reservations."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from botocore.exceptions import ClientError

from consumer.errors import TransactionConflict, TransientError
from consumer.idempotency.answers import Claimed, ClaimRequest, ClaimResult, Conflicted, RecordRefused, Refused
from consumer.idempotency.calls import CLAIM_UPDATE, Table, existing
from consumer.idempotency.record import Attr, IdempotencyRecord, Status, reservation_token
from consumer.idempotency.release import Release
from consumer.idempotency.transition import Transition
from consumer.idempotency.writes import Write


@dataclass(frozen=True)
class Claim(Transition[ClaimResult]):
    """``(absent | expired | abandoned) --claim--> IN_PROGRESS`` for ``request.lease_ms`` from the moment it is
    written, owned by ``token`` on every attempt: a claim that landed with its answer lost is found to be its own.

    With a guard (a handler's checks and reservations), the claim and those writes are one transaction, the
    record first: ``Refused`` when a guard's condition failed and the key was free, in which case nothing at
    all was written. A refusal may have met an abandoned claim of the same message (a worker that died after
    its reservation): that claim is then released with ``undo``, fenced, or nothing would ever settle its
    reservation (every later delivery is refused the same way). That costs a consistent read of the record on
    every refusal, and the release when one is found; a release that cannot land raises (``TransientError``),
    as the message must come back rather than be dead-lettered with its reservation standing.
    """

    request: ClaimRequest
    token: str

    def __post_init__(self) -> None:
        if self.request.lease_ms <= 0:
            raise ValueError(f"lease must be positive, got {self.request.lease_ms} ms")

    @property
    def record_id(self) -> str:
        return self.request.record_id

    def record_item(self, table: Table, now_ms: int) -> dict[str, Any]:
        request = self.request
        lease = {":lease": {"N": str(now_ms + request.lease_ms)}}
        return table.claiming_write(request.record_id, CLAIM_UPDATE, now_ms, self.token, request.payload_hash, lease)

    def items(self, table: Table, now_ms: int) -> list[dict[str, Any]]:
        return [{"Update": self.record_item(table, now_ms)}, *(write.to_transact_item() for write in self.writes())]

    def writes(self) -> Sequence[Write]:
        return self.request.guard

    def landed(self, items: list[dict[str, Any]]) -> ClaimResult:
        lease_end = int(items[0]["Update"]["ExpressionAttributeValues"][":lease"]["N"])
        return Claimed(self.record_id, self.token, lease_end, None)

    def read(self, cancelled: RecordRefused | Refused) -> ClaimResult | None:
        # A refused guard may have met an abandoned claim of this message, which only ``alone`` looks for.
        record = None if isinstance(cancelled, Refused) else cancelled.record
        if record is None or record.owner_token == self.token:
            return None
        return existing(record, self.request.payload_hash)

    def alone(self, table: Table, remaining_ms: Callable[[], int] | None) -> ClaimResult:
        answer = table.absorbing(lambda: self._once(table), remaining_ms)
        if not isinstance(answer, Refused) or answer.busy:
            # Busy: an abandoned claim of this message holds nothing on that item; its takeover comes later.
            return answer
        abandoned = table.get(self.record_id)
        if abandoned is None or not self._abandoned(abandoned, table.now_ms()):
            return answer
        dead = Claimed(self.record_id, abandoned.owner_token, abandoned.lease_expires_at_ms or 0, abandoned.attempts)
        released = table.absorbing(lambda: Release(dead, self.request.undo).abandoned(table), remaining_ms)
        if isinstance(released, Conflicted):
            raise TransactionConflict(
                f"the abandoned claim of {self.record_id} could not be released: {released.reason}"
            )
        return replace(answer, abandoned_released=released)

    def _abandoned(self, record: IdempotencyRecord, now_ms: int) -> bool:
        """A claim of the same message whose worker is gone: in progress, and its lease over."""
        lease_end = record.lease_expires_at_ms
        return (
            record.status is Status.IN_PROGRESS
            and record.payload_hash == self.request.payload_hash
            and lease_end is not None
            and lease_end < now_ms
        )

    def _once(self, table: Table) -> ClaimResult:
        now_ms = table.now_ms()
        claim_write = self.record_item(table, now_ms)
        lease_end = now_ms + self.request.lease_ms
        if self.writes():
            holder = reservation_token(self.record_id, self.request.payload_hash)
            # The owner token outlives this attempt, so each attempt's request has a token of its own.
            answer = table.transact_with_record(
                {"Update": claim_write}, self.writes(), table.new_token(), holder=holder
            )
            if answer is None:
                return Claimed(self.record_id, self.token, lease_end, None)
            if isinstance(answer, Refused):
                # The key was free and the guard refused. The record's reason is read first, so a
                # completed key (whose commit may have moved the business item past the guard)
                # stays a duplicate.
                return answer
            if answer.record is None:
                # "Claimable" holds for an absent item, so this cannot happen; retry if it does.
                raise TransientError(f"claim of {self.record_id} failed and no item came back")
            current = answer.record
        else:
            try:
                response = table.write(table.client.update_item, **claim_write, ReturnValues="UPDATED_NEW")
            except ClientError as error:
                current = table.failed_condition_item(error)
            else:
                # UPDATED_NEW returns what the claim set, the attempts among them.
                return Claimed(self.record_id, self.token, lease_end, int(response["Attributes"][Attr.ATTEMPTS]["N"]))
        if current.owner_token == self.token:
            # Ambiguous success: botocore retried a claim whose first attempt was applied but whose answer was
            # lost, or a shared transaction landed with this claim. Ours, until the lease end the record carries.
            return Claimed(self.record_id, self.token, current.lease_expires_at_ms or lease_end, current.attempts)
        return existing(current, self.request.payload_hash)
