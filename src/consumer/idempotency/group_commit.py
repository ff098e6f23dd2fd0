"""Group commit across a batch's threads: transitions ready at the same moment sent as one transaction.

Each thread of a batch hands the transitions it has ready to ``submit`` (one, for a lane whose message runs on a
thread of its own; several, for the thread that interleaves the lanes that never wait outside the store), which
returns when each is settled or is left to its own write. As a database's group commit does, the first waiting
thread leads: it waits until every thread taking part (``join``, ``leave``: the batch's threads) is waiting too, or
at most ``wait_ms`` after it arrived, then sends what is waiting in one go. What arrives after that is led by its
own first, at once, beside a send still in flight: no transition ever waits for another send, however long that one
takes (an SDK timeout, a stalled connection). So lock-mode handlers that end together commit together, and no
transition waits for company longer than ``wait_ms``, whatever its neighbours' handlers or sends do: a quick message
beside a slow one commits well inside its lease (``wait_ms`` is at most a tenth of the shortest).
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
    """A thread's submitted transitions: their outcomes once settled, and what the thread sleeps on. Each thread is
    woken alone, for its own outcomes or its turn to lead, never all of them at each arrival: a held lock is the
    cheapest sleep (``wake`` releases it, at most once until the sleeper takes it again)."""

    __slots__ = ("_asleep", "_woken", "outcomes", "since", "transitions")

    def __init__(self, transitions: Sequence[Transition[Any]], since: float) -> None:
        self.transitions = transitions
        self.since = since
        self.outcomes: list[Shared] | None = None
        self._asleep = threading.Lock()
        self._asleep.acquire()
        self._woken = False  # a wake not yet slept through: the lock is released

    def wake(self) -> None:
        """Under the group commit's lock."""
        if not self._woken:
            self._woken = True
            self._asleep.release()

    def sleep(self, lock: threading.Lock, timeout: float = -1) -> None:
        """Until woken (at once if a wake is pending), or ``timeout`` seconds; ``lock`` is the group commit's."""
        slept_through = self._asleep.acquire(timeout=timeout)
        with lock:
            if self._woken:
                if not slept_through:  # woken just after the timeout: take that release, so the lock stays held
                    self._asleep.acquire()
                self._woken = False


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
        self._lock = threading.Lock()
        self._taking_part = 0
        self._waiting: list[_Waiting] = []
        # The first of those waiting, whose thread gathers them and sends; the others sleep until settled.
        self._leader: _Waiting | None = None

    def join(self, threads: int) -> None:
        """``threads`` more threads will submit transitions soon (each ``leave``s when done): a send waits for them."""
        with self._lock:
            self._taking_part += threads

    def leave(self) -> None:
        """The calling thread submits nothing more: no send waits for it."""
        with self._lock:
            self._taking_part -= 1
            self._nudge()

    def _nudge(self) -> None:
        """Under the lock: wake the leader if every thread it waits for is waiting."""
        if self._leader is not None and len(self._waiting) >= self._taking_part:
            self._leader.wake()

    def submit(self, transitions: Sequence[Transition[Any]]) -> list[Shared]:
        """Each transition's outcome from a shared send: settled there, or ``Own`` (its own write is to tell)."""
        if not transitions:
            return []
        mine = _Waiting(transitions, self._clock())
        with self._lock:
            self._waiting.append(mine)
            if self._leader is None:
                self._leader = mine
            else:
                self._nudge()
        while True:  # until settled by its leader's send, or leading
            with self._lock:
                if mine.outcomes is not None:
                    return mine.outcomes
                if self._leader is mine:
                    break
            mine.sleep(self._lock)
        while True:  # leading: until every thread taking part is waiting too, or the bound
            with self._lock:
                wait_s = mine.since + self._wait_s - self._clock()
                if len(self._waiting) >= self._taking_part or wait_s <= 0:
                    # Whoever arrives next leads the next send, at once: never behind this one, however long it takes.
                    sending, self._waiting, self._leader = self._waiting, [], None
                    break
            mine.sleep(self._lock, wait_s)
        every = [transition for waiting in sending for transition in waiting.transitions]
        try:
            outcomes = self._send(every)
        except Exception:  # a send settles nothing it could not name: each goes alone, as it would
            outcomes = [Own(FallBack.UNNAMED)] * len(every)
        assert len(outcomes) == len(every), "a send answers each transition"
        with self._lock:
            for waiting in sending:
                waiting.outcomes, outcomes = outcomes[: len(waiting.transitions)], outcomes[len(waiting.transitions) :]
                if waiting is not mine:
                    waiting.wake()
        assert mine.outcomes is not None
        return mine.outcomes
