"""The idempotency state machine, one conditional write per transition.

    (absent | expired) --claim--> IN_PROGRESS --commit--> COMPLETED
                                      |  ^
                          release     |  | claim after the lease ran out (takeover)
                                      v  |
                                   (absent)

    (absent | expired) --apply_once--> COMPLETED        (optimistic mode)

A lock-mode claim may carry a guard (conditions and reservations on business items): then
the claim and the guard are one transaction, the record first, and commit and release carry
what settles the reservation under the same fence. A guard refused on a takeover releases the
abandoned claim with the guard's undo (a read, then a release fenced on that claim's owner), so
no reservation outlives its message.

Every transition is a single conditional write, so DynamoDB, which applies each
item's conditional writes one at a time, is the arbiter. Commit and release are
fenced by the claim's ``ownerToken``: a worker whose lease ran out and was taken
over (a zombie) fails its condition and cannot overwrite the newer owner.

An expired record (``expiresAt`` in the past) counts as absent in the conditions
themselves: TTL deletion is lazy and may lag by days.

Every transition is answered with a value (matched by the caller): DynamoDB's own
``TransactionConflict`` is absorbed here, under the injected ``ConflictRetry``, and one
still unabsorbed is the ``Contended`` answer. Only what no answer describes raises:
``TransientError`` (throttled, unreachable) and a bug's ``ClientError``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, cast

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from consumer.conflicts import ConflictRetry
from consumer.errors import BusinessConditionFailed, ErrorType, PoisonMessage, TransactionConflict, TransientError
from consumer.idempotency.record import Attr, IdempotencyRecord, Status, encode_result, reservation_token
from consumer.idempotency.writes import MAX_BUSINESS_WRITES, Write

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

_T = TypeVar("_T")

_NAMES = {
    "#id": Attr.ID,
    "#status": Attr.STATUS,
    "#expires": Attr.EXPIRES_AT,
    "#lease": Attr.LEASE_EXPIRES_AT,
    "#owner": Attr.OWNER_TOKEN,
    "#hash": Attr.PAYLOAD_HASH,
    "#result": Attr.RESULT,
    "#attempts": Attr.ATTEMPTS,
}

# Free to take: nothing there, an expired record, or an abandoned claim on the same payload.
_CLAIMABLE = (
    "attribute_not_exists(#id) OR #expires < :now_s OR (#status = :in_progress AND #lease < :now_ms AND #hash = :hash)"
)
_OWNED = "#owner = :owner AND #status = :in_progress"

# Each transition's update, named so that tooling (the fault-injection harness) can tell
# the transitions apart by equality instead of parsing expressions. ``OWNER`` is the value
# placeholder of the fencing token in every one of them.
OWNER = ":owner"
CLAIM_UPDATE = (
    "SET #status = :in_progress, #expires = :expires_at, #lease = :lease, #owner = :owner, #hash = :hash,"
    " #attempts = if_not_exists(#attempts, :zero) + :one REMOVE #result"
)
COMMIT_UPDATE = "SET #status = :completed, #result = :result, #expires = :expires_at REMOVE #lease"
APPLY_UPDATE = (
    "SET #status = :completed, #expires = :expires_at, #owner = :owner, #hash = :hash,"
    " #result = :result, #attempts = if_not_exists(#attempts, :zero) + :one REMOVE #lease"
)
_COMMIT_NAMES = {k: _NAMES[k] for k in ("#status", "#result", "#expires", "#lease", "#owner")}
_RELEASE_NAMES = {k: _NAMES[k] for k in ("#owner", "#status")}

_TRANSIENT_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "TransactionInProgressException",
    }
)
# A single-item write to an item that an in-flight transaction holds.
_CONFLICT_CODE = "TransactionConflictException"
# What DynamoDB's ValidationException says of a transaction with two actions on one item.
_ONE_ITEM_TWICE = "multiple operations on one item"

# TransactWriteItems' own limits: a group of messages is split to stay within both.
MAX_TRANSACTION_ITEMS = 100
MAX_TRANSACTION_BYTES = 4 * 1024 * 1024

_COMMIT_TOKEN_NAMESPACE = uuid.UUID("6f1c2f4e-4b0a-4a53-9a43-1c3c8e0e9d11")
_RELEASE_TOKEN_NAMESPACE = uuid.UUID("d67b0bae-1ab0-4361-b58c-7d489a5dd5fc")


@dataclass(frozen=True)
class _Answer:
    # DynamoDB transaction conflicts met and retried before this answer (not part of its identity).
    conflicts_absorbed: int = field(default=0, kw_only=True, compare=False)


@dataclass(frozen=True)
class Claimed(_Answer):
    """This worker holds the key until ``lease_expires_at_ms`` or until it commits or releases."""

    record_id: str
    owner_token: str
    lease_expires_at_ms: int
    # None after a claim with a guard: a transaction returns no attributes.
    attempts: int | None


@dataclass(frozen=True)
class Applied(_Answer):
    """Optimistic mode: the record and the business writes were applied together."""

    record_id: str
    owner_token: str


@dataclass(frozen=True)
class Duplicate(_Answer):
    """Already completed with the same payload: skip the business logic."""

    record: IdempotencyRecord


@dataclass(frozen=True)
class InFlight(_Answer):
    """Another worker holds an unexpired lease: retry this record later."""

    record: IdempotencyRecord


@dataclass(frozen=True)
class PayloadMismatch(_Answer):
    """The key was used before with a different payload: the message is poison."""

    record: IdempotencyRecord


@dataclass(frozen=True)
class Refused(_Answer):
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
class Committed(_Answer):
    """Lock mode: the record is completed, with the business writes, by this claim."""


@dataclass(frozen=True)
class Fenced(_Answer):
    """The claim was taken over (or released) before its commit: the record is someone else's now."""

    record_id: str
    current: IdempotencyRecord | None

    @property
    def reason(self) -> str:
        owner = "nobody" if self.current is None else f"{self.current.status.value} by another owner"
        return f"lease on {self.record_id} lost before commit; record is now held {owner}"


