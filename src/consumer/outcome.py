"""How one message ended: the vocabulary shared by the processor, the batch and the metrics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from consumer.errors import PoisonMessage


class Outcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    IN_FLIGHT = "in_flight"
    RETRIED = "retried"
    # Still refused by a transaction conflict after the in-process retries.
    CONFLICT = "conflict"
    POISON = "poison"

    @property
    def is_failure(self) -> bool:
        """Reported in ``batchItemFailures``: SQS will deliver the message again."""
        return self in (Outcome.IN_FLIGHT, Outcome.RETRIED, Outcome.CONFLICT)


@dataclass(frozen=True)
class MessageResult:
    message_id: str
    outcome: Outcome
    reason: str | None = None
    # When a retry could succeed, epoch ms: the end of another worker's lease, or
    # "now" for a message that was never started or lost a transaction conflict.
    retry_at_ms: int | None = None
    # What made it poison, so a copy later in the batch is dead-lettered alike.
    poison: PoisonMessage | None = None


class Log(Protocol):
    """What the consumer asks of a logger: Powertools' in the function, the standard library's in tools and tests."""

    def info(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None: ...

    def warning(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None: ...

    def error(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None: ...

    def exception(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None: ...
