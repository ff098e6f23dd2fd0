"""One record, start to finish: parse, route, run under the idempotency store, classify.

``prepare`` is pure (no I/O) so the batch can group records before any round trip;
``execute`` does the round trips. Neither raises: every record ends with exactly
one ``RecordResult``, so one bad record never fails its batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ValidationError

from consumer.config import Settings
from consumer.dead_letter import DeadLetterQueue
from consumer.envelope import Message, parse_message, schema_violation
from consumer.errors import PoisonMessage, TransientError
from consumer.handlers.base import Effect, MessageContext, MessageHandler, Mode
from consumer.idempotency.lease import lease_duration
from consumer.idempotency.store import (
    Applied,
    Claimed,
    Duplicate,
    IdempotencyStore,
    InFlight,
    LeaseLost,
    PayloadMismatch,
)


class Outcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    IN_FLIGHT = "in_flight"
    RETRIED = "retried"
    POISON = "poison"

    @property
    def is_failure(self) -> bool:
        """Reported in ``batchItemFailures``: SQS will deliver the record again."""
        return self in (Outcome.IN_FLIGHT, Outcome.RETRIED)


@dataclass(frozen=True)
class RecordResult:
    message_id: str
    outcome: Outcome
    reason: str | None = None
    # When a retry could succeed: the end of another worker's lease, epoch ms.
    retry_at_ms: int | None = None
    # What made it poison, so a copy later in the batch is dead-lettered alike.
    poison: PoisonMessage | None = None


@dataclass(frozen=True)
class Prepared:
    """A record that passed the contract and its handler's schema."""

    record: dict[str, Any]
    message: Message
    handler: MessageHandler
    payload: BaseModel


@dataclass(frozen=True)
class Rejected:
    """A record that can never succeed; it goes to the dead-letter queue."""

    record: dict[str, Any]
    poison: PoisonMessage
    idempotency_key: str = ""


