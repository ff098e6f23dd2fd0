"""Absorb DynamoDB transaction conflicts in process, as AWS advises for ``TransactionConflict``.

Another transaction holding one of our items lasts milliseconds. Handing the message
back to SQS for it would cost seconds of visibility timeout and, repeated, could
dead-letter a healthy message; so the same write is tried again after a jittered
exponential wait, as long as the invocation's time allows. The idempotency store runs
every transition through this policy (``IdempotencyStore(conflicts=...)``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from consumer.errors import TransactionConflict

T = TypeVar("T")


class ConflictRetry:
    def __init__(
        self,
        *,
        base_ms: int,
        max_ms: int,
        margin_ms: int,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._base_ms = base_ms
        self._max_ms = max_ms
        self._margin_ms = margin_ms
        self._sleep = sleep
        self._jitter = jitter

    def run(
        self,
        write: Callable[[], T],
        remaining_ms: Callable[[], int],
    ) -> tuple[T | TransactionConflict, int]:
        """Call ``write`` until no conflict refuses it: its answer, or the last conflict when the next wait would
        end inside the margin, with the number of conflicts absorbed before it.

        ``write`` must be safe to repeat: a conflict means DynamoDB applied nothing. There is no limit of tries:
        a message handed back for a conflict comes back only after a visibility timeout, and each return counts
        towards its redrive limit, so a healthy message under contention could reach the DLQ; waiting here costs
        milliseconds of an invocation that has them.
        """
        attempt = 0
        while True:
            try:
                return write(), attempt
            except TransactionConflict as conflict:
                # Full jitter: contenders that collided once must not collide again in step.
                wait_ms = self._jitter() * min(self._max_ms, self._base_ms * 2 ** min(attempt, 16))
                attempt += 1
                if remaining_ms() - wait_ms < self._margin_ms:
                    return conflict, attempt - 1
                self._sleep(wait_ms / 1000)
