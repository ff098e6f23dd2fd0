"""Fenced conditional-write idempotency on DynamoDB: claim, commit, release, apply_once."""

from consumer.idempotency.record import Attr, IdempotencyRecord, Status
from consumer.idempotency.store import (
    Applied,
    Claimed,
    Committed,
    Contended,
    Duplicate,
    Fenced,
    IdempotencyStore,
    InFlight,
    PayloadMismatch,
    Refused,
)
from consumer.idempotency.writes import ConditionCheck, Delete, Put, Update, Write

__all__ = [
    "Applied",
    "Attr",
    "Claimed",
    "Committed",
    "ConditionCheck",
    "Contended",
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