@dataclass(frozen=True)
class Contended(_Answer):
    """DynamoDB's transaction conflicts outlasted the retries: nothing was written; retry soon."""

    reason: str


@dataclass(frozen=True)
class _RecordRefused:
    """A transaction's record condition failed; ``record`` is as it was (None when absent)."""

    record: IdempotencyRecord | None


@dataclass(frozen=True)
class ApplyRequest:
    """One optimistic message's part of a group commit: what ``apply_once`` takes."""

    record_id: str
    payload_hash: str
    result: object = None
    writes: tuple[Write, ...] = ()


@dataclass(frozen=True)
class ClaimRequest:
    """One lock-mode message's part of a group claim: what ``claim`` takes."""

    record_id: str
    payload_hash: str
    lease_ms: int
    guard: tuple[Write, ...] = ()
    undo: tuple[Write, ...] = ()


@dataclass(frozen=True)
class CommitRequest:
    """One claimed message's part of a group commit: what ``commit`` takes."""

    claim: Claimed
    result: object = None
    writes: tuple[Write, ...] = ()


Existing = Duplicate | InFlight | PayloadMismatch
ClaimResult = Claimed | Existing | Refused | Contended
ApplyResult = Applied | Existing | Refused | Contended
CommitResult = Committed | Fenced | Refused | Contended


def _held_by_another(write: Write, reason: Mapping[str, Any], holder: str) -> bool:
    """Whether a write's item, as its failed condition found it, carried another message's hold."""
    item = reason.get("Item")
    if write.held_by is None or not isinstance(item, Mapping):
        return False
    held = item.get(write.held_by)
    return isinstance(held, Mapping) and held.get("S") not in (None, holder)


def _cancelled(
    writes: Sequence[Write], reasons: Sequence[Mapping[str, Any]], holder: str | None
) -> _RecordRefused | Refused | None:
    """What a cancelled transaction's reasons say of one message's items (its record first, then ``writes``):
    the record's failed condition, a business write's, or None when none of them failed. Raises
    ``TransactionConflict`` for a conflict, ``TransientError`` for any other reason."""
    record_reason = reasons[0] if reasons else {}
    if record_reason.get("Code") == "ConditionalCheckFailed":
        item = record_reason.get("Item")
        return _RecordRefused(IdempotencyRecord.from_item(item) if isinstance(item, Mapping) and item else None)
    if record_reason.get("Code") == "TransactionConflict":
        # DynamoDB may judge the business items against a state the conflicting transaction is changing:
        # a business condition failed beside it settles nothing, so the whole transaction is tried again.
        raise TransactionConflict("transaction cancelled: TransactionConflict on the record")
    for write, reason in zip(writes, reasons[1:], strict=False):
        if reason.get("Code") == "ConditionalCheckFailed":
            return Refused(write, busy=holder is not None and _held_by_another(write, reason, holder))
    codes = sorted({str(reason.get("Code")) for reason in reasons} - {"None"})
    if "TransactionConflict" in codes:
        raise TransactionConflict(f"transaction cancelled: {', '.join(codes)}")
    if codes:
        raise TransientError(f"transaction cancelled: {', '.join(codes)}")
    return None


def _item_key(transact_item: Mapping[str, Any]) -> tuple[str, object]:
    """The item a transaction's action names: its table and key (a put's whole item, whose key the schema alone
    tells; DynamoDB refuses a group whose puts meet on one item, and its messages are then applied alone)."""
    action = next(iter(transact_item.values()))
    key = action.get("Key")
    if key is not None:
        # A key's values are scalars (S, N or B), so its attributes, in order, name it without encoding it.
        return action["TableName"], tuple(sorted((name, *value.items()) for name, value in key.items()))
    return action["TableName"], json.dumps(action.get("Item"), sort_keys=True)


class _Group:
    """Messages packed into one transaction: their indexes, the items they name, their items' count and size."""

    def __init__(self, indexes: list[int], keys: set[tuple[str, object]], count: int, size: int) -> None:
        self.indexes, self.keys, self.count, self.size = indexes, keys, count, size

    def fits(self, keys: set[tuple[str, object]], count: int, size: int) -> bool:
        within = self.count + count <= MAX_TRANSACTION_ITEMS and self.size + size <= MAX_TRANSACTION_BYTES
        return within and not self.keys & keys

    def add(self, index: int, keys: set[tuple[str, object]], count: int, size: int) -> None:
        self.indexes.append(index)
        self.keys |= keys
        self.count += count
        self.size += size


