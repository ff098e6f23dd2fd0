"""One record, start to finish: parse, route, run under the idempotency store, classify.

``prepare`` is pure (no I/O) so the batch can group records before any round trip;
``execute`` does the round trips. Neither raises for a record's sake: every record
ends with exactly one ``RecordResult``, so one bad record never fails its batch.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, assert_never

from pydantic import BaseModel, ValidationError

from consumer.config import Settings
from consumer.conflicts import ConflictCount, ConflictRetry
from consumer.dead_letter import DeadLetterQueue
from consumer.envelope import Message, Record, parse_message, schema_violation, sqs_text
from consumer.errors import (
    BusinessConditionFailed,
    ConfigurationError,
    ErrorType,
    LeaseLost,
    PoisonMessage,
    TransactionConflict,
    TransientError,
)
from consumer.handlers.base import Effect, MessageContext, MessageHandler, Mode
from consumer.idempotency.lease import lease_duration
from consumer.idempotency.store import Applied, Claimed, Duplicate, IdempotencyStore, InFlight, PayloadMismatch, Refused
from consumer.idempotency.writes import Write
from consumer.outcome import Outcome, RecordResult

# Exception text can quote what came from outside (a field name, a server's words): a log line
# keeps at most this much of it, with what SQS would refuse replaced.
_REASON_MAX_CHARS = 1_000
# A record still in conflict comes back this soon (at random within it), not after the backoff.
_CONFLICT_REDELIVERY_MS = 1_000


@dataclass(frozen=True)
class Prepared:
    """A record that passed the contract and its handler's schema."""

    record: Record
    message: Message
    handler: MessageHandler[Any]
    payload: BaseModel
    # What its writes contend on besides its own key (a hot business item), if anything.
    contention_key: str | None = None


@dataclass(frozen=True)
class Rejected:
    """A record that can never succeed; it goes to the dead-letter queue."""

    record: Record
    poison: PoisonMessage
    idempotency_key: str = ""