class RecordProcessor:
    def __init__(
        self,
        store: IdempotencyStore,
        handlers: dict[str, MessageHandler],
        dead_letters: DeadLetterQueue,
        settings: Settings,
        logger: logging.Logger | Any,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._handlers = handlers
        self._dead_letters = dead_letters
        self._settings = settings
        self._logger = logger
        self._clock = clock

    def prepare(self, record: dict[str, Any]) -> Prepared | Rejected:
        try:
            message = parse_message(record)
        except PoisonMessage as poison:
            return Rejected(record, poison)
        handler = self._handlers.get(message.event_type)
        if handler is None:
            known = ", ".join(sorted(self._handlers))
            poison = PoisonMessage(
                "UnknownEventType", f"no handler for eventType {message.event_type!r} (known: {known})"
            )
            return Rejected(record, poison, message.idempotency_key)
        try:
            payload = handler.payload_model.model_validate(message.payload)
        except ValidationError as error:
            return Rejected(record, schema_violation(error, prefix="payload"), message.idempotency_key)
        return Prepared(record, message, handler, payload)

    def execute(self, item: Prepared | Rejected, remaining_ms: Callable[[], int]) -> RecordResult:
        if isinstance(item, Rejected):
            return self.dead_letter(item.record, item.poison, item.idempotency_key)
        try:
            if item.handler.mode is Mode.OPTIMISTIC:
                return self._run_optimistic(item, remaining_ms)
            return self._run_locked(item, remaining_ms)
        except PoisonMessage as poison:
            return self.dead_letter(item.record, poison, item.message.idempotency_key)
        except TransientError as error:
            return self._retry(item, str(error))
        except Exception as error:  # a bug or an unknown failure: retry, the redrive policy bounds it
            self._logger.exception("unexpected error", extra=self._log_keys(item))
            return self._retry(item, f"{type(error).__name__}: {error}")

    def reuse(self, item: Prepared, first: RecordResult) -> RecordResult:
        """A duplicate inside the batch takes the first copy's outcome, with no round trip."""
        if first.outcome in (Outcome.APPLIED, Outcome.DUPLICATE):
            self._logger.info("duplicate in batch", extra={**self._log_keys(item), "first": first.message_id})
            return RecordResult(item.message.message_id, Outcome.DUPLICATE, f"duplicate of {first.message_id}")
        if first.poison is not None:
            # Every copy must reach the DLQ itself: a message is applied or dead-lettered.
            return self.dead_letter(item.record, first.poison, item.message.idempotency_key)
        self._logger.info("retry with the first copy", extra={**self._log_keys(item), "first": first.message_id})
        return RecordResult(item.message.message_id, first.outcome, first.reason, first.retry_at_ms)

    def dead_letter(self, record: dict[str, Any], poison: PoisonMessage, idempotency_key: str = "") -> RecordResult:
        keys = {"message_id": record["messageId"], "idempotency_key": idempotency_key}
        try:
            self._dead_letters.send(record, poison.error_type, poison.message, idempotency_key)
        except Exception as error:
            # Not in the DLQ means not handled: SQS must keep the message.
            self._logger.error("dead-letter send failed", extra={**keys, "error": str(error)})
            return RecordResult(record["messageId"], Outcome.RETRIED, f"dead-letter send failed: {error}")
        self._logger.warning("dead-lettered", extra={**keys, "error_type": poison.error_type, "reason": poison.message})
        return RecordResult(
            record["messageId"], Outcome.POISON, f"{poison.error_type}: {poison.message}", poison=poison
        )

    # -- the two modes ----------------------------------------------------------------

    def _run_optimistic(self, item: Prepared, remaining_ms: Callable[[], int]) -> RecordResult:
        effect = self._handle(item, remaining_ms)
        result = self._store.apply_once(
            item.message.record_id, item.message.payload_hash, effect.result, tuple(effect.writes)
        )
        if isinstance(result, Applied):
            return self._done(item, Outcome.APPLIED)
        return self._conflict(item, result)

    def _run_locked(self, item: Prepared, remaining_ms: Callable[[], int]) -> RecordResult:
        settings = self._settings
        lease_ms = lease_duration(
            remaining_ms(),
            margin_ms=settings.lease_margin_ms,
            min_ms=settings.lease_min_ms,
            max_ms=settings.lease_max_ms,
        )
        claim = self._store.claim(item.message.record_id, item.message.payload_hash, lease_ms)
        if not isinstance(claim, Claimed):
            return self._conflict(item, claim)

        def lease_remaining_ms() -> int:
            return min(remaining_ms(), claim.lease_expires_at_ms - int(self._clock() * 1000))

        try:
            effect = self._handle(item, lease_remaining_ms)
            self._store.commit(claim, effect.result, tuple(effect.writes))
        except LeaseLost as lost:
            # Fenced out: whoever took the key over owns the outcome now.
            return self._retry(item, str(lost))
        except Exception:
            # Safe even when the commit was in fact applied: release is fenced on IN_PROGRESS.
            # (A process that dies releases nothing; its lease runs out instead.)
            self._release_quietly(item, claim)
            raise
        return self._done(item, Outcome.APPLIED)

    def _handle(self, item: Prepared, remaining_ms: Callable[[], int]) -> Effect:
        context = MessageContext(
            message_id=item.message.message_id,
            idempotency_key=item.message.idempotency_key,
            receive_count=item.message.receive_count,
            remaining_ms=remaining_ms,
        )
        return item.handler.handle(item.payload, context)

    def _release_quietly(self, item: Prepared, claim: Claimed) -> None:
        try:
            if not self._store.release(claim):
                self._logger.warning(
                    "release found no claim of ours (taken over, or an earlier release lost its answer)",
                    extra=self._log_keys(item),
                )
        except Exception as error:
            # The lease still runs out, so the key frees itself; nothing is stuck.
            self._logger.warning("release failed", extra={**self._log_keys(item), "error": str(error)})

    # -- outcomes ---------------------------------------------------------------------

    def _conflict(self, item: Prepared, result: Duplicate | InFlight | PayloadMismatch) -> RecordResult:
        if isinstance(result, Duplicate):
            return self._done(item, Outcome.DUPLICATE)
        if isinstance(result, InFlight):
            self._logger.info("in flight elsewhere", extra=self._log_keys(item))
            return RecordResult(
                item.message.message_id,
                Outcome.IN_FLIGHT,
                "claimed by another worker",
                retry_at_ms=result.record.lease_expires_at_ms,
            )
        poison = PoisonMessage(
            "IdempotencyKeyReused",
            f"key {item.message.idempotency_key!r} was used before for a different payload",
        )
        return self.dead_letter(item.record, poison, item.message.idempotency_key)

    def _done(self, item: Prepared, outcome: Outcome) -> RecordResult:
        self._logger.info(outcome.value, extra=self._log_keys(item))
        return RecordResult(item.message.message_id, outcome)

    def _retry(self, item: Prepared, reason: str) -> RecordResult:
        self._logger.warning("will retry", extra={**self._log_keys(item), "reason": reason})
        return RecordResult(item.message.message_id, Outcome.RETRIED, reason)

    @staticmethod
    def _log_keys(item: Prepared) -> dict[str, str]:
        return {
            "message_id": item.message.message_id,
            "idempotency_key": item.message.idempotency_key,
            "event_type": item.message.event_type,
        }
