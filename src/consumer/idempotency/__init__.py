"""Fenced conditional-write idempotency on DynamoDB: each transition (claim, apply, commit, release) one write, or a
part of one shared by messages ready at the same moment (group commit)."""

from consumer.idempotency.answers import (
    Applied,
    Claimed,
    Committed,
    Conflicted,
    Duplicate,
    Fenced,
    InFlight,
    PayloadMismatch,
    Refused,
)
from consumer.idempotency.apply import Apply
from consumer.idempotency.claim import Claim
from consumer.idempotency.commit import Commit
from consumer.idempotency.record import Attr, IdempotencyRecord, Status
from consumer.idempotency.release import Release
from consumer.idempotency.store import IdempotencyStore
from consumer.idempotency.writes import ConditionCheck, Delete, Put, Update, Write

__all__ = [
    "Applied",
    "Apply",
    "Attr",
    "Claim",
    "Claimed",
    "Commit",
    "Committed",
    "ConditionCheck",
    "Conflicted",
    "Delete",
    "Duplicate",
    "Fenced",
    "IdempotencyRecord",
    "IdempotencyStore",
    "InFlight",
    "PayloadMismatch",
    "Put",
    "Refused",
    "Release",
    "Status",
    "Update",
    "Write",
]
