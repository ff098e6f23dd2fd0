"""The faults, their rates, their log, and the policy that injects them into one container.

A container is one warm Lambda execution environment: one boto3 session (so one set
of hooks), one clock, one consumer. Its policy sees every request the consumer
sends and, at the named points of the state machine, may

- crash the container (``InvocationCrashed``, a ``BaseException``, so nothing in the
  consumer catches it and nothing is released: a dying process releases nothing);
- pause the worker past its lease until another container has taken the key over,
  then let it commit, or fail its commit so that it releases (a zombie);
- fail the request in transport (throttling, 5xx, timeouts, lost answers).

A crashed container stays dead: any request its remaining threads still make
raises too, as if the process had gone.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from chaos.store_calls import Step, StoreCall, classify
from chaos.transport_faults import TransportCall, TransportFault, TransportPlan


class FaultKind(StrEnum):
    CRASH_AFTER_CLAIM = "crash-after-claim"
    CRASH_BEFORE_COMMIT = "crash-before-commit"
    CRASH_AFTER_COMMIT = "crash-after-commit"
    ZOMBIE = "zombie"
    THROTTLED = "throttled"
    SERVER_ERROR = "5xx"
    CONNECT_TIMEOUT = "connect-timeout"
    LOST_ANSWER = "lost-answer"
    READ_TIMEOUT = "read-timeout"
    WEBHOOK_ERROR = "webhook-5xx"
    WEBHOOK_SLOW = "webhook-slow"
    WEBHOOK_TIMEOUT = "webhook-timeout"
    DEADLINE = "deadline"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS: Mapping[FaultKind, str] = {
    FaultKind.CRASH_AFTER_CLAIM: "crash after claim, before the effect",
    FaultKind.CRASH_BEFORE_COMMIT: "crash after the effect, before commit",
    FaultKind.CRASH_AFTER_COMMIT: "crash after commit, before the batch response",
    FaultKind.ZOMBIE: "zombie: paused past its lease, taken over, resumes",
    FaultKind.THROTTLED: "DynamoDB/SQS throttling",
    FaultKind.SERVER_ERROR: "DynamoDB/SQS 5xx",
    FaultKind.CONNECT_TIMEOUT: "connect timeout (not sent)",
    FaultKind.LOST_ANSWER: "applied, answer lost (500, SDK retries)",
    FaultKind.READ_TIMEOUT: "sent, read timeout (SDK retries)",
    FaultKind.WEBHOOK_ERROR: "webhook 5xx",
    FaultKind.WEBHOOK_SLOW: "webhook slow (within the timeout)",
    FaultKind.WEBHOOK_TIMEOUT: "webhook timeout",
    FaultKind.DEADLINE: "invocation deadline reached mid-batch",
}


TRANSPORT_FAULTS: Mapping[FaultKind, TransportFault] = {
    FaultKind.THROTTLED: TransportFault.THROTTLED,
    FaultKind.SERVER_ERROR: TransportFault.SERVER_ERROR,
    FaultKind.CONNECT_TIMEOUT: TransportFault.CONNECT_TIMEOUT,
    FaultKind.LOST_ANSWER: TransportFault.LOST_ANSWER,
    FaultKind.READ_TIMEOUT: TransportFault.READ_TIMEOUT,
}

# Per opportunity: crash points per state-machine step, transport faults per request,
# webhook faults per call, the deadline per invocation.
DEFAULT_RATES: Mapping[FaultKind, float] = {
    FaultKind.CRASH_AFTER_CLAIM: 0.02,
    FaultKind.CRASH_BEFORE_COMMIT: 0.02,
    FaultKind.CRASH_AFTER_COMMIT: 0.02,
    FaultKind.ZOMBIE: 0.1,
    FaultKind.THROTTLED: 0.02,
    FaultKind.SERVER_ERROR: 0.02,
    FaultKind.CONNECT_TIMEOUT: 0.01,
    FaultKind.LOST_ANSWER: 0.03,
    FaultKind.READ_TIMEOUT: 0.02,
    FaultKind.WEBHOOK_ERROR: 0.1,
    FaultKind.WEBHOOK_SLOW: 0.1,
    FaultKind.WEBHOOK_TIMEOUT: 0.05,
    FaultKind.DEADLINE: 0.05,
}


class InvocationCrashed(BaseException):
    """The container died at a fault point. Not an ``Exception``: nothing may catch it on the way out."""

    def __init__(self, kind: str, record_id: str | None) -> None:
        super().__init__(f"{kind} ({record_id or 'no record'})")
        self.kind = kind
        self.record_id = record_id


@dataclass
class FaultLog:
    """What was injected, overall and per idempotency record; thread-safe."""

    counts: Counter[FaultKind] = field(default_factory=Counter)
    by_record: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    # Zombie commits or releases that the server accepted after another owner took the key over.
    zombie_writes_accepted: list[str] = field(default_factory=list)
    zombies_without_takeover: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: FaultKind, record_id: str | None = None) -> None:
        with self._lock:
            self.counts[kind] += 1
            if record_id is not None:
                self.by_record[record_id][kind.value] += 1

    def note(self, record_id: str, event: str) -> None:
        """An event on a record that is not itself an injected fault (a request cut off by a crash)."""
        with self._lock:
            self.by_record[record_id][event] += 1

    def zombie_write_accepted(self, description: str) -> None:
        with self._lock:
            self.zombie_writes_accepted.append(description)

    def zombie_without_takeover(self) -> None:
        with self._lock:
            self.zombies_without_takeover += 1


CUT_OFF = "request cut off by a crash"

OwnerLookup = Callable[[str], str | None]


@dataclass(frozen=True)
class ZombieSettings:
    """How long a zombie waits for another container to take its key over, and how it looks."""

    owner_of: OwnerLookup  # the record's current ownerToken, read outside every container
    max_pause_s: float
    # A paused worker holds its poller; some must stay free to take the key over.
    max_paused: int
    poll_s: float = 0.05


class Zombies:
    """Fencing tokens of paused workers whose key was taken over; shared by all containers."""

    def __init__(self, settings: ZombieSettings, log: FaultLog) -> None:
        self._settings = settings
        self._log = log
        self._lock = threading.Lock()
        self._overtaken: dict[str, str] = {}  # zombie token -> record id
        self._paused = 0

    def try_pause(self) -> bool:
        """Take one of the pause slots; False when enough workers are paused already."""
        with self._lock:
            if self._paused >= self._settings.max_paused:
                return False
            self._paused += 1
            return True

    def pause_until_taken_over(self, record_id: str, token: str) -> bool:
        """Block this worker (holding a slot from ``try_pause``) until another owner holds
        ``record_id`` (True), or give up (False)."""
        try:
            deadline = time.monotonic() + self._settings.max_pause_s
            while time.monotonic() < deadline:
                owner = self._settings.owner_of(record_id)
                if owner is not None and owner != token:
                    with self._lock:
                        self._overtaken[token] = record_id
                    return True
                time.sleep(self._settings.poll_s)
            self._log.zombie_without_takeover()
            return False
        finally:
            with self._lock:
                self._paused -= 1

    def wait_until_idle(self, timeout_s: float) -> None:
        """Until no worker is paused (a zombie of a crashed container may outlive its poller's stop)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._paused == 0:
                    return
            time.sleep(0.05)

    def is_overtaken(self, token: str | None) -> bool:
        with self._lock:
            return token is not None and token in self._overtaken

    def watch(self, call: StoreCall) -> Callable[[int], None]:
        """After a zombie's commit or release: the server must have refused it."""

        def check(status: int) -> None:
            if 200 <= status < 300:
                self._log.zombie_write_accepted(
                    f"{call.step} of {call.record_id} by overtaken owner {call.owner_token}"
                )

        return check


class ContainerFaults:
    """The transport policy of one container."""

    def __init__(
        self,
        rates: Mapping[FaultKind, float],
        rng: random.Random,
        log: FaultLog,
        idempotency_table: str,
        zombies: Zombies,
    ) -> None:
        self._rates = rates
        self._rng = rng
        self._rng_lock = threading.Lock()
        self._log = log
        self._table = idempotency_table
        self._zombies = zombies
        self.dead = False

    def __call__(self, call: TransportCall) -> TransportPlan | None:
        store_call = classify(call.operation, call.params, self._table) if call.service == "dynamodb" else None
        record_id = store_call.record_id if store_call else None
        if self.dead:
            if record_id is not None:
                self._log.note(record_id, CUT_OFF)
            raise InvocationCrashed("container already dead", record_id)
        if store_call is not None and store_call.step is not Step.OTHER:
            plan = self._state_machine_fault(store_call, call.attempt)
            if plan is not None:
                return plan
        return self._transport_fault(record_id)

    # -- decisions ----------------------------------------------------------------

    def _roll(self, kind: FaultKind) -> bool:
        rate = self._rates.get(kind, 0.0)
        if rate <= 0:
            return False
        with self._rng_lock:
            return self._rng.random() < rate

    def _crash(self, kind: FaultKind, record_id: str | None) -> Callable[[], None]:
        def crash() -> None:
            self._log.add(kind, record_id)
            self.dead = True
            raise InvocationCrashed(kind.value, record_id)

        return crash

    def _crash_if_applied(self, kind: FaultKind, record_id: str | None) -> Callable[[int], None]:
        crash = self._crash(kind, record_id)

        def after(status: int) -> None:
            if 200 <= status < 300:
                crash()

        return after

    def _state_machine_fault(self, call: StoreCall, attempt: int) -> TransportPlan | None:
        if call.step in (Step.COMMIT, Step.RELEASE) and self._zombies.is_overtaken(call.owner_token):
            return TransportPlan(after=self._zombies.watch(call))
        if attempt > 1:
            return None  # one decision per call; its retries go through untouched
        crash = self._crash_point(call)
        if crash is None and call.step is Step.COMMIT and self._roll(FaultKind.ZOMBIE) and self._zombies.try_pause():
            return self._zombie(call)
        return crash

    def _crash_point(self, call: StoreCall) -> TransportPlan | None:
        if call.step is Step.CLAIM and self._roll(FaultKind.CRASH_AFTER_CLAIM):
            return TransportPlan(after=self._crash_if_applied(FaultKind.CRASH_AFTER_CLAIM, call.record_id))
        if call.step not in (Step.COMMIT, Step.APPLY_ONCE):
            return None
        if self._roll(FaultKind.CRASH_BEFORE_COMMIT):
            return TransportPlan(before=self._crash(FaultKind.CRASH_BEFORE_COMMIT, call.record_id))
        if self._roll(FaultKind.CRASH_AFTER_COMMIT):
            return TransportPlan(after=self._crash_if_applied(FaultKind.CRASH_AFTER_COMMIT, call.record_id))
        return None

    def _zombie(self, call: StoreCall) -> TransportPlan:
        assert call.record_id is not None and call.owner_token is not None
        self._log.add(FaultKind.ZOMBIE, call.record_id)
        overtaken = self._zombies.pause_until_taken_over(call.record_id, call.owner_token)
        if self.dead:
            # The container crashed elsewhere while this worker was paused: it never wakes up.
            self._log.note(call.record_id, CUT_OFF)
            raise InvocationCrashed("container died during the pause", call.record_id)
        if not overtaken:
            return TransportPlan()
        # Half the zombies commit; the others see their commit fail and release instead.
        with self._rng_lock:
            releases = self._rng.random() < 0.5
        if releases:
            return TransportPlan(fault=TransportFault.REJECTED)
        return TransportPlan(after=self._zombies.watch(call))

    def _transport_fault(self, record_id: str | None) -> TransportPlan | None:
        for kind, fault in TRANSPORT_FAULTS.items():
            if self._roll(kind):
                self._log.add(kind, record_id)
                return TransportPlan(fault=fault)
        return None