_A = TypeVar("_A")
# A message of a cancelled group that only its own transition can answer.
_ALONE: Literal["alone"] = "alone"


@dataclass(frozen=True)
class _Grouping(Generic[_A]):
    """What one transition is for a group's messages (each by its index in the group's requests).

    ``items``: its transaction items at a time in ms, its record first; ``writes``: those after the record, whose
    cancellation reasons ``_cancelled`` reads; ``answer``: its answer from what they said (``_ALONE`` when only its
    own transition can tell); ``landed``: its answer when the group's transaction landed with the items it sent;
    ``alone``: its own transition, for what a group cannot settle.
    """

    items: Callable[[int, int], list[dict[str, Any]]]
    writes: Callable[[int], Sequence[Write]]
    answer: Callable[[int, _RecordRefused | Refused], _A | Literal["alone"]]
    landed: Callable[[int, list[dict[str, Any]]], _A]
    alone: Callable[[int], _A]


def _new_token() -> str:
    return str(uuid.uuid4())


class IdempotencyStore:
    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        ttl_seconds: int,
        result_max_bytes: int = 64 * 1024,
        clock: Callable[[], float] = time.time,
        new_token: Callable[[], str] = _new_token,
        conflicts: ConflictRetry | None = None,
    ) -> None:
        # Without a policy a conflict is answered at once (tools and tests that count calls).
        self._conflicts = conflicts
        self._client = client
        self._table = table_name
        self._ttl_seconds = ttl_seconds
        self._result_max_bytes = result_max_bytes
        self._clock = clock
        self._new_token = new_token

    # -- transitions ---------------------------------------------------------------

    def claim(
        self,
        record_id: str,
        payload_hash: str,
        lease_ms: int,
        guard: Sequence[Write] = (),
        *,
        undo: Sequence[Write] = (),
        remaining_ms: Callable[[], int] | None = None,
        owner: str | None = None,
    ) -> ClaimResult:
        """Lock mode, step 1: take the key for ``lease_ms`` (one round trip either way).

        With ``guard`` (a handler's checks and reservations), the claim and those writes are
        one transaction, the record first: ``Refused`` when a guard's condition failed and
        the key was free, in which case nothing at all was written. ``remaining_ms`` bounds
        the conflict retries (each a new claim).

        A refusal may have met an abandoned claim of the same message (a worker that died after
        its reservation): that claim is then released with ``undo``, fenced, in one transaction,
        or nothing would ever settle its reservation (every later delivery is refused the same
        way). That costs a consistent read of the record on every refusal, and the release when
        one is found; a release that cannot land raises (``TransientError``), as the message must
        come back rather than be dead-lettered with its reservation standing.

        ``owner``: the fencing token a group claim gave the message, kept for every attempt, so that a record the
        group wrote with it (an answer lost) is recognised as this message's own claim, not another's in flight.
        """
        answer = self._absorbing(lambda: self._claim(record_id, payload_hash, lease_ms, guard, owner), remaining_ms)
        if not isinstance(answer, Refused) or answer.busy:
            # Busy: an abandoned claim of this message holds nothing on that item; its takeover comes later.
            return answer
        abandoned = self.get(record_id)
        if abandoned is None or not self._abandoned(abandoned, payload_hash):
            return answer
        lease_end = abandoned.lease_expires_at_ms or 0
        dead = Claimed(record_id, abandoned.owner_token, lease_end, abandoned.attempts)
        released = self._absorbing(lambda: self._release_abandoned(dead, undo), remaining_ms)
        if isinstance(released, Contended):
            raise TransactionConflict(f"the abandoned claim of {record_id} could not be released: {released.reason}")
        return replace(answer, abandoned_released=released)

    def _claim(
        self, record_id: str, payload_hash: str, lease_ms: int, guard: Sequence[Write], owner: str | None = None
    ) -> ClaimResult:
        if lease_ms <= 0:
            raise ValueError(f"lease must be positive, got {lease_ms} ms")
        now_ms = self._now_ms()
        token = owner or self._new_token()
        lease_end = now_ms + lease_ms
        claim_write = self._claiming_write(
            record_id, CLAIM_UPDATE, now_ms, token, payload_hash, {":lease": {"N": str(lease_end)}}
        )
        if guard:
            # ClientRequestToken: the claim's own token, new for every claim; a given owner token outlives this
            # attempt, so the attempt's request then needs a token of its own.
            holder = reservation_token(record_id, payload_hash)
            request_token = self._new_token() if owner else token
            cancelled = self._transact_with_record({"Update": claim_write}, guard, request_token, holder=holder)
            if cancelled is None:
                return Claimed(record_id, token, lease_end, None)
            if isinstance(cancelled, Refused):
                # The key was free and the guard refused. The record's reason is read first, so a
                # completed key (whose commit may have moved the business item past the guard)
                # stays a duplicate.
                return cancelled
            if cancelled.record is None:
                # "Claimable" holds for an absent item, so this cannot happen; retry if it does.
                raise TransientError(f"claim of {record_id} failed and no item came back")
            current = cancelled.record
        else:
            try:
                response = self._call(self._client.update_item, **claim_write, ReturnValues="UPDATED_NEW")
            except ClientError as error:
                current = self._failed_condition_item(error)
            else:
                # UPDATED_NEW returns what the claim set, the attempts among them.
                return Claimed(record_id, token, lease_end, int(response["Attributes"][Attr.ATTEMPTS]["N"]))
        if current.owner_token == token:
            # Ambiguous success: botocore retried a claim whose first attempt was applied but whose answer was
            # lost, or a group claim landed with this owner token. Ours, until the lease end the record carries.
            return Claimed(record_id, token, current.lease_expires_at_ms or lease_end, current.attempts)
        return self._existing(current, payload_hash)

    def commit(
        self,
        claim: Claimed,
        result: object = None,
        writes: Sequence[Write] = (),
        *,
        remaining_ms: Callable[[], int] | None = None,
    ) -> CommitResult:
        """Lock mode, step 2: complete the record, with the business writes, if still ours.

        ``Fenced`` when the claim was taken over, ``Refused`` when a business write's
        condition failed. A transaction conflict is retried for as long as ``remaining_ms``
        allows (as every transition's is): the commit sends the same request each time, while
        giving up would leave a made external call unrecorded until the lease runs out.
        """
        return self._absorbing(lambda: self._commit(claim, result, writes), remaining_ms)

    def _commit(self, claim: Claimed, result: object, writes: Sequence[Write]) -> CommitResult:
        completion = self._completion(claim, result)
        if not writes:
            try:
                self._call(self._client.update_item, **completion)
            except ClientError as error:
                return self._committed_by(claim, self._failed_condition_item_or_none(error))
            return Committed()
        token = str(uuid.uuid5(_COMMIT_TOKEN_NAMESPACE, claim.owner_token))
        cancelled = self._transact_with_record({"Update": completion}, writes, token)
        if cancelled is None or isinstance(cancelled, Refused):
            return cancelled or Committed()
        return self._committed_by(claim, cancelled.record)

    def _completion(self, claim: Claimed, result: object) -> dict[str, Any]:
        """The record's completion, fenced on the claim's owner token: a commit's first item."""
        return {
            "TableName": self._table,
            "Key": {Attr.ID: {"S": claim.record_id}},
            "UpdateExpression": COMMIT_UPDATE,
            "ConditionExpression": _OWNED,
            "ExpressionAttributeNames": _COMMIT_NAMES,
            "ExpressionAttributeValues": {
                ":completed": {"S": Status.COMPLETED.value},
                ":in_progress": {"S": Status.IN_PROGRESS.value},
                ":result": {"S": encode_result(result, self._result_max_bytes)},
                # From the lease's end, not from now: a retried commit must send the very same
                # request (its ClientRequestToken allows nothing else), and a commit comes
                # before the lease ends, so the record lives at least its TTL.
                ":expires_at": {"N": str(claim.lease_expires_at_ms // 1000 + self._ttl_seconds)},
                OWNER: {"S": claim.owner_token},
            },
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def release(
        self, claim: Claimed, undo: Sequence[Write] = (), *, remaining_ms: Callable[[], int] | None = None
    ) -> bool:
        """Lock mode, on failure: delete the record if still ours, so a retry can claim at once.

        ``undo`` (a guard's, taking its reservation back) goes in the same transaction, fenced
        by the same condition: the reservation goes with the claim, or neither does. Returns
        False when the claim was already taken over: the newer owner's record, and the
        reservation it took over with it, are left alone. Raises ``BusinessConditionFailed``
        when an undo write's condition failed, and ``TransactionConflict`` when conflicts
        outlasted ``remaining_ms`` (the same request each time, and a reservation left standing
        costs more than the wait): nothing was released, and the lease runs out.
        """
        released = self._absorbing(lambda: self._release(claim, undo), remaining_ms)
        if isinstance(released, Contended):
            raise TransactionConflict(released.reason)
        return released

    def _release_abandoned(self, dead: Claimed, undo: Sequence[Write]) -> bool:
        """Release a dead worker's claim and its reservation with ``undo``, fenced on its owner token as its own
        release would be; False when another worker took the key over meanwhile (left alone)."""
        left = list(undo)
        while True:
            try:
                return self._release(dead, left)
            except BusinessConditionFailed as refused:
                # That part of the reservation is gone already (settled, or cleared by hand): the claim and the
                # rest of the reservation are still to be released. One write fewer each time, so this ends.
                left.remove(refused.write)

    def _release(self, claim: Claimed, undo: Sequence[Write]) -> bool:
        delete: dict[str, Any] = {
            "TableName": self._table,
            "Key": {Attr.ID: {"S": claim.record_id}},
            "ConditionExpression": _OWNED,
            "ExpressionAttributeNames": _RELEASE_NAMES,
            "ExpressionAttributeValues": {
                OWNER: {"S": claim.owner_token},
                ":in_progress": {"S": Status.IN_PROGRESS.value},
            },
        }
        if undo:
            token = str(uuid.uuid5(_RELEASE_TOKEN_NAMESPACE, claim.owner_token))
            cancelled = self._transact_with_record({"Delete": delete}, undo, token)
            if isinstance(cancelled, Refused):
                raise BusinessConditionFailed(cancelled.write)
            return cancelled is None
        try:
            self._call(self._client.delete_item, **delete)
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False
        return True

    def apply_once(
        self,
        record_id: str,
        payload_hash: str,
        result: object = None,
        writes: Sequence[Write] = (),
        *,
        remaining_ms: Callable[[], int] | None = None,
        owner: str | None = None,
    ) -> ApplyResult:
        """Optimistic mode: claim, complete and apply the business writes in one round trip.

        The record keeps an item of its own, named by the key alone, whatever the business
        writes are: only there can a key reused for other content be recognised, whichever
        business item that content names. ``Refused`` when a business write's condition failed.
        ``owner``: the fencing token a group commit gave the message, kept for every attempt, so
        that a record the group wrote with it (an answer lost) is recognised as this message's own.
        """
        request = ApplyRequest(record_id, payload_hash, result, tuple(writes))
        return self._absorbing(lambda: self._apply_once(request, owner), remaining_ms)

    def _apply_once(self, request: ApplyRequest, owner: str | None) -> ApplyResult:
        record_id, payload_hash, writes = request.record_id, request.payload_hash, request.writes
        token = owner or self._new_token()
        record_write = self._applying_write(request, token, self._now_ms())
        if writes:
            # A given owner token outlives this attempt, so the attempt's request needs a token of its own.
            request_token = self._new_token() if owner else token
            cancelled = self._transact_with_record({"Update": record_write}, writes, request_token)
            if isinstance(cancelled, Refused):
                return cancelled
            current = None if cancelled is None else cancelled.record
            if cancelled is not None and current is None:
                # "Claimable" holds for an absent item, so this cannot happen; retry if it does.
                raise TransientError(f"condition on {record_id} failed and no item came back")
        else:
            try:
                self._call(self._client.update_item, **record_write)
                current = None
            except ClientError as error:
                current = self._failed_condition_item(error)
        if current is None or current.owner_token == token:
            # The second case is ambiguous success: a retried write that found its own.
            return Applied(record_id, token)
        return self._existing(current, payload_hash)

    def apply_group(
        self, requests: Sequence[ApplyRequest], *, remaining_ms: Callable[[], int] | None = None
    ) -> list[ApplyResult | Exception]:
        """Optimistic mode for several messages at once: each as ``apply_once`` would answer it (or the
        exception it would raise), in as few transactions as DynamoDB's limits allow.

        Messages whose items (record and business writes) are disjoint share a transaction, each record
        with its own writes; messages that share an item are never in one. When DynamoDB cancels a group,
        its reasons name the failing items: the messages they belong to get their own answer (a record's
        failed condition says duplicate, in flight or key reused; a business write's, refused), or, for a
        conflict or anything less clear, go through ``apply_once`` alone, which absorbs conflicts and
        classifies the rest; the others are committed again without them. So one message's refusal never
        changes another's answer. An error that names no item (throttled, unreachable, a request refused
        whole) sends each message of the group through ``apply_once`` with the token it had in the group:
        a group applied while its answer was lost is then found, record by record, to be each one's own.
        """
        tokens = [self._new_token() for _ in requests]

        def alone(index: int) -> ApplyResult:
            request = requests[index]
            return self.apply_once(
                request.record_id,
                request.payload_hash,
                request.result,
                request.writes,
                remaining_ms=remaining_ms,
                owner=tokens[index],
            )

        return self._in_groups(
            len(requests),
            _Grouping(
                items=lambda index, now_ms: self._applying_items(requests[index], tokens[index], now_ms),
                writes=lambda index: requests[index].writes,
                answer=lambda index, cancelled: self._group_answer(requests[index], tokens[index], cancelled),
                landed=lambda index, _: Applied(requests[index].record_id, tokens[index]),
                alone=alone,
            ),
        )

    def claim_group(
        self, requests: Sequence[ClaimRequest], *, remaining_ms: Callable[[], int] | None = None
    ) -> list[ClaimResult | Exception]:
        """Lock mode, step 1 for several messages at once: each as ``claim`` would answer it (or the exception
        it would raise), each record's claim with its guard's writes, in as few transactions as the limits allow.

        Each message has its own owner (fencing) token for the group's whole life. A cancellation's reasons name
        the failing items: a record's failed condition says duplicate, in flight or key reused; a refused guard,
        a conflict or anything less clear sends the message through ``claim`` alone (a refused guard may have met
        an abandoned claim of the same message, which only ``claim`` looks for and releases); the others are
        claimed again without them. An error that names no item sends each message through ``claim`` with the
        token it had in the group: a group claim that landed while its answer was lost is each message's own.
        """
        if any(request.lease_ms <= 0 for request in requests):
            raise ValueError(f"lease must be positive, got {[request.lease_ms for request in requests]} ms")
        tokens = [self._new_token() for _ in requests]

        def answer(index: int, cancelled: _RecordRefused | Refused) -> ClaimResult | Literal["alone"]:
            record = None if isinstance(cancelled, Refused) else cancelled.record
            if record is None or record.owner_token == tokens[index]:
                return _ALONE
            return self._existing(record, requests[index].payload_hash)

        def landed(index: int, items: list[dict[str, Any]]) -> Claimed:
            lease_end = int(items[0]["Update"]["ExpressionAttributeValues"][":lease"]["N"])
            return Claimed(requests[index].record_id, tokens[index], lease_end, None)

        return self._in_groups(
            len(requests),
            _Grouping(
                items=lambda index, now_ms: self._claiming_items(requests[index], tokens[index], now_ms),
                writes=lambda index: requests[index].guard,
                answer=answer,
                landed=landed,
                alone=lambda index: self.claim_alone(requests[index], remaining_ms=remaining_ms, owner=tokens[index]),
            ),
        )

    def claim_alone(
        self, request: ClaimRequest, *, remaining_ms: Callable[[], int] | None = None, owner: str | None = None
    ) -> ClaimResult:
        """``claim`` of one message's ``ClaimRequest``: lock mode's message alone, or one its group left to it."""
        return self.claim(
            request.record_id,
            request.payload_hash,
            request.lease_ms,
            request.guard,
            undo=request.undo,
            remaining_ms=remaining_ms,
            owner=owner,
        )

    def commit_group(
        self, requests: Sequence[CommitRequest], *, remaining_ms: Callable[[], int] | None = None
    ) -> list[CommitResult | Exception]:
        """Lock mode, step 2 for several claimed messages at once: each as ``commit`` would answer it (or the
        exception it would raise), each record's completion, fenced on its own owner token, with its writes.

        A cancellation's reasons answer a message as ``commit`` reads them (its record's failed condition: fenced,
        or committed by its own token; a business write's: refused); a conflict or anything less clear sends it
        through ``commit`` alone; the others are committed again without them. An error that names no item sends
        each through ``commit`` alone, which finds a group commit that landed with its answer lost to be its own.
        """

        def answer(index: int, cancelled: _RecordRefused | Refused) -> CommitResult:
            if isinstance(cancelled, Refused):
                return cancelled
            return self._committed_by(requests[index].claim, cancelled.record)

        def alone(index: int) -> CommitResult:
            request = requests[index]
            return self.commit(request.claim, request.result, request.writes, remaining_ms=remaining_ms)

        return self._in_groups(
            len(requests),
            _Grouping(
                items=lambda index, _: self._committing_items(requests[index]),
                writes=lambda index: requests[index].writes,
                answer=answer,
                landed=lambda index, _: Committed(),
                alone=alone,
            ),
        )

    def _in_groups(self, count: int, grouping: _Grouping[_A]) -> list[_A | Exception]:
        """A transition for ``count`` messages, in as few transactions as fit: each message's answer, or the
        exception its own transition raised."""
        answers: list[_A | Exception | None] = [None] * count
        built: dict[int, list[dict[str, Any]]] = {}
        groups, alone = self._groups(count, grouping, built)
        for group in groups:
            alone += self._commit_group(group, grouping, answers, built)
        for index in sorted(alone):
            try:
                answers[index] = grouping.alone(index)
            except Exception as error:  # the message's own failure, as its transition would raise it to its caller
                answers[index] = error
        assert all(answer is not None for answer in answers), "every message of a group gets its own answer"
        return cast("list[_A | Exception]", answers)

    def _groups(
        self, count: int, grouping: _Grouping[_A], built: dict[int, list[dict[str, Any]]]
    ) -> tuple[list[list[int]], list[int]]:
        """The messages' indexes packed first-fit into disjoint groups within the limits; and those to apply alone.
        Each grouped message's items go in ``built``: its group's first attempt sends them as they are."""
        groups: list[_Group] = []
        alone: list[int] = []
        now_ms = self._now_ms()
        for index in range(count):
            try:
                items = grouping.items(index, now_ms)
                keys = {_item_key(item) for item in items}
                size = len(json.dumps(items))
            except Exception:  # a value DynamoDB has no type for: the message's own error, which its transition raises
                alone.append(index)
                continue
            if len(keys) < len(items) or len(items) > MAX_TRANSACTION_ITEMS:
                # Two actions on one item, or too many: the message's own transition says why, in its own words.
                alone.append(index)
                continue
            group = next((group for group in groups if group.fits(keys, len(items), size)), None)
            built[index] = items
            if group is None:
                groups.append(_Group([index], keys, len(items), size))
            else:
                group.add(index, keys, len(items), size)
        return [group.indexes for group in groups if len(group.indexes) > 1], alone + [
            group.indexes[0] for group in groups if len(group.indexes) == 1
        ]

    def _commit_group(
        self,
        group: list[int],
        grouping: _Grouping[_A],
        answers: list[_A | Exception | None],
        built: dict[int, list[dict[str, Any]]],
    ) -> list[int]:
        """Commit ``group``, again without each message a cancellation names; the indexes left to settle alone."""
        pending, alone = group, list[int]()
        while len(pending) > 1:
            now_ms = self._now_ms()
            # Built for the grouping, sent once; an attempt after a cancellation builds them at its own time.
            parts = [built.pop(index, []) or grouping.items(index, now_ms) for index in pending]
            try:
                # A token per group request: botocore's own retries of it are idempotent at DynamoDB.
                self._call(
                    self._client.transact_write_items,
                    TransactItems=[item for part in parts for item in part],
                    ClientRequestToken=self._new_token(),
                )
            except ClientError as error:
                if error.response["Error"]["Code"] != "TransactionCanceledException":
                    return alone + pending
                reasons = list(error.response.get("CancellationReasons") or [])
                if len(reasons) != sum(len(part) for part in parts):
                    return alone + pending
                rest = []
                for index, part in zip(pending, parts, strict=True):
                    mine, reasons = reasons[: len(part)], reasons[len(part) :]
                    answer = self._named(grouping, index, mine)
                    if answer is None:
                        rest.append(index)
                    elif answer == _ALONE:
                        alone.append(index)
                    else:
                        answers[index] = answer
                if len(rest) == len(pending):
                    # No item named: the same group would be cancelled again. Alone, each meets it in its own words.
                    return alone + pending
                pending = rest
            except Exception:  # an error naming no item: each message settles it alone
                return alone + pending
            else:
                for index, part in zip(pending, parts, strict=True):
                    answers[index] = grouping.landed(index, part)
                return alone
        return alone + pending

    @staticmethod
    def _named(
        grouping: _Grouping[_A], index: int, reasons: Sequence[Mapping[str, Any]]
    ) -> _A | Literal["alone"] | None:
        """A message's answer from its items' cancellation reasons: None when none of them failed, "alone" when
        only its own transition can tell."""
        try:
            cancelled = _cancelled(grouping.writes(index), reasons, holder=None)
        except TransientError:  # a conflict, or a reason that settles nothing: its own transition retries it
            return _ALONE
        return None if cancelled is None else grouping.answer(index, cancelled)

    def _group_answer(
        self, request: ApplyRequest, token: str, cancelled: _RecordRefused | Refused
    ) -> ApplyResult | Literal["alone"]:
        """An optimistic message's answer from what its items' cancellation reasons said, as ``_transact_with_record``
        reads them for it alone; "alone" when only ``apply_once`` can tell."""
        if isinstance(cancelled, Refused):
            return cancelled
        if cancelled.record is None:
            return _ALONE
        if cancelled.record.owner_token == token:
            return Applied(request.record_id, token)
        return self._existing(cancelled.record, request.payload_hash)

    def get(self, record_id: str) -> IdempotencyRecord | None:
        """Read a record (strongly consistent); for operators and tests, not the hot path."""
        response = self._call(
            self._client.get_item, TableName=self._table, Key={Attr.ID: {"S": record_id}}, ConsistentRead=True
        )
        item = response.get("Item")
        return IdempotencyRecord.from_item(item) if item else None

    # -- helpers -------------------------------------------------------------------

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _applying_write(self, request: ApplyRequest, token: str, now_ms: int) -> dict[str, Any]:
        return self._claiming_write(
            request.record_id,
            APPLY_UPDATE,
            now_ms,
            token,
            request.payload_hash,
            {
                ":completed": {"S": Status.COMPLETED.value},
                ":result": {"S": encode_result(request.result, self._result_max_bytes)},
            },
        )

    def _applying_items(self, request: ApplyRequest, token: str, now_ms: int) -> list[dict[str, Any]]:
        """A message's part of a group's transaction: its record first, then its business writes."""
        record = {"Update": self._applying_write(request, token, now_ms)}
        return [record, *(write.to_transact_item() for write in request.writes)]

    def _claiming_items(self, request: ClaimRequest, token: str, now_ms: int) -> list[dict[str, Any]]:
        """A lock-mode message's part of a group claim: its record's claim first, then its guard's writes."""
        lease = {":lease": {"N": str(now_ms + request.lease_ms)}}
        claim = self._claiming_write(request.record_id, CLAIM_UPDATE, now_ms, token, request.payload_hash, lease)
        return [{"Update": claim}, *(write.to_transact_item() for write in request.guard)]

    def _committing_items(self, request: CommitRequest) -> list[dict[str, Any]]:
        """A claimed message's part of a group commit: its record's completion first, then its business writes."""
        completion = {"Update": self._completion(request.claim, request.result)}
        return [completion, *(write.to_transact_item() for write in request.writes)]

    def _claiming_write(
        self, record_id: str, update: str, now_ms: int, token: str, payload_hash: str, values: dict[str, Any]
    ) -> dict[str, Any]:
        """An update that takes the key if ``_CLAIMABLE``, shared by claim and apply_once; ``values`` its own."""
        return {
            "TableName": self._table,
            "Key": {Attr.ID: {"S": record_id}},
            "UpdateExpression": update,
            "ConditionExpression": _CLAIMABLE,
            "ExpressionAttributeNames": _NAMES,
            "ExpressionAttributeValues": {
                ":in_progress": {"S": Status.IN_PROGRESS.value},
                ":expires_at": {"N": str(now_ms // 1000 + self._ttl_seconds)},
                OWNER: {"S": token},
                ":hash": {"S": payload_hash},
                ":zero": {"N": "0"},
                ":one": {"N": "1"},
                ":now_s": {"N": str(now_ms // 1000)},
                ":now_ms": {"N": str(now_ms)},
                **values,
            },
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def _absorbing(self, transition: Callable[[], _T], remaining_ms: Callable[[], int] | None) -> _T | Contended:
        """``transition``'s answer, its transaction conflicts retried under the policy; ``Contended`` if they last."""
        if self._conflicts is None or remaining_ms is None:
            try:
                return transition()
            except TransactionConflict as conflict:
                return Contended(str(conflict))
        answer, absorbed = self._conflicts.run(transition, remaining_ms)
        if isinstance(answer, TransactionConflict):
            return Contended(str(answer), conflicts_absorbed=absorbed)
        if absorbed and isinstance(answer, _Answer):
            return cast("_T", replace(answer, conflicts_absorbed=absorbed))
        return answer

    def _abandoned(self, record: IdempotencyRecord, payload_hash: str) -> bool:
        """A claim of the same message whose worker is gone: in progress, and its lease over."""
        lease_end = record.lease_expires_at_ms
        return (
            record.status is Status.IN_PROGRESS
            and record.payload_hash == payload_hash
            and lease_end is not None
            and lease_end < self._now_ms()
        )

    @staticmethod
    def _existing(current: IdempotencyRecord, payload_hash: str) -> Existing:
        """What the key's existing record says of a refused message: done, held, or used for another payload."""
        if current.payload_hash != payload_hash:
            return PayloadMismatch(current)
        if current.status is Status.COMPLETED:
            return Duplicate(current)
        return InFlight(current)

    @staticmethod
    def _committed_by(claim: Claimed, current: IdempotencyRecord | None) -> Committed | Fenced:
        if current is not None and current.owner_token == claim.owner_token and current.status is Status.COMPLETED:
            return Committed()  # ambiguous success: our own commit, retried after its answer was lost
        return Fenced(claim.record_id, current)

    def _transact_with_record(
        self, record_item: dict[str, Any], writes: Sequence[Write], token: str, *, holder: str | None = None
    ) -> _RecordRefused | Refused | None:
        """Apply one transaction: the record's own item (first), then the business writes.

        Returns None on success; ``_RecordRefused`` when the record's own condition failed,
        with the record as it was (None when no item came back, e.g. released by the owner
        that took a zombie's key over); ``Refused`` when a business write's condition failed.
        ``ClientRequestToken`` makes a retried transaction idempotent for ten minutes, which
        settles most ambiguous successes at the source. ``holder``, a claim's reservation token:
        a failed write whose ``held_by`` attribute carried another token is ``Refused(busy=True)``.
        """
        if len(writes) > MAX_BUSINESS_WRITES:
            raise PoisonMessage(
                ErrorType.INVALID_HANDLER_TRANSACTION,
                f"at most {MAX_BUSINESS_WRITES} business writes per message (a transaction holds 100 items with"
                f" the record), got {len(writes)}",
            )
        items = [record_item, *(write.to_transact_item() for write in writes)]
        try:
            self._call(self._client.transact_write_items, TransactItems=items, ClientRequestToken=token)
        except ClientError as error:
            code, text = error.response["Error"]["Code"], str(error.response["Error"].get("Message", ""))
            if code == "ValidationException" and _ONE_ITEM_TWICE in text:
                # The record is the only item of the core's own, and it is never a business write's: two actions
                # on one item are the handler's writes, on every delivery. (Other rejections are retried: a
                # request DynamoDB refuses may be the core's, and the redrive policy bounds it.)
                message = f"the handler's writes put two actions on one item in a transaction: {text}"
                raise PoisonMessage(ErrorType.INVALID_HANDLER_TRANSACTION, message) from None
            if code != "TransactionCanceledException":
                raise
            try:
                cancelled = _cancelled(writes, list(error.response.get("CancellationReasons") or []), holder)
            except TransientError as unsettled:
                raise unsettled from None
            if cancelled is None:
                raise TransientError("transaction cancelled: no reason given") from None
            return cancelled
        return None

    @staticmethod
    def _failed_condition_item_or_none(error: ClientError) -> IdempotencyRecord | None:
        if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise error
        item = error.response.get("Item")
        return IdempotencyRecord.from_item(item) if isinstance(item, Mapping) and item else None

    @classmethod
    def _failed_condition_item(cls, error: ClientError) -> IdempotencyRecord:
        current = cls._failed_condition_item_or_none(error)
        if current is None:
            raise TransientError("conditional write failed but DynamoDB returned no item") from None
        return current

    @staticmethod
    def _call(operation: Callable[..., _T], **kwargs: Any) -> _T:
        """Call DynamoDB; throttling and server errors become ``TransientError``."""
        try:
            return operation(**kwargs)
        except ClientError as error:
            # botocore's parser gives every error both: a body without a code gets its HTTP status as one.
            code = error.response["Error"]["Code"]
            status = error.response["ResponseMetadata"]["HTTPStatusCode"]
            if code == _CONFLICT_CODE:
                raise TransactionConflict(f"DynamoDB {code}: {error}") from error
            if code in _TRANSIENT_CODES or status >= 500:
                raise TransientError(f"DynamoDB {code or status}: {error}") from error
            raise
        except (BotocoreConnectionError, HTTPClientError) as error:
            # Timeouts and dropped connections: the write may or may not have been applied;
            # the retry settles it through the conditions and the owner token.
            raise TransientError(f"DynamoDB unreachable: {error}") from error
