"""The idempotency state machine: every message's record goes through these transitions, one path for all.

    (absent | expired) --claim--> IN_PROGRESS --commit--> COMPLETED
                                      |  ^
                          release     |  | claim after the lease ran out (takeover)
                                      v  |
                                   (absent)

    (absent | expired) --apply--> COMPLETED        (optimistic mode)

Each transition (``claim.py``, ``apply.py``, ``commit.py``, ``release.py``) is one conditional write of the record,
with the handler's business writes in the same transaction: DynamoDB, which applies each item's conditional writes
one at a time, is the arbiter. Commit and release are fenced by the claim's ``ownerToken``: a worker whose lease ran
out and was taken over (a zombie) fails its condition and cannot overwrite the newer owner. An expired record
(``expiresAt`` in the past) counts as absent in the conditions themselves: TTL deletion is lazy and may lag by days.

With group commit on, transitions of a batch's messages that are ready at the same moment share one
``TransactWriteItems`` (``group_commit.py``, ``packing.py``), each with its own answer; what a shared transaction
cannot settle goes through the transition's own write. The answer is the same either way.

Every transition is answered with a value (matched by the caller): DynamoDB's own ``TransactionConflict`` is
absorbed under the injected ``ConflictRetry``, and one still unabsorbed is the ``Conflicted`` answer. Only what no
answer describes raises: ``TransientError`` (throttled, unreachable) and a bug's ``ClientError``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, cast

from consumer.conflicts import ConflictRetry
from consumer.idempotency.answers import (
    ApplyRequest,
    ApplyResult,
    Claimed,
    ClaimRequest,
    ClaimResult,
    CommitResult,
)
from consumer.idempotency.apply import Apply
from consumer.idempotency.calls import Table, new_token
from consumer.idempotency.claim import Claim
from consumer.idempotency.commit import Commit
from consumer.idempotency.group_commit import GroupCommit
from consumer.idempotency.observer import FallBack, Observer, Unobserved
from consumer.idempotency.packing import Own, Packed, Settled
from consumer.idempotency.record import IdempotencyRecord
from consumer.idempotency.release import Release
from consumer.idempotency.transition import Transition
from consumer.idempotency.writes import Write

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

_A = TypeVar("_A")


class IdempotencyStore:
    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        ttl_seconds: int,
        result_max_bytes: int = 64 * 1024,
        clock: Callable[[], float] = time.time,
        new_token: Callable[[], str] = new_token,
        conflicts: ConflictRetry | None = None,
        group_commit_wait_ms: int | None = None,
        observer: Observer | None = None,
    ) -> None:
        """``conflicts``: without a policy a conflict is answered at once (tools and tests that count calls).
        ``group_commit_wait_ms``: None sends every transition alone; else transitions ready at the same moment
        share a transaction, none waiting longer than this for others. ``observer`` hears of every send."""
        self._table = Table(
            client,
            table_name,
            ttl_seconds,
            result_max_bytes,
            clock,
            new_token,
            conflicts,
            observer or Unobserved(),
        )
        self._group = (
            None
            if group_commit_wait_ms is None
            else GroupCommit(partial(Packed, self._table), wait_ms=group_commit_wait_ms)
        )

    def run(self, transition: Transition[_A], remaining_ms: Callable[[], int] | None = None) -> _A:
        """One transition applied (``run_all``): its answer, or what its write raised."""
        (answer,) = self.run_all((transition,), remaining_ms)
        if isinstance(answer, Exception):
            raise answer
        return cast("_A", answer)

    def run_all(
        self, transitions: Sequence[Transition[Any]], remaining_ms: Callable[[], int] | None = None
    ) -> list[object]:
        """The one way transitions are applied: shared with others ready at the same moment where group commit is
        on, each one's own write for whatever sharing did not settle. Each one's answer, or the exception its own
        write or the reading of its part raised: one transition's error is never another's."""
        shared = [Own(FallBack.ALONE)] * len(transitions) if self._group is None else self._group.submit(transitions)
        answers: list[object] = []
        for transition, outcome in zip(transitions, shared, strict=True):
            if isinstance(outcome, Settled):
                answers.append(outcome.answer)
                continue
            if outcome.reason != FallBack.ALONE:
                self._table.observer.fell_back(outcome.reason)
            try:
                answers.append(transition.alone(self._table, remaining_ms))
            except Exception as error:
                answers.append(error)
        return answers

    def new_token(self) -> str:
        """A fresh token for a claim or an apply: the fence its later transitions are held to."""
        return self._table.new_token()

    def join(self, threads: int) -> None:
        """``threads`` threads about to run messages (each ``leave``s when done): a shared transaction waits, bounded,
        for their transitions."""
        if self._group is not None:
            self._group.join(threads)

    def leave(self) -> None:
        """The calling thread runs no more messages."""
        if self._group is not None:
            self._group.leave()

    # -- each transition, for one message ------------------------------------------

    def claim(
        self,
        record_id: str,
        payload_hash: str,
        lease_ms: int,
        guard: Sequence[Write] = (),
        *,
        undo: Sequence[Write] = (),
        remaining_ms: Callable[[], int] | None = None,
    ) -> ClaimResult:
        """Lock mode, step 1: take the key for ``lease_ms`` (``Claim``). ``guard``'s writes go in the claim's
        transaction; ``undo`` takes them back when a refusal meets an abandoned claim of the same message."""
        request = ClaimRequest(record_id, payload_hash, lease_ms, tuple(guard), tuple(undo))
        return self.run(Claim(request, self.new_token()), remaining_ms)

    def commit(
        self,
        claim: Claimed,
        result: object = None,
        writes: Sequence[Write] = (),
        *,
        remaining_ms: Callable[[], int] | None = None,
    ) -> CommitResult:
        """Lock mode, step 2: complete the record, with the business writes, if still ours (``Commit``)."""
        return self.run(Commit(claim, result, tuple(writes)), remaining_ms)

    def release(
        self, claim: Claimed, undo: Sequence[Write] = (), *, remaining_ms: Callable[[], int] | None = None
    ) -> bool:
        """Lock mode, on failure: delete the record if still ours, with ``undo`` (``Release``)."""
        return self.run(Release(claim, tuple(undo)), remaining_ms)

    def apply_once(
        self,
        record_id: str,
        payload_hash: str,
        result: object = None,
        writes: Sequence[Write] = (),
        *,
        remaining_ms: Callable[[], int] | None = None,
    ) -> ApplyResult:
        """Optimistic mode: claim, complete and apply the business writes in one write (``Apply``).

        The record keeps an item of its own, named by the key alone, whatever the business writes are: only
        there can a key reused for other content be recognised, whichever business item that content names.
        """
        request = ApplyRequest(record_id, payload_hash, result, tuple(writes))
        return self.run(Apply(request, self.new_token()), remaining_ms)

    def get(self, record_id: str) -> IdempotencyRecord | None:
        """Read a record (strongly consistent); for operators and tests, not the hot path."""
        return self._table.get(record_id)
