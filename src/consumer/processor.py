"""One message, start to finish: parse, route, run under the idempotency store, classify.

``prepare`` is pure (no I/O) so the batch can sort messages into lanes before any round trip.
A message's one life (``begin``) is its apply (optimistic), or its claim, its handler under its
own lease and its commit or release (lock), each as soon as the one before ends. The life stops
at each transition it needs (a ``Life`` waiting on it); ``step`` sends the transitions of the
lives it is given, shared where they are ready together, and resumes each with its own answer.
``execute`` is one life stepped to its end on the calling thread; the batch steps several at once
on one thread where no handler waits outside the store (optimistic lanes). Whether a transition
shares a transaction is the store's business, below this: the outcome is the same either way.
Nothing here raises for a message's sake: every message ends with exactly one ``MessageResult``,
so one bad message never fails its batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from typing import Any, TypeVar, assert_never, cast

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
    ApplyRequest,
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
from consumer.idempotency.apply import Apply
from consumer.idempotency.claim import Claim
from consumer.idempotency.commit import Commit
from consumer.idempotency.lease import lease_duration
from consumer.idempotency.record import reservation_token
from consumer.idempotency.release import Release
from consumer.idempotency.store import IdempotencyStore
from consumer.idempotency.transition import Transition
from consumer.idempotency.writes import Write
from consumer.outbox import OUTBOX_TABLE, outbox_writes
from consumer.outcome import Log, MessageResult, Outcome
from consumer.prepared import Parsed, Prepared, Rejected, prepare
from consumer.report import Reporter

# What a dead letter adds when its refusal took over a dead worker's claim: nothing of the message is left behind.
ABANDONED_RELEASED = "the abandoned claim and its reservation were released"
# What a message met that waits for another message's hold to settle: back to the queue, with backoff.
BUSY = "held by another message, so not refused"
# A release that found another record of its key: a newer delivery of the message holds it, or completed it.
TAKEN_OVER = "taken over by another delivery"
# Another payload's claim of the key: applied, this message is a reuse; released, the key is this one's.
OTHER_CONTENT = "a message of another payload under its key, which settles whether this one is a reuse"

_A = TypeVar("_A")
# A message's life: it yields each transition it needs, is sent that transition's answer (or has the exception its
# write raised thrown in), and returns the message's result.
Steps = Generator[Transition[Any], object, MessageResult]


def _sent(transition: Transition[_A]) -> Generator[Transition[Any], object, _A]:
    """A life's wait for one transition's answer (``yield from``): the answer, or what its write raised."""
    return cast("_A", (yield transition))


class Life:
    """One message's life in progress: the transition it waits on, or its result once it has ended."""

    __slots__ = ("_steps", "item", "result", "waiting")

    def __init__(self, item: Prepared, steps: Steps) -> None:
        self.item = item
        self._steps = steps
        self.waiting: Transition[Any] | None = None
        self.result: MessageResult | None = None
        self._go(steps.send, None)

    def resume(self, answer: object) -> None:
        """Go on with its transition's answer; an exception is what its write raised, raised where it waited."""
        if isinstance(answer, Exception):
            self._go(self._steps.throw, answer)
        else:
            self._go(self._steps.send, answer)

    def _go(self, step: Callable[[Any], Transition[Any]], value: object) -> None:
        try:
            self.waiting = step(value)
        except StopIteration as end:
            self.waiting, self.result = None, end.value
        except Exception as error:  # never let one message fail the whole batch
            self.waiting = None
            self.result = MessageResult(self.item.message_id, Outcome.RETRIED, f"{type(error).__name__}: {error}")


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

    def begin(self, item: Prepared, remaining_ms: Callable[[], int]) -> Life:
        """The message's life, run until it waits on its first transition (or has ended without one)."""
        return Life(item, self._life(item, remaining_ms))

    def step(self, lives: Sequence[Life], remaining_ms: Callable[[], int]) -> None:
        """Send the transitions ``lives`` wait on (together: the store shares what fits) and resume each with its own
        answer, until it waits on its next transition or has ended."""
        waiting = [(life, life.waiting) for life in lives if life.waiting is not None]
        answers = self._store.run_all([transition for _, transition in waiting], remaining_ms)
        for (life, _), answer in zip(waiting, answers, strict=True):
            life.resume(answer)

    def execute(self, item: Prepared, remaining_ms: Callable[[], int]) -> MessageResult:
        """The message's life, to its end, on the calling thread."""
        life = self.begin(item, remaining_ms)
        while life.result is None:
            self.step((life,), remaining_ms)
        return life.result

    def _life(self, item: Prepared, remaining_ms: Callable[[], int]) -> Steps:
        parsed = item.state
        if isinstance(parsed, Rejected):
            return self._report.dead_letter(item, parsed.poison)
        try:
            if parsed.handler.mode is Mode.OPTIMISTIC:
                return (yield from self._run_optimistic(item, parsed, remaining_ms))
            return (yield from self._run_locked(item, parsed, remaining_ms))
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

    def _run_optimistic(self, item: Prepared, parsed: Parsed, remaining_ms: Callable[[], int]) -> Steps:
        effect = self._handle(item, parsed, remaining_ms)
        message = parsed.message
        request = ApplyRequest(message.record_id, message.payload_hash, effect.result, tuple(effect.writes))
        applied = yield from _sent(Apply(request, self._store.new_token()))
        return self._settle(item, applied)

    def _run_locked(self, item: Prepared, parsed: Parsed, remaining_ms: Callable[[], int]) -> Steps:
        # Claimed only now, as its handler is about to start: the lease is the handler's, none of it spent waiting.
        request = self._claim_request(item, parsed, remaining_ms)
        claim = yield from _sent(Claim(request, self._store.new_token()))
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
            end = yield from _sent(Commit(claim, effect.result, tuple(effect.writes)))
        except Exception as error:
            end = error
        return (yield from self._locked_end(item, claim, request.undo, end))

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
    ) -> Steps:
        """A claimed message's outcome from its commit's answer, or from what its handle or commit raised."""
        if isinstance(end, PoisonMessage):
            return (yield from self._poison_once_released(item, claim, undo, end))
        if isinstance(end, Exception):
            # Safe even when a commit was in fact applied: release is fenced on IN_PROGRESS. (A process
            # that dies releases nothing; its lease runs out, and the guard's reservation waits for the
            # redelivery that takes the claim over.)
            yield from self._release_quietly(item, claim, undo)
            raise end
        if isinstance(end, Refused):
            return (yield from self._poison_once_released(item, claim, undo, BusinessConditionFailed(end.write)))
        # A Conflicted commit keeps its claim: until its lease ends nobody repeats the external call.
        return self._settle(item, end)

    def _settle(self, item: Prepared, answer: ApplyResult | CommitResult | Existing | Refused) -> MessageResult:
        """The one place a store's answer becomes the message's outcome."""
        match answer:
            case Applied() | Committed():
                result = self._report.done(item, Outcome.APPLIED)
            case Duplicate():
                result = self._report.done(item, Outcome.DUPLICATE)
            case InFlight(of_another_content=True):
                # Its lease's end says nothing of when that content's own message settles it: the backoff does.
                result = self._report.in_flight(item, None, held_by=OTHER_CONTENT)
            case InFlight():
                result = self._report.in_flight(item, answer.record.lease_expires_at_ms)
            case PayloadMismatch():
                reason = f"key {item.idempotency_key!r} was applied before with a different payload"
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
        """The handler's effect, its messages turned into outbox writes: one transaction lands both or neither."""
        effect = parsed.handler.handle(parsed.payload, self._context(item, parsed, remaining_ms))
        parsed.check_tables(effect.writes)
        if not effect.messages:
            return effect
        outbox = outbox_writes(
            effect.messages,
            table=self._settings.table_names.get(OUTBOX_TABLE, ""),
            destinations=parsed.handler.destinations,
            record_id=parsed.message.record_id,
            now_ms=int(self._clock() * 1000),
            ttl_seconds=self._settings.idempotency_ttl_seconds,
        )
        return Effect(effect.result, (*effect.writes, *outbox))

    def _poison_once_released(
        self,
        item: Prepared,
        claim: Claimed,
        undo: Sequence[Write],
        poison: PoisonMessage,
    ) -> Steps:
        """Dead-letter a claimed message once its claim and reservation are released; retry it while they stand,
        or while another delivery of it holds the key.

        Dead-lettered with its reservation standing, the message that alone could settle it would sit in the
        DLQ (or be purged): retried, it comes back after the lease and its takeover releases them. Dead-lettered
        under a newer owner, it would be in the DLQ while that owner may still apply it, or, if that owner dies,
        leave its claim with no message to come back to it: retried, it comes back to what that owner left.
        """
        unreleased = yield from self._release_quietly(item, claim, undo)
        if unreleased == TAKEN_OVER:
            return self._report.retry(item, f"{TAKEN_OVER}, so not dead-lettered: {poison}")
        if unreleased is not None:
            return self._report.retry(item, f"release failed ({unreleased}), so not yet dead-lettered: {poison}")
        return self._report.dead_letter(item, poison)

    def _release_quietly(
        self, item: Prepared, claim: Claimed, undo: Sequence[Write]
    ) -> Generator[Transition[Any], object, str | None]:
        """Release; ``TAKEN_OVER`` when another record of the key stands, the error when the claim and its reservation
        may still stand, None when nothing of ours or anyone's does."""
        try:
            if not (yield from _sent(Release(claim, tuple(undo)))):
                self._logger.warning(f"release found the key {TAKEN_OVER}", extra=item.log_keys())
                return TAKEN_OVER
        except Exception as error:
            # The lease still runs out, so the key frees itself; nothing is stuck.
            reason = bounded(str(error))
            self._logger.warning("release failed", extra={**item.log_keys(), "error": reason})
            # An undo refused by its condition: the reservation is no longer this message's to take back.
            return None if isinstance(error, BusinessConditionFailed) else reason
        return None
