"""What a transition answers, and what each message asks of one: matched by the processor in one place."""

from __future__ import annotations

from dataclasses import dataclass, field

from consumer.idempotency.record import IdempotencyRecord
from consumer.idempotency.writes import Write


@dataclass(frozen=True)
class Claimed:
    """This worker holds the key until ``lease_expires_at_ms`` or until it commits or releases."""

    record_id: str
    owner_token: str
    lease_expires_at_ms: int
    # None after a claim that went in a transaction (a guard's, or a shared one): a transaction returns no attributes.
    attempts: int | None


@dataclass(frozen=True)
class Applied:
    """Optimistic mode: the record and the business writes were applied together."""

    record_id: str
    owner_token: str


@dataclass(frozen=True)
class Duplicate:
    """Already completed with the same payload: skip the business logic."""

    record: IdempotencyRecord


@dataclass(frozen=True)
class InFlight:
    """Another worker holds the key: a claim of this payload whose lease has not ended, or a claim of another payload
    (``of_another_content``), ended or not, which only its own message settles. Retry this record later."""

    record: IdempotencyRecord
    of_another_content: bool = False


@dataclass(frozen=True)
class PayloadMismatch:
    """The key was applied with a different payload: the message is poison."""

    record: IdempotencyRecord


@dataclass(frozen=True)
class Refused:
    """A guard's condition failed: nothing was claimed or written, and the message must not run.

    ``abandoned_released``: the refused claim was a takeover, and the dead worker's claim was released
    (with the guard's undo, which takes its reservation back) so that nothing of the message is left.
    """

    write: Write
    abandoned_released: bool = False
    # The write's item was held by another message (its ``held_by`` attribute carried another token): busy,
    # not refused; nothing was claimed, and the message is to come back later.
    busy: bool = False


@dataclass(frozen=True)
class Committed:
    """Lock mode: the record is completed, with the business writes, by this claim."""


@dataclass(frozen=True)
class Fenced:
    """The claim was taken over (or released) before its commit: the record is someone else's now."""

    record_id: str
    current: IdempotencyRecord | None

    @property
    def reason(self) -> str:
        owner = "nobody" if self.current is None else f"{self.current.status.value} by another owner"
        return f"lease on {self.record_id} lost before commit; record is now held {owner}"


@dataclass(frozen=True)
class Conflicted:
    """DynamoDB's transaction conflicts outlasted the retries: nothing was written; retry soon."""

    reason: str
    # The conflicts met and retried before giving up (not part of its identity).
    conflicts_absorbed: int = field(default=0, kw_only=True, compare=False)


@dataclass(frozen=True)
class RecordRefused:
    """A transaction's record condition failed; ``record`` is as it was (None when absent)."""

    record: IdempotencyRecord | None


@dataclass(frozen=True)
class ApplyRequest:
    """An optimistic message's commit: its record, its payload's hash, its handler's result and writes."""

    record_id: str
    payload_hash: str
    result: object = None
    writes: tuple[Write, ...] = ()


@dataclass(frozen=True)
class ClaimRequest:
    """A lock-mode message's claim: its record, its lease, its guard's writes and what takes them back."""

    record_id: str
    payload_hash: str
    lease_ms: int
    guard: tuple[Write, ...] = ()
    undo: tuple[Write, ...] = ()


Existing = Duplicate | InFlight | PayloadMismatch
ClaimResult = Claimed | Existing | Refused | Conflicted
ApplyResult = Applied | Existing | Refused | Conflicted
CommitResult = Committed | Fenced | Refused | Conflicted
