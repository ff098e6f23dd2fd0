"""Fenced conditional-write idempotency on DynamoDB: claim, commit, release, apply_once."""

from consumer.idempotency.record import IdempotencyRecord, Status
from consumer.idempotency.store import (
    Applied,
    Claimed,
    Duplicate,
    IdempotencyStore,
    InFlight,
    LeaseLost,
    PayloadMismatch,
)
from consumer.idempotency.writes import ConditionCheck, Delete, Put, Update, Write

__all__ = [
    "Applied",
    "Claimed",
    "ConditionCheck",
    "Delete",
    "Duplicate",
    "IdempotencyRecord",
    "IdempotencyStore",
    "InFlight",
    "LeaseLost",
    "PayloadMismatch",
    "Put",
    "Status",
    "Update",
    "Write",
]
