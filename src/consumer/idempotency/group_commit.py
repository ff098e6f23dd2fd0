"""Group commit across a batch's threads: transitions ready at the same moment sent as one transaction.

Each message runs its own life on its lane's thread (claim, handler, commit or release; or its one apply) and
hands each transition to ``submit``, which returns when that transition is settled or is left to its own write.
As a database's group commit does, the first waiting transition's thread leads: it waits until every thread
taking part (``join``, ``leave``: the batch's lane threads) is waiting too, or at most ``wait_ms`` after the first
arrived, then sends what is waiting in one go; what arrives meanwhile goes in the next send. So lock-mode handlers
that end together commit together, and no transition waits on the shared call for longer than ``wait_ms`` plus one
call in flight, whatever its neighbours' handlers do: a quick message beside a slow one commits well inside its
lease (``wait_ms`` is at most a tenth of the shortest).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from consumer.idempotency.observer import FallBack
from consumer.idempotency.packing import Own, Shared
from consumer.idempotency.transition import Transition


class _Waiting:
    __slots__ = ("outcome", "since", "transition")

    def __init__(self, transition: Transition[Any], since: float) -> None:
        self.transition = transition
        self.since = since
        self.outcome: Shared | None = None


class GroupCommit:
    def __init__(
        self,
        send: Callable[[Sequence[Transition[Any]]], list[Shared]],
        *,
        wait_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._wait_s = wait_ms / 1000
        self._clock = clock
        self._changed = threading.Condition()
        self._taking_part = 0
        self._waiting: list[_Waiting] = []
        self._sending = False

    def join(self, threads: int = 1) -> None:
        """``threads`` more threads will submit transitions soon (each ``leave``s when done): a send waits for them."""
        with self._changed:
            self._taking_part += threads

    def leave(self) -> None:
        """The calling thread submits nothing more: no send waits for it."""
        with self._changed:
            self._taking_part -= 1
            self._changed.notify_all()

    def submit(self, transition: Transition[Any]) -> Shared:
        """The transition's outcome from a shared send: settled there, or ``Own`` (its own write is to tell)."""
        mine = _Waiting(transition, self._clock())
        with self._changed:
            self._waiting.append(mine)
            self._changed.notify_all()
            while mine.outcome is None:
                if self._sending:
                    self._changed.wait()
                    continue
                wait_s = self._waiting[0].since + self._wait_s - self._clock()
                if len(self._waiting) < self._taking_part and wait_s > 0:
                    # Others taking part are still on their way here: wait for them, bounded.
                    self._changed.wait(wait_s)
                    continue
                sending, self._waiting = self._waiting, []
                self._sending = True
                break
            else:
                return mine.outcome
        try:
            outcomes = self._send([waiting.transition for waiting in sending])
        except Exception:
            outcomes = [Own(FallBack.UNNAMED)] * len(sending)
        with self._changed:
            for waiting, outcome in zip(sending, outcomes, strict=True):
                waiting.outcome = outcome
            self._sending = False
            self._changed.notify_all()
        assert mine.outcome is not None
        return mine.outcome
