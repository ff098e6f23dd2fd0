"""Fenced conditional-write idempotency on DynamoDB: claim, commit, release, apply_once."""

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
from consumer.idempotency.record import Attr, IdempotencyRecord, Status
from consumer.idempotency.store import IdempotencyStore
from consumer.idempotency.writes import ConditionCheck, Delete, Put, Update, Write

__all__ = [
    "Applied",
    "Attr",
    "Claimed",
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
    "Status",
    "Update",
    "Write",
]
