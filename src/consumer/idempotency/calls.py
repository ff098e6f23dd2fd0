"""The idempotency table's calls, shared by every transition: the conditions and updates, DynamoDB's errors turned
into the core's, a transaction's cancellation read per item, and conflicts absorbed under the injected policy."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from consumer.conflicts import ConflictRetry
from consumer.errors import ErrorType, PoisonMessage, TransactionConflict, TransientError
from consumer.idempotency.answers import (
    Committed,
    Conflicted,
    Duplicate,
    Existing,
    Fenced,
    InFlight,
    PayloadMismatch,
    RecordRefused,
    Refused,
)
from consumer.idempotency.observer import Observer, Unobserved
from consumer.idempotency.record import Attr, IdempotencyRecord, Status, encode_result
from consumer.idempotency.writes import MAX_BUSINESS_WRITES, Write

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

    from consumer.idempotency.answers import Claimed

_T = TypeVar("_T")

NAMES = {
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
OWNED = "#owner = :owner AND #status = :in_progress"

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
_COMMIT_NAMES = {k: NAMES[k] for k in ("#status", "#result", "#expires", "#lease", "#owner")}
RELEASE_NAMES = {k: NAMES[k] for k in ("#owner", "#status")}

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

COMMIT_TOKEN_NAMESPACE = uuid.UUID("6f1c2f4e-4b0a-4a53-9a43-1c3c8e0e9d11")
RELEASE_TOKEN_NAMESPACE = uuid.UUID("d67b0bae-1ab0-4361-b58c-7d489a5dd5fc")


def new_token() -> str:
    return str(uuid.uuid4())


def held_by_another(write: Write, reason: Mapping[str, Any], holder: str) -> bool:
    """Whether a write's item, as its failed condition found it, carried another message's hold."""
    item = reason.get("Item")
    if write.held_by is None or not isinstance(item, Mapping):
        return False
    held = item.get(write.held_by)
    return isinstance(held, Mapping) and held.get("S") not in (None, holder)


def cancelled(
    writes: Sequence[Write], reasons: Sequence[Mapping[str, Any]], holder: str | None
) -> RecordRefused | Refused | None:
    """What a cancelled transaction's reasons say of one message's items (its record first, then ``writes``):
    the record's failed condition, a business write's, or None when none of them failed. Raises
    ``TransactionConflict`` for a conflict, ``TransientError`` for any other reason."""
    record_reason = reasons[0] if reasons else {}
    if record_reason.get("Code") == "ConditionalCheckFailed":
        item = record_reason.get("Item")
        return RecordRefused(IdempotencyRecord.from_item(item) if isinstance(item, Mapping) and item else None)
    if record_reason.get("Code") == "TransactionConflict":
        # DynamoDB may judge the business items against a state the conflicting transaction is changing:
        # a business condition failed beside it settles nothing, so the whole transaction is tried again.
        raise TransactionConflict("transaction cancelled: TransactionConflict on the record")
    for write, reason in zip(writes, reasons[1:], strict=False):
        if reason.get("Code") == "ConditionalCheckFailed":
            return Refused(write, busy=holder is not None and held_by_another(write, reason, holder))
    codes = sorted({str(reason.get("Code")) for reason in reasons} - {"None"})
    if "TransactionConflict" in codes:
        raise TransactionConflict(f"transaction cancelled: {', '.join(codes)}")
    if codes:
        raise TransientError(f"transaction cancelled: {', '.join(codes)}")
    return None


def existing(current: IdempotencyRecord, payload_hash: str) -> Existing:
    """What the key's existing record says of a refused message: done, applied with another payload, or held.

    Another payload's claim is not yet a reuse: refused or a poison, it is released and the key is this payload's.
    Told reused while it stood, this message would be in the DLQ while another delivery of it applies it."""
    if current.status is Status.COMPLETED:
        return Duplicate(current) if current.payload_hash == payload_hash else PayloadMismatch(current)
    return InFlight(current, of_another_content=current.payload_hash != payload_hash)


def committed_by(claim: Claimed, current: IdempotencyRecord | None) -> Committed | Fenced:
    if current is not None and current.owner_token == claim.owner_token and current.status is Status.COMPLETED:
        return Committed()  # ambiguous success: our own commit, retried after its answer was lost
    return Fenced(claim.record_id, current)


@dataclass(frozen=True)
class Table:
    """The idempotency table as the transitions use it: its client and name, the record's TTL and result bound, the
    clock and token source, the conflict policy (None: a conflict is answered at once) and the observer."""

    client: DynamoDBClient
    name: str
    ttl_seconds: int
    result_max_bytes: int = 64 * 1024
    clock: Callable[[], float] = time.time
    new_token: Callable[[], str] = new_token
    conflicts: ConflictRetry | None = None
    observer: Observer = field(default_factory=Unobserved)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def key(self, record_id: str) -> dict[str, Any]:
        return {Attr.ID: {"S": record_id}}

    def claiming_write(
        self, record_id: str, update: str, now_ms: int, token: str, payload_hash: str, values: dict[str, Any]
    ) -> dict[str, Any]:
        """An update that takes the key if it is claimable, shared by claim and apply; ``values`` its own."""
        return {
            "TableName": self.name,
            "Key": self.key(record_id),
            "UpdateExpression": update,
            "ConditionExpression": _CLAIMABLE,
            "ExpressionAttributeNames": NAMES,
            "ExpressionAttributeValues": {
                ":in_progress": {"S": Status.IN_PROGRESS.value},
                ":expires_at": {"N": str(now_ms // 1000 + self.ttl_seconds)},
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

    def completion(self, claim: Claimed, result: object) -> dict[str, Any]:
        """The record's completion, fenced on the claim's owner token: a commit's first item."""
        return {
            "TableName": self.name,
            "Key": self.key(claim.record_id),
            "UpdateExpression": COMMIT_UPDATE,
            "ConditionExpression": OWNED,
            "ExpressionAttributeNames": _COMMIT_NAMES,
            "ExpressionAttributeValues": {
                ":completed": {"S": Status.COMPLETED.value},
                ":in_progress": {"S": Status.IN_PROGRESS.value},
                ":result": {"S": encode_result(result, self.result_max_bytes)},
                # From the lease's end, not from now: a retried commit must send the very same
                # request (its ClientRequestToken allows nothing else), and a commit comes
                # before the lease ends, so the record lives at least its TTL.
                ":expires_at": {"N": str(claim.lease_expires_at_ms // 1000 + self.ttl_seconds)},
                OWNER: {"S": claim.owner_token},
            },
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def get(self, record_id: str) -> IdempotencyRecord | None:
        """Read a record (strongly consistent)."""
        response = self.call(self.client.get_item, TableName=self.name, Key=self.key(record_id), ConsistentRead=True)
        item = response.get("Item")
        return IdempotencyRecord.from_item(item) if item else None

    def absorbing(self, transition: Callable[[], _T], remaining_ms: Callable[[], int] | None) -> _T | Conflicted:
        """``transition``'s answer, its transaction conflicts retried under the policy; ``Conflicted`` if they last."""
        if self.conflicts is None or remaining_ms is None:
            try:
                return transition()
            except TransactionConflict as conflict:
                return Conflicted(str(conflict))
        answer, absorbed = self.conflicts.run(transition, remaining_ms)
        if absorbed:
            self.observer.conflicts_absorbed(absorbed)
        if isinstance(answer, TransactionConflict):
            return Conflicted(str(answer), conflicts_absorbed=absorbed)
        return answer

    def transact_with_record(
        self, record_item: dict[str, Any], writes: Sequence[Write], token: str, *, holder: str | None = None
    ) -> RecordRefused | Refused | None:
        """Apply one message's transaction: the record's own item (first), then the business writes.

        Returns None on success; ``RecordRefused`` when the record's own condition failed,
        with the record as it was (None when no item came back, e.g. released by the owner
        that took a zombie's key over); ``Refused`` when a business write's condition failed.
        ``ClientRequestToken`` makes a retried transaction idempotent for ten minutes, which
        settles most ambiguous successes at the source. ``holder``, a claim's reservation token:
        a failed write whose ``held_by`` attribute carried another token is ``Refused(busy=True)``.
        """
        if len(writes) > MAX_BUSINESS_WRITES:
            raise PoisonMessage(
                ErrorType.INVALID_HANDLER_TRANSACTION,
                f"at most {MAX_BUSINESS_WRITES} business writes and outgoing messages per message (a transaction"
                f" holds 100 items with the record), got {len(writes)}",
            )
        items = [record_item, *(write.to_transact_item() for write in writes)]
        try:
            self.transact(items, token, messages=1)
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
                answer = cancelled(writes, list(error.response.get("CancellationReasons") or []), holder)
            except TransientError as unsettled:
                raise unsettled from None
            if answer is None:
                raise TransientError("transaction cancelled: no reason given") from None
            return answer
        return None

    def transact(self, items: list[dict[str, Any]], token: str, *, messages: int) -> None:
        """One ``TransactWriteItems`` of ``messages`` messages' items, told to the observer."""
        self.observer.transaction(messages)
        self.call(self.client.transact_write_items, TransactItems=items, ClientRequestToken=token)

    def write(self, operation: Callable[..., _T], **kwargs: Any) -> _T:
        """One message's single-item write (no business writes), told to the observer as a transaction of one."""
        self.observer.transaction(1)
        return self.call(operation, **kwargs)

    @staticmethod
    def failed_condition_item_or_none(error: ClientError) -> IdempotencyRecord | None:
        if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise error
        item = error.response.get("Item")
        return IdempotencyRecord.from_item(item) if isinstance(item, Mapping) and item else None

    @classmethod
    def failed_condition_item(cls, error: ClientError) -> IdempotencyRecord:
        current = cls.failed_condition_item_or_none(error)
        if current is None:
            raise TransientError("conditional write failed but DynamoDB returned no item") from None
        return current

    @staticmethod
    def call(operation: Callable[..., _T], **kwargs: Any) -> _T:
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