class RecordProcessor:
    def __init__(
        self,
        store: IdempotencyStore,
        handlers: dict[str, MessageHandler[Any]],
        dead_letters: DeadLetterQueue,
        settings: Settings,
        logger: Any,
        *,
        conflicts: ConflictRetry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for event_type, handler in handlers.items():
            if handler.mode is Mode.OPTIMISTIC and type(handler).guard is not MessageHandler.guard:
                # It would never run: an optimistic handler's conditions go in its writes.
                raise ConfigurationError(f"handler of {event_type} defines a guard, which only lock mode runs")
        self._store = store
        self._handlers = handlers
        self._dead_letters = dead_letters
        self._settings = settings
        self._logger = logger
        self._conflicts = conflicts
        self._clock = clock

    def prepare(self, record: Record) -> Prepared | Rejected:
        try:
            return self._prepare(record)
        except MemoryError:
            # The invocation ran out, not the record (bodies are capped): let Lambda retry the batch.
            raise
        except Exception as error:
            # Reading a record is deterministic: what failed once fails on every delivery.
            self._logger.exception("record could not be read", extra={"message_id": record["messageId"]})
            return Rejected(record, PoisonMessage(ErrorType.UNPROCESSABLE_RECORD, f"{type(error).__name__}: {error}"))

    def _prepare(self, record: Record) -> Prepared | Rejected:
        try:
            message = parse_message(record)
        except PoisonMessage as poison:
            return Rejected(record, poison)
        handler = self._handlers.get(message.event_type)
        if handler is None:
            known = ", ".join(sorted(self._handlers))
            unknown = PoisonMessage(
                ErrorType.UNKNOWN_EVENT_TYPE, f"no handler for eventType {message.event_type!r} (known: {known})"
            )
            return Rejected(record, unknown, message.idempotency_key)
        try:
            payload = handler.payload_model.model_validate(message.payload)
        except ValidationError as error:
            return Rejected(record, schema_violation(error, prefix="payload"), message.idempotency_key)
        return Prepared(record, message, handler, payload, handler.contention_key(payload))

    def execute(self, item: Prepared | Rejected, remaining_ms: Callable[[], int]) -> RecordResult:
        if isinstance(item, Rejected):
            return self.dead_letter(item.record, item.poison, item.idempotency_key)
        conflicts = ConflictCount()
        try:
            if item.handler.mode is Mode.OPTIMISTIC:
                result = self._run_optimistic(item, remaining_ms, conflicts)
            else:
                result = self._run_locked(item, remaining_ms, conflicts)
        except PoisonMessage as poison:
            result = self.dead_letter(item.record, poison, item.message.idempotency_key)
        except TransactionConflict as conflict:
            result = self._still_in_conflict(item, conflict, conflicts)
        except TransientError as error:
            result = self._retry(item, str(error))
        except Exception as error:  # a bug or an unknown failure: retry, the redrive policy bounds it
            self._logger.exception("unexpected error", extra=self._log_keys(item))
            result = self._retry(item, f"{type(error).__name__}: {error}")
        return replace(result, conflicts_absorbed=conflicts.absorbed) if conflicts.absorbed else result

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

    def dead_letter(self, record: Record, poison: PoisonMessage, idempotency_key: str = "") -> RecordResult:
        message_id: str = record["messageId"]
        keys = {"message_id": message_id, "idempotency_key": idempotency_key}
        try:
            self._dead_letters.send(record, poison.error_type, poison.message, idempotency_key)
        except Exception as error:
            # Not in the DLQ means not handled: SQS must keep the message.
            reason = _bounded(f"dead-letter send failed: {error}")
            self._logger.error("dead-letter send failed", extra={**keys, "error": reason})
            return RecordResult(message_id, Outcome.RETRIED, reason)
        reason = _bounded(poison.message)
        self._logger.warning("dead-lettered", extra={**keys, "error_type": poison.error_type, "reason": reason})
        return RecordResult(message_id, Outcome.POISON, f"{poison.error_type}: {poison.message}", poison=poison)

    # -- the two modes ----------------------------------------------------------------

    def _run_optimistic(
        self, item: Prepared, remaining_ms: Callable[[], int], conflicts: ConflictCount
    ) -> RecordResult:
        effect = self._handle(item, remaining_ms)
        message = item.message
        result = self._conflicts.run(
            lambda: self._store.apply_once(
                message.record_id, message.payload_hash, effect.result, tuple(effect.writes)
            ),
            remaining_ms,
            conflicts,
        )
        match result:
            case Applied():
                return self._done(item, Outcome.APPLIED)
            case Duplicate() | InFlight() | PayloadMismatch():
                return self._settled_elsewhere(item, result)
            case _:
                assert_never(result)

    def _run_locked(self, item: Prepared, remaining_ms: Callable[[], int], conflicts: ConflictCount) -> RecordResult:
        settings = self._settings
        lease_ms = lease_duration(
            remaining_ms(),
            margin_ms=settings.lease_margin_ms,
            min_ms=settings.lease_min_ms,
            max_ms=settings.lease_max_ms,
        )
        message = item.message
        guard = item.handler.guard(item.payload, self._context(item, remaining_ms))
        reserve, undo = (tuple(guard.writes), tuple(guard.undo)) if guard else ((), ())
        self._check_tables(item, (*reserve, *undo))
        claim = self._conflicts.run(
            lambda: self._store.claim(message.record_id, message.payload_hash, lease_ms, reserve),
            remaining_ms,
            conflicts,
        )
        match claim:
            case Claimed():
                pass
            case Refused():
                # Nothing was claimed or reserved, and handle never ran: no call was made.
                return self.dead_letter(item.record, BusinessConditionFailed(claim.write), message.idempotency_key)
            case Duplicate() | InFlight() | PayloadMismatch():
                return self._settled_elsewhere(item, claim)
            case _:
                assert_never(claim)

        def lease_remaining_ms() -> int:
            return min(remaining_ms(), claim.lease_expires_at_ms - int(self._clock() * 1000))

        try:
            effect = self._handle(item, lease_remaining_ms)
        except Exception:
            self._release_quietly(item, claim, undo, remaining_ms)
            raise
        try:
            # Fenced by the owner token, and the same request each time: repeating it is safe,
            # while releasing would let the next delivery make the external call again. The
            # budget is the invocation's time, not the lease's: past the lease the commit still
            # lands unless another worker took the key over, and this message cannot come back
            # to one before this invocation hands it back.
            self._conflicts.run(
                lambda: self._store.commit(claim, effect.result, tuple(effect.writes)),
                remaining_ms,
                conflicts,
                until_out_of_time=True,
            )
        except LeaseLost as lost:
            # Fenced out: whoever took the key over owns the outcome now.
            return self._retry(item, str(lost))
        except TransactionConflict:
            # Keep the claim: until its lease ends nobody repeats the external call.
            raise
        except Exception:
            # Safe even when the commit was in fact applied: release is fenced on IN_PROGRESS.
            # (A process that dies releases nothing; its lease runs out instead, and the guard's
            # reservation waits for the redelivery that takes the claim over.)
            self._release_quietly(item, claim, undo, remaining_ms)
            raise
        return self._done(item, Outcome.APPLIED)

    @staticmethod
    def _context(item: Prepared, remaining_ms: Callable[[], int]) -> MessageContext:
        return MessageContext(
            message_id=item.message.message_id,
            idempotency_key=item.message.idempotency_key,
            receive_count=item.message.receive_count,
            remaining_ms=remaining_ms,
        )

    def _handle(self, item: Prepared, remaining_ms: Callable[[], int]) -> Effect:
        effect = item.handler.handle(item.payload, self._context(item, remaining_ms))
        self._check_tables(item, effect.writes)
        return effect

    @staticmethod
    def _check_tables(item: Prepared, writes: Sequence[Write]) -> None:
        declared = item.handler.table_names.values()
        for write in writes:
            if write.table not in declared:
                # The role's grants and the cold-start check follow the declaration: keep them honest.
                raise ConfigurationError(
                    f"handler of {item.message.event_type} writes table {write.table!r}, which is not one of its"
                    f" declared tables ({', '.join(item.handler.tables) or 'none'})"
                )

    def _release_quietly(
        self, item: Prepared, claim: Claimed, undo: Sequence[Write], remaining_ms: Callable[[], int]
    ) -> None:
        try:
            if not self._conflicts.run(lambda: self._store.release(claim, undo), remaining_ms, ConflictCount()):
                self._logger.warning(
                    "release found no claim of ours (taken over, or an earlier release lost its answer)",
                    extra=self._log_keys(item),
                )
        except Exception as error:
            # The lease still runs out, so the key frees itself; nothing is stuck.
            self._logger.warning("release failed", extra={**self._log_keys(item), "error": _bounded(str(error))})

    # -- outcomes ---------------------------------------------------------------------

    def _settled_elsewhere(self, item: Prepared, result: Duplicate | InFlight | PayloadMismatch) -> RecordResult:
        """The key's record decided this message: already done, held by another worker, or reused."""
        match result:
            case Duplicate():
                return self._done(item, Outcome.DUPLICATE)
            case InFlight():
                self._logger.info("in flight elsewhere", extra=self._log_keys(item))
                return RecordResult(
                    item.message.message_id,
                    Outcome.IN_FLIGHT,
                    "claimed by another worker",
                    retry_at_ms=result.record.lease_expires_at_ms,
                )
            case PayloadMismatch():
                poison = PoisonMessage(
                    ErrorType.IDEMPOTENCY_KEY_REUSED,
                    f"key {item.message.idempotency_key!r} was used before for a different payload",
                )
                return self.dead_letter(item.record, poison, item.message.idempotency_key)
            case _:
                assert_never(result)

    def _still_in_conflict(
        self, item: Prepared, conflict: TransactionConflict, conflicts: ConflictCount
    ) -> RecordResult:
        self._logger.warning(
            "transaction conflict not absorbed", extra={**self._log_keys(item), "absorbed": conflicts.absorbed}
        )
        retry_at_ms = int(self._clock() * 1000) + random.randrange(_CONFLICT_REDELIVERY_MS)  # noqa: S311
        return RecordResult(item.message.message_id, Outcome.CONFLICT, str(conflict), retry_at_ms=retry_at_ms)

    def _done(self, item: Prepared, outcome: Outcome) -> RecordResult:
        self._logger.info(outcome.value, extra=self._log_keys(item))
        return RecordResult(item.message.message_id, outcome)

    def _retry(self, item: Prepared, reason: str) -> RecordResult:
        reason = _bounded(reason)
        self._logger.warning("will retry", extra={**self._log_keys(item), "reason": reason})
        return RecordResult(item.message.message_id, Outcome.RETRIED, reason)

    @staticmethod
    def _log_keys(item: Prepared) -> dict[str, str]:
        return {
            "message_id": item.message.message_id,
            "idempotency_key": item.message.idempotency_key,
            "event_type": item.message.event_type,
        }


def _bounded(text: str) -> str:
    return sqs_text(text[:_REASON_MAX_CHARS])[0]
