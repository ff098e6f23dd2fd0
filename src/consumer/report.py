"""How a message's outcome is told: its result for the batch, its log line, its dead letter."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from consumer.dead_letter import DeadLetterQueue
from consumer.envelope import bounded
from consumer.errors import PoisonMessage
from consumer.outcome import Log, MessageResult, Outcome
from consumer.prepared import Prepared

# A message still in a transaction conflict comes back this soon (at random within it), not after the backoff.
_CONFLICT_REDELIVERY_MS = 1_000


class Reporter:
    def __init__(self, logger: Log, dead_letters: DeadLetterQueue, clock: Callable[[], float] = time.time) -> None:
        self._logger = logger
        self._dead_letters = dead_letters
        self._clock = clock

    def done(self, item: Prepared, outcome: Outcome) -> MessageResult:
        self._logger.info(outcome.value, extra=item.log_keys())
        return MessageResult(item.message_id, outcome)

    def retry(self, item: Prepared, reason: str) -> MessageResult:
        reason = bounded(reason)
        self._logger.warning("will retry", extra={**item.log_keys(), "reason": reason})
        return MessageResult(item.message_id, Outcome.RETRIED, reason)

    def in_flight(self, item: Prepared, until_ms: int | None, held_by: str = "another worker") -> MessageResult:
        self._logger.info("in flight elsewhere", extra={**item.log_keys(), "held_by": held_by})
        return MessageResult(item.message_id, Outcome.IN_FLIGHT, f"claimed by {held_by}", retry_at_ms=until_ms)

    def conflicted(self, item: Prepared, reason: str, absorbed: int) -> MessageResult:
        self._logger.warning("transaction conflict not absorbed", extra={**item.log_keys(), "absorbed": absorbed})
        retry_at_ms = int(self._clock() * 1000) + random.randrange(_CONFLICT_REDELIVERY_MS)  # noqa: S311
        return MessageResult(item.message_id, Outcome.CONFLICT, reason, retry_at_ms=retry_at_ms)

    def dead_letter(self, item: Prepared, poison: PoisonMessage) -> MessageResult:
        keys = item.log_keys()
        try:
            self._dead_letters.send(item, poison.error_type, poison.message)
        except Exception as error:
            # Not in the DLQ means not handled: SQS must keep the message.
            reason = bounded(f"dead-letter send failed: {error}")
            self._logger.error("dead-letter send failed", extra={**keys, "error": reason})
            return MessageResult(item.message_id, Outcome.RETRIED, reason)
        reason = bounded(poison.message)
        self._logger.warning("dead-lettered", extra={**keys, "error_type": poison.error_type, "reason": reason})
        return MessageResult(item.message_id, Outcome.POISON, f"{poison.error_type}: {poison.message}", poison=poison)
