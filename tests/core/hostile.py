"""Hostile messages at SQS's limits: each as large as a 1 MiB message allows, on one registered event type.

Wide objects (at the envelope, in ``metadata``, in the payload), long arrays, long strings in every field,
field names as long as the body, tens of thousands of schema errors, message attributes by the thousand
(a direct invocation can carry more than SQS's ten). Each must be dead-lettered with its reason in the
invocation that reads it, its batch's other messages applied: the work per message grows with its size,
never faster. ``make test`` runs every member once (tests/core/unit/test_hostile_input.py), the fuzzing draws
them among its bodies, and ``make bench`` times the slowest against a valid message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from consumer.envelope import MAX_BODY_BYTES
from consumer.errors import ErrorType

# Room left under the body limit for the envelope around what fills it.
_ROOM = MAX_BODY_BYTES - 4_096


@dataclass(frozen=True)
class Hostile:
    name: str
    body: str
    error_type: ErrorType
    message_attributes: dict[str, Any] | None = None


def _wide() -> dict[str, int]:
    # A key of 7 characters and a one-digit value: 14 bytes a field as JSON, about 75,000 fields in a body.
    return {f"f{index:06}": 0 for index in range(_ROOM // 14)}


def hostile_family(event_type: str, payload: dict[str, Any]) -> list[Hostile]:
    """The family for ``event_type``, whose handler accepts ``payload`` and forbids fields it does not know."""

    def body(**fields: Any) -> str:
        text = json.dumps({"eventType": event_type, "metadata": {"idempotencyKey": "k-hostile"}, **fields})
        assert len(text.encode()) <= MAX_BODY_BYTES, "a member of the family must fit in an SQS message"
        return text

    first = next(iter(payload))
    long = "x" * (_ROOM // 4)
    return [
        Hostile("wide-payload", body(payload={**payload, **_wide()}), ErrorType.SCHEMA_VIOLATION),
        Hostile("wide-envelope", body(**_wide()), ErrorType.SCHEMA_VIOLATION),
        Hostile("wide-metadata", body(metadata={"k": 1, **_wide()}, payload={}), ErrorType.SCHEMA_VIOLATION),
        Hostile("long-array", body(payload={**payload, first: [0] * (_ROOM // 3)}), ErrorType.SCHEMA_VIOLATION),
        Hostile("long-field-name", body(payload={**payload, long * 3: 1}), ErrorType.SCHEMA_VIOLATION),
        Hostile(
            "long-strings-everywhere",
            json.dumps({"eventType": long, "metadata": {"idempotencyKey": long}, "payload": {first: long, "x": long}}),
            ErrorType.SCHEMA_VIOLATION,
        ),
        Hostile("long-key", body(metadata={"idempotencyKey": long * 3}, payload=payload), ErrorType.SCHEMA_VIOLATION),
        Hostile(
            "many-attributes",
            body(payload={}),
            ErrorType.SCHEMA_VIOLATION,
            {f"a{index:06}": {"dataType": "String", "stringValue": "v"} for index in range(50_000)},
        ),
    ]
