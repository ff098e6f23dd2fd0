"""The faults, their rates, their log, and the policy that injects them into one execution environment.

An execution environment is one Lambda runtime process (``chaos.runtime_handler``): one
boto3 session (so one set of hooks), one clock, one consumer. Its policy sees every
request the consumer sends and, at the named points of the state machine, may

- crash the process (``os._exit``: nothing is released, no response is returned, every
  other thread dies mid-request, and the next invocation cold-starts a new runtime);
- pause the worker past its lease until another environment has taken the key over,
  then let it commit, or fail its commit so that it releases (a zombie);
- fail the request in transport (throttling, 5xx, timeouts, lost answers, a
  transaction cancelled for a conflict).

What was injected goes to the environment's journal (``chaos.journal``) as it happens,
so a crash cannot take it back; the harness rebuilds one ``FaultLog`` from all of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

from chaos.journal import Journal
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
    TRANSACTION_CONFLICT = "conflict"
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
    FaultKind.TRANSACTION_CONFLICT: "transaction cancelled: TransactionConflict",
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
    # Per TransactWriteItems, on top of the conflicts the local stack's emulation raises.
    FaultKind.TRANSACTION_CONFLICT: 0.1,
    FaultKind.WEBHOOK_ERROR: 0.1,
    FaultKind.WEBHOOK_SLOW: 0.1,
    FaultKind.WEBHOOK_TIMEOUT: 0.05,
    FaultKind.DEADLINE: 0.05,
}


# The exit code of a runtime killed by a crash fault; the emulator reports it as Runtime.ExitError.
CRASH_EXIT_CODE = 86


@dataclass
class FaultLog:
    """What was injected, overall and per idempotency record; thread-safe.

    With a journal, every event is also written there as it happens; ``replay`` rebuilds
    the log from the journals of every environment.
    """

    counts: Counter[FaultKind] = field(default_factory=Counter)
    by_record: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    # Zombie commits or releases that the server accepted after another owner took the key over.
    zombie_writes_accepted: list[str] = field(default_factory=list)
    zombies_without_takeover: int = 0
    journal: Journal | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: FaultKind, record_id: str | None = None) -> None:
        self._apply({"event": "fault", "kind": kind.value, "record": record_id})

    def note(self, record_id: str, event: str) -> None:
        """An event on a record that is not itself an injected fault (a request cut off by a crash)."""
        self._apply({"event": "note", "note": event, "record": record_id})

    def zombie_write_accepted(self, description: str) -> None:
        self._apply({"event": "zombie_write_accepted", "description": description})

    def zombie_without_takeover(self) -> None:
        self._apply({"event": "zombie_without_takeover"})

    def _apply(self, entry: dict[str, Any], *, journal: bool = True) -> None:
        with self._lock:
            event, record_id = entry["event"], entry.get("record")
            if event == "fault":
                kind = FaultKind(entry["kind"])
                self.counts[kind] += 1
                if record_id is not None:
                    self.by_record[record_id][kind.value] += 1
            elif event == "note" and record_id is not None:
                self.by_record[record_id][entry["note"]] += 1
            elif event == "zombie_write_accepted":
                self.zombie_writes_accepted.append(entry["description"])
            elif event == "zombie_without_takeover":
                self.zombies_without_takeover += 1
            else:
                return
        if journal and self.journal is not None:
            self.journal.write(entry)

    def replay(self, entries: Iterable[dict[str, Any]]) -> None:
        """Add the fault events of journal ``entries`` (other events are skipped)."""
        for entry in entries:
            self._apply(entry, journal=False)


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
    """Fencing tokens of this environment's paused workers whose key was taken over.

    The pause slots are shared by every environment of the run: ``max_paused`` lock files
    in ``slots_dir``, held with ``flock`` while a worker is paused. The kernel drops the
    lock of a process that dies, so a crash never leaks a slot.
    """

    def __init__(self, settings: ZombieSettings, log: FaultLog, slots_dir: Path) -> None:
        self._settings = settings
        self._log = log
        self._slots_dir = slots_dir
        self._lock = threading.Lock()
        self._overtaken: dict[str, str] = {}  # zombie token -> record id
        self._held: dict[int, int] = {}  # thread id -> descriptor of the slot it holds

    def try_pause(self) -> bool:
        """Take one of the pause slots; False when enough workers are paused already."""
        for slot in range(self._settings.max_paused):
            descriptor = os.open(self._slots_dir / f"slot-{slot}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                continue
            with self._lock:
                self._held[threading.get_ident()] = descriptor
            return True
        return False

    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        try:
            yield
        finally:
            with self._lock:
                descriptor = self._held.pop(threading.get_ident(), None)
            if descriptor is not None:
                os.close(descriptor)  # drops the flock

    def pause_until_taken_over(self, record_id: str, token: str) -> bool:
        """Block this worker (holding a slot from ``try_pause``) until another owner holds
        ``record_id`` (True), or give up (False)."""
        with self._slot():
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
    """The transport policy of one execution environment."""

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
        # Records this invocation touched: a crash cuts off whatever the other threads were doing to them.
        self._touched: set[str] = set()

    def new_invocation(self) -> None:
        with self._rng_lock:
            self._touched.clear()

    def roll(self, kind: FaultKind) -> bool:
        """One decision, logged when it injects; for the faults the handler itself plays (the deadline)."""
        if not self._roll(kind):
            return False
        self._log.add(kind)
        return True

    def __call__(self, call: TransportCall) -> TransportPlan | None:
        store_call = classify(call.operation, call.params, self._table) if call.service == "dynamodb" else None
        record_id = store_call.record_id if store_call else None
        if record_id is not None:
            with self._rng_lock:
                self._touched.add(record_id)
        if store_call is not None and store_call.step is not Step.OTHER:
            plan = self._state_machine_fault(store_call, call.attempt)
            if plan is not None:
                return plan
        return self._transport_fault(call, record_id)

    # -- decisions ----------------------------------------------------------------

    def _roll(self, kind: FaultKind) -> bool:
        rate = self._rates.get(kind, 0.0)
        if rate <= 0:
            return False
        with self._rng_lock:
            return self._rng.random() < rate

    def _crash(self, kind: FaultKind, record_id: str | None) -> Callable[[], NoReturn]:
        def crash() -> NoReturn:
            self._log.add(kind, record_id)
            with self._rng_lock:
                cut_off = self._touched - {record_id}
            for other in cut_off:
                self._log.note(other, CUT_OFF)
            # As Lambda's runtime dies: no finally, no release, no response; the journal is already on disk.
            os._exit(CRASH_EXIT_CODE)

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
        if not overtaken:
            return TransportPlan()
        # Half the zombies commit; the others see their commit fail and release instead.
        with self._rng_lock:
            releases = self._rng.random() < 0.5
        if releases:
            return TransportPlan(fault=TransportFault.REJECTED)
        return TransportPlan(after=self._zombies.watch(call))

    def _transport_fault(self, call: TransportCall, record_id: str | None) -> TransportPlan | None:
        if call.operation == "TransactWriteItems" and self._roll(FaultKind.TRANSACTION_CONFLICT):
            self._log.add(FaultKind.TRANSACTION_CONFLICT, record_id)
            return TransportPlan(fault=TransportFault.TRANSACTION_CONFLICT)
        for kind, fault in TRANSPORT_FAULTS.items():
            if self._roll(kind):
                self._log.add(kind, record_id)
                return TransportPlan(fault=fault)
        return None
