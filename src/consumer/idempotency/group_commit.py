"""Group commit across a batch's threads: transitions ready at the same moment sent as one transaction.

Each thread of a batch hands the transitions it has ready to ``submit`` (one, for a lane whose message runs on a
thread of its own; several, for the thread that interleaves the lanes that never wait outside the store), which
returns when each is settled or is left to its own write. As a database's group commit does, the first waiting
thread leads: it waits until every thread taking part (``join``, ``leave``: the batch's threads) is waiting too, or
at most ``wait_ms`` after it arrived, then sends what is waiting in one go. What arrives after that is led by its
own first, at once, beside a send still in flight. Within a send too, a transition waits only for the transaction that
carries it: one packed alone (its items meet another's, or cannot be built) is handed back at once to its own write,
and each shared transaction is sent by a thread whose transition it carries, the leader's own included, so that no
thread sends another's transaction before or after its own. No transition ever waits for a send that is not its own,
however long that one takes (an SDK timeout, a stalled connection). So lock-mode handlers that end together commit
together, and no transition waits for company longer than ``wait_ms``, whatever its neighbours' handlers or sends do:
a quick message beside a slow one commits well inside its lease (``wait_ms`` is at most a tenth of the shortest).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Protocol

from consumer.idempotency.observer import FallBack
from consumer.idempotency.packing import Own, Shared
from consumer.idempotency.transition import Transition


class Packing(Protocol):
    """A group's transitions packed (``packing.Packed``): what goes alone, and the shared transactions to send."""

    @property
    def alone(self) -> Mapping[int, Shared]: ...

    @property
    def packs(self) -> Sequence[Sequence[int]]: ...

    def send(self, indexes: Sequence[int], settle: Callable[[Mapping[int, Shared]], None]) -> None: ...


# A thread's position in a group: its waiting transitions, and which of them a transition of the group is.
_Owners = Sequence[tuple["_Waiting", int]]


class _Waiting:
    """A thread's submitted transitions: their outcomes as each is settled, the shared transactions it is to send, and
    what the thread sleeps on. Each thread is woken alone, for its own outcomes, a transaction to send or its turn to
    lead, never all of them at each arrival: a held lock is the cheapest sleep (``wake`` releases it, at most once
    until the sleeper takes it again)."""

    __slots__ = ("_asleep", "_woken", "jobs", "outcomes", "since", "transitions", "unsettled")

    def __init__(self, transitions: Sequence[Transition[Any]], since: float) -> None:
        self.transitions = transitions
        self.since = since
        self.outcomes: list[Shared | None] = [None] * len(transitions)
        self.unsettled = len(transitions)
        self.jobs: list[Callable[[], None]] = []
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
        pack: Callable[[Sequence[Transition[Any]]], Packing],
        *,
        wait_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pack = pack
        self._wait_s = wait_ms / 1000
        self._clock = clock
        self._lock = threading.Lock()
        self._taking_part = 0
        self._waiting: list[_Waiting] = []
        # The first of those waiting, whose thread gathers them and packs them; the others sleep until settled.
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
        if self._wait(mine, lead=True):
            self._lead(mine)
            self._wait(mine, lead=False)
        outcomes = [outcome for outcome in mine.outcomes if outcome is not None]
        assert len(outcomes) == len(transitions), "a group answers each transition"
        return outcomes

    def _wait(self, mine: _Waiting, *, lead: bool) -> bool:
        """Until ``mine`` is settled (False) or, with ``lead``, leads (True), sending what it is handed meanwhile."""
        while True:
            with self._lock:
                if not mine.unsettled:
                    return False
                if lead and self._leader is mine:
                    return True
                jobs, mine.jobs = mine.jobs, []
            for job in jobs:
                job()
            if not jobs:
                mine.sleep(self._lock)

    def _lead(self, mine: _Waiting) -> None:
        """Gather, until every thread taking part is waiting too or the bound; pack; settle what goes alone; hand each
        shared transaction to a thread whose transition it carries."""
        while True:
            with self._lock:
                wait_s = mine.since + self._wait_s - self._clock()
                if len(self._waiting) >= self._taking_part or wait_s <= 0:
                    # Whoever arrives next leads the next send, at once: never behind this one, however long it takes.
                    sending, self._waiting, self._leader = self._waiting, [], None
                    break
            mine.sleep(self._lock, wait_s)
        owners = [(waiting, position) for waiting in sending for position in range(len(waiting.transitions))]
        try:
            packed = self._pack([waiting.transitions[position] for waiting, position in owners])
        except Exception:  # a packing that fails settles nothing: each goes alone, as it would
            self._settle(owners, dict.fromkeys(range(len(owners)), Own(FallBack.UNNAMED)))
            return
        self._settle(owners, packed.alone)
        with self._lock:
            for pack in packed.packs:
                members = [owners[index][0] for index in pack]
                # A thread of one transition is in one pack alone: it sends that one and no other. Only a pack of one
                # thread's transitions (the thread that interleaves lanes) falls to that thread, beside its others.
                sender = next((member for member in members if len(member.transitions) == 1), members[0])
                sender.jobs.append(partial(self._send, packed, pack, owners))
                sender.wake()

    def _send(self, packed: Packing, pack: Sequence[int], owners: _Owners) -> None:
        with contextlib.suppress(Exception):  # a send settles nothing it could not name: each goes alone, as it would
            try:
                packed.send(pack, partial(self._settle, owners))
            finally:  # what it left unsettled (it raised) goes alone, so that no thread waits for it forever
                self._settle(owners, dict.fromkeys(pack, Own(FallBack.UNNAMED)))

    def _settle(self, owners: _Owners, outcomes: Mapping[int, Shared]) -> None:
        """Each outcome to its thread (the first one given, if two), and each thread woken once all of its are in."""
        with self._lock:
            for index, outcome in outcomes.items():
                waiting, position = owners[index]
                if waiting.outcomes[position] is None:
                    waiting.outcomes[position] = outcome
                    waiting.unsettled -= 1
                    if not waiting.unsettled:
                        waiting.wake()
