"""The idempotency record: one DynamoDB item per namespaced key."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final


class Attr:
    """The record's attribute names, as stored: one place for the store, the tests and the tooling."""

    ID: Final = "id"
    STATUS: Final = "status"
    EXPIRES_AT: Final = "expiresAt"  # epoch seconds; the table's TTL attribute
    LEASE_EXPIRES_AT: Final = "leaseExpiresAt"  # epoch milliseconds; only while IN_PROGRESS
    OWNER_TOKEN: Final = "ownerToken"  # noqa: S105 (an attribute name, not a secret)
    PAYLOAD_HASH: Final = "payloadHash"
    RESULT: Final = "result"
    ATTEMPTS: Final = "attempts"


class Status(StrEnum):
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"


@dataclass(frozen=True)
class IdempotencyRecord:
    id: str
    status: Status
    expires_at: int | None  # epoch seconds; the TTL attribute
    lease_expires_at_ms: int | None  # epoch milliseconds; only while IN_PROGRESS
    owner_token: str  # the fencing token of the claim that wrote this record
    payload_hash: str
    result: str | None  # JSON text
    attempts: int

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> IdempotencyRecord:
        """Build from a low-level DynamoDB item (``{"id": {"S": ...}, ...}``)."""
        return cls(
            id=item[Attr.ID]["S"],
            status=Status(item[Attr.STATUS]["S"]),
            expires_at=int(item[Attr.EXPIRES_AT]["N"]) if Attr.EXPIRES_AT in item else None,
            lease_expires_at_ms=int(item[Attr.LEASE_EXPIRES_AT]["N"]) if Attr.LEASE_EXPIRES_AT in item else None,
            owner_token=item.get(Attr.OWNER_TOKEN, {}).get("S", ""),
            payload_hash=item.get(Attr.PAYLOAD_HASH, {}).get("S", ""),
            result=item[Attr.RESULT]["S"] if Attr.RESULT in item else None,
            attempts=int(item.get(Attr.ATTEMPTS, {}).get("N", "0")),
        )

    def result_value(self) -> Any:
        return None if self.result is None else json.loads(self.result)


def reservation_token(record_id: str, payload_hash: str) -> str:
    """What a guard marks its reservation with, so that only the delivery of the same message passes it.

    Bound to the record (event type and key) and to the payload's hash: another event type reusing the key,
    or other content under it (after its record expired), gets another token and is held out. Opaque, so a
    key (which may name a customer's thing) is not copied onto business items.
    """
    digest = hashlib.sha256(f"{record_id}\n{payload_hash}".encode()).hexdigest()
    return f"r1:{digest[:40]}"


def encode_result(result: object, max_bytes: int) -> str:
    """JSON text of a result, or a digest of it when it would bloat the item.

    DynamoDB items stop at 400 KB and every KB costs a write unit: a large result is
    replaced by its SHA-256 and size, so the record can still be committed.
    """
    text = json.dumps(result, separators=(",", ":"), sort_keys=True, default=str)
    size = len(text.encode("utf-8"))
    if size <= max_bytes:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return json.dumps({"resultDigest": f"sha256:{digest}", "resultBytes": size}, separators=(",", ":"))
