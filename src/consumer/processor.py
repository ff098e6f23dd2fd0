"""One message, start to finish: parse, route, run under the idempotency store, classify.

``prepare`` is pure (no I/O) so the batch can sort messages into lanes before any round trip;
``execute`` is the message's one life: its apply (optimistic), or its claim, its handler under
its own lease and its commit or release (lock), each as soon as the one before ends. Whether a
transition shares a transaction with other messages' is the store's business, below this: the
message's outcome is the same either way. Neither raises for a message's sake: every message
ends with exactly one ``MessageResult``, so one bad message never fails its batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, assert_never

from consumer.config import Settings
from consumer.dead_letter import DeadLetterQueue
from consumer.envelope import SqsMessage, bounded
from consumer.errors import (
    BusinessConditionFailed,
    ConfigurationError,
    ErrorType,
    PoisonMessage,
    TransientError,
)
from consumer.handler import Effect, MessageContext, MessageHandler, Mode
from consumer.idempotency.answers import (
    Applied,
    ApplyResult,
    Claimed,
    ClaimRequest,
    CommitResult,
    Committed,
    Conflicted,
    Duplicate,
    Existing,
    Fenced,
    InFlight,
    PayloadMismatch,
    Refused,
)
from consumer.idempotency.lease import lease_duration
from consumer.idempotency.record import reservation_token
from consumer.idempotency.store import IdempotencyStore
from consumer.idempotency.writes import Write
from consumer.outcome import Log, MessageResult, Outcome
from consumer.prepared import Parsed, Prepared, Rejected, prepare
from consumer.report import Reporter

# What a dead letter adds when its refusal took over a dead worker's claim: nothing of the message is left behind.
ABANDONED_RELEASED = "the abandoned claim and its reservation were released"
# What a message met that waits for another message's hold to settle: back to the queue, with backoff.
BUSY = "held by another message, so not refused"


class MessageProcessor:
    def __init__(
        self,
        store: IdempotencyStore,
        handlers: dict[str, MessageHandler[Any]],
        dead_letters: DeadLetterQueue,
        settings: Settings,
        logger: Log,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for event_type, handler in handlers.items():
            if handler.mode is Mode.OPTIMISTIC and type(handler).guard is not MessageHandler.guard:
                # It would never run: an optimistic handler's conditions go in its writes.
                raise ConfigurationError(f"handler of {event_type} defines a guard, which only lock mode runs")
        self._store = store
        self._handlers = handlers
        self._settings = settings
        self._logger = logger
        self._report = Reporter(logger, dead_letters, clock)
        self._clock = clock

    def prepare(self, message: SqsMessage) -> Prepared:
        return prepare(message, self._handlers, self._logger)

    def join(self, threads: int) -> None:
        """``threads`` threads are about to run messages: the store's group commit waits (bounded) for them."""
        self._store.join(threads)

    def leave(self) -> None:
        """The calling thread runs no more messages."""
        self._store.leave()

    def execute(self, item: Prepared, remaining_ms: Callable[[], int]) -> MessageResult:
        parsed = item.state
        if isinstance(parsed, Rejected):
            return self._report.dead_letter(item, parsed.poison)
        try:
            if parsed.handler.mode is Mode.OPTIMISTIC:
                return self._run_optimistic(item, parsed, remaining_ms)
            return self._run_locked(item, parsed, remaining_ms)
        except Exception as error:
            return self._failed(item, error)

    def _failed(self, item: Prepared, error: Exception) -> MessageResult:
        """A message's outcome when its run raised: dead-lettered if poison, retried otherwise."""
        if isinstance(error, PoisonMessage):
            return self._report.dead_letter(item, error)
        if isinstance(error, TransientError):
            return self._report.retry(item, str(error))
        # A bug or an unknown failure: retry, the redrive policy bounds it.
        self._logger.exception("unexpected error", extra=item.log_keys())
        return self._report.retry(item, f"{type(error).__name__}: {error}")

    def reuse(self, item: Prepared, first: MessageResult) -> MessageResult:
        """A duplicate inside the batch takes the first copy's outcome, with no round trip."""
        if first.outcome in (Outcome.APPLIED, Outcome.DUPLICATE):
            self._logger.info("duplicate in batch", extra={**item.log_keys(), "first": first.message_id})
            return MessageResult(item.message_id, Outcome.DUPLICATE, f"duplicate of {first.message_id}")
        if first.poison is not None:
            # Every copy must reach the DLQ itself: a message is applied or dead-lettered.
            return self._report.dead_letter(item, first.poison)
        self._logger.info("retry with the first copy", extra={**item.log_keys(), "first": first.message_id})
        return MessageResult(item.message_id, first.outcome, first.reason, first.retry_at_ms)

    def _run_optimistic(self, item: Prepared, parsed: Parsed, remaining_ms: Callable[[], int]) -> MessageResult:
        effect = self._handle(item, parsed, remaining_ms)
        message = parsed.message
        applied = self._store.apply_once(
            message.record_id, message.payload_hash, effect.result, effect.writes, remaining_ms=remaining_ms
        )
        return self._settle(item, applied)

    def _run_locked(self, item: Prepared, parsed: Parsed, remaining_ms: Callable[[], int]) -> MessageResult:
        # Claimed only now, as its handler is about to start: the lease is the handler's, none of it spent waiting.
        request = self._claim_request(item, parsed, remaining_ms)
        claim = self._store.claim(
            request.record_id,
            request.payload_hash,
            request.lease_ms,
            request.guard,
            undo=request.undo,
            remaining_ms=remaining_ms,
        )
        if not isinstance(claim, Claimed):
            # Refused: nothing was claimed or reserved, and handle never ran: no call was made.
            return self._settle(item, claim)
        end: CommitResult | Exception
        try:
            effect = self._handle(item, parsed, self._lease_remaining(claim, remaining_ms))
            # Committed as soon as its own handler ends, whatever its neighbours' handlers still do (the store waits
            # for them a bounded moment at most). The budget is the invocation's time, not the lease's: past the
            # lease the commit still lands unless another worker took the key over, and this message cannot come
            # back to one before this invocation hands it back.
            end = self._store.commit(claim, effect.result, tuple(effect.writes), remaining_ms=remaining_ms)
        except Exception as error:
            end = error
        return self._locked_end(item, claim, request.undo, end, remaining_ms)

    def _claim_request(self, item: Prepared, parsed: Parsed, remaining_ms: Callable[[], int]) -> ClaimRequest:
        """A lock-mode message's claim: its lease from the time left, its guard's writes and undo, checked."""
        settings = self._settings
        lease_ms = lease_duration(
            remaining_ms(),
            margin_ms=settings.lease_margin_ms,
            min_ms=settings.lease_min_ms,
            max_ms=settings.lease_max_ms,
        )
        message = parsed.message
        guard = parsed.handler.guard(parsed.payload, self._context(item, parsed, remaining_ms))
        reserve, undo = (tuple(guard.writes), tuple(guard.undo)) if guard else ((), ())
        parsed.check_tables((*reserve, *undo))
        return ClaimRequest(message.record_id, message.payload_hash, lease_ms, reserve, undo)

    def _lease_remaining(self, claim: Claimed, remaining_ms: Callable[[], int]) -> Callable[[], int]:
        """A claimed message's time: the invocation's, bounded by its own lease."""

        def lease_remaining_ms() -> int:
            return min(remaining_ms(), claim.lease_expires_at_ms - int(self._clock() * 1000))

        return lease_remaining_ms

    def _locked_end(
        self,
        item: Prepared,
        claim: Claimed,
        undo: Sequence[Write],
        end: CommitResult | Exception,
        remaining_ms: Callable[[], int],
    ) -> MessageResult:
        """A claimed message's outcome from its commit's answer, or from what its handle or commit raised."""
        if isinstance(end, PoisonMessage):
            return self._poison_once_released(item, claim, undo, end, remaining_ms)
        if isinstance(end, Exception):
            # Safe even when a commit was in fact applied: release is fenced on IN_PROGRESS. (A process
            # that dies releases nothing; its lease runs out, and the guard's reservation waits for the
            # redelivery that takes the claim over.)
            self._release_quietly(item, claim, undo, remaining_ms)
            raise end
        if isinstance(end, Refused):
            return self._poison_once_released(item, claim, undo, BusinessConditionFailed(end.write), remaining_ms)
        # A Conflicted commit keeps its claim: until its lease ends nobody repeats the external call.
        return self._settle(item, end)

    def _settle(self, item: Prepared, answer: ApplyResult | CommitResult | Existing | Refused) -> MessageResult:
        """The one place a store's answer becomes the message's outcome."""
        match answer:
            case Applied() | Committed():
                result = self._report.done(item, Outcome.APPLIED)
            case Duplicate():
                result = self._report.done(item, Outcome.DUPLICATE)
            case InFlight():
                result = self._report.in_flight(item, answer.record.lease_expires_at_ms)
            case PayloadMismatch():
                reason = f"key {item.idempotency_key!r} was used before for a different payload"
                result = self._report.dead_letter(item, PoisonMessage(ErrorType.IDEMPOTENCY_KEY_REUSED, reason))
            case Refused(busy=True):
                # Held by another message still at work (or a dead one whose lease will end): it settles soon.
                result = self._report.retry(item, f"{BUSY}: {BusinessConditionFailed(answer.write).message}")
            case Refused():
                then = ABANDONED_RELEASED if answer.abandoned_released else ""
                result = self._report.dead_letter(item, BusinessConditionFailed(answer.write, then=then))
            case Fenced():
                # Fenced out: whoever took the key over owns the outcome now.
                result = self._report.retry(item, answer.reason)
            case Conflicted():
                result = self._report.conflicted(item, answer.reason, answer.conflicts_absorbed)
            case _:
                assert_never(answer)
        return result

    @staticmethod
    def _context(item: Prepared, parsed: Parsed, remaining_ms: Callable[[], int]) -> MessageContext:
        message = parsed.message
        return MessageContext(
            message_id=item.message_id,
            idempotency_key=message.idempotency_key,
            receive_count=message.receive_count,
            remaining_ms=remaining_ms,
            reservation_token=reservation_token(message.record_id, message.payload_hash),
        )

    def _handle(self, item: Prepared, parsed: Parsed, remaining_ms: Callable[[], int]) -> Effect:
        effect = parsed.handler.handle(parsed.payload, self._context(item, parsed, remaining_ms))
        parsed.check_tables(effect.writes)
        return effect

    def _poison_once_released(
        self,
        item: Prepared,
        claim: Claimed,
        undo: Sequence[Write],
        poison: PoisonMessage,
        remaining_ms: Callable[[], int],
    ) -> MessageResult:
        """Dead-letter a claimed message once its claim and reservation are released; retry it while they stand.

        Dead-lettered with its reservation standing, the message that alone could settle it would sit in the
        DLQ (or be purged): retried, it comes back after the lease and its takeover releases them.
        """
        unreleased = self._release_quietly(item, claim, undo, remaining_ms)
        if unreleased is not None:
            return self._report.retry(item, f"release failed ({unreleased}), so not yet dead-lettered: {poison}")
        return self._report.dead_letter(item, poison)

    def _release_quietly(
        self, item: Prepared, claim: Claimed, undo: Sequence[Write], remaining_ms: Callable[[], int]
    ) -> str | None:
        """Release; the error when the claim and its reservation may still stand, None when nothing of ours does."""
        try:
            if not self._store.release(claim, undo, remaining_ms=remaining_ms):
                self._logger.warning(
                    "release found no claim of ours (taken over, or an earlier release lost its answer)",
                    extra=item.log_keys(),
                )
        except Exception as error:
            # The lease still runs out, so the key frees itself; nothing is stuck.
            reason = bounded(str(error))
            self._logger.warning("release failed", extra={**item.log_keys(), "error": reason})
            # An undo refused by its condition: the reservation is no longer this message's to take back.
            return None if isinstance(error, BusinessConditionFailed) else reason
        return None
