"""The fault kinds and their default rates, and the policy that injects them into one runtime process:
at the state machine's named points (``chaos.store_calls``) a crash or a zombie, on any request a
transport fault (``chaos.transport_faults``), in a lock-mode handler a slow one; each journaled as it happens."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

from chaos.journal import Journal
from chaos.store_calls import Step, StoreCall, classify
from chaos.transport_faults import TransportCall, TransportFault, TransportPlan
from consumer.handler import Effect, MessageContext

Handle = Callable[[Any, MessageContext], Effect]  # a handler's bound ``handle``


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
    SLOW_HANDLER = "slow-handler"
    RELAY_CRASH = "relay-crash"

    @property
    def description(self) -> str:
        return _CATALOGUE[self][0]


# What the report calls each kind, and its default rate per opportunity: crash points per
# state-machine step, transport faults per request, webhook faults per call, the deadline per invocation, a slow
# handler per lock-mode handler.
_CATALOGUE: Mapping[FaultKind, tuple[str, float]] = {
    FaultKind.CRASH_AFTER_CLAIM: ("crash after claim, before the effect", 0.02),
    FaultKind.CRASH_BEFORE_COMMIT: ("crash after the effect, before commit", 0.02),
    FaultKind.CRASH_AFTER_COMMIT: ("crash after commit, before the batch response", 0.02),
    FaultKind.ZOMBIE: ("zombie: paused past its lease, taken over, resumes", 0.1),
    FaultKind.THROTTLED: ("DynamoDB/SQS throttling", 0.02),
    FaultKind.SERVER_ERROR: ("DynamoDB/SQS 5xx", 0.02),
    FaultKind.CONNECT_TIMEOUT: ("connect timeout (not sent)", 0.01),
    FaultKind.LOST_ANSWER: ("applied, answer lost (500, SDK retries)", 0.03),
    FaultKind.READ_TIMEOUT: ("sent, read timeout (SDK retries)", 0.02),
    # Per TransactWriteItems, on top of the conflicts the local stack's emulation raises.
    FaultKind.TRANSACTION_CONFLICT: ("transaction cancelled: TransactionConflict", 0.1),
    FaultKind.WEBHOOK_ERROR: ("webhook 5xx", 0.1),
    FaultKind.WEBHOOK_SLOW: ("webhook slow (within the timeout)", 0.1),
    FaultKind.WEBHOOK_TIMEOUT: ("webhook timeout", 0.05),
    FaultKind.DEADLINE: ("invocation deadline reached mid-batch", 0.05),
    FaultKind.SLOW_HANDLER: ("lock handler slower than its neighbours' leases", 0.02),
    # Per message the relay sends: a crash after the send and before the stream's checkpoint (the batch comes back).
    FaultKind.RELAY_CRASH: ("relay crash after a send, before its checkpoint", 0.01),
}
DEFAULT_RATES: Mapping[FaultKind, float] = {kind: rate for kind, (_, rate) in _CATALOGUE.items()}

# Where each crash point ends the process: before its request is sent, or once the server applied it.
_AROUND_COMMIT = ((FaultKind.CRASH_BEFORE_COMMIT, "before"), (FaultKind.CRASH_AFTER_COMMIT, "after"))
_CRASH_POINTS: Mapping[Step, tuple[tuple[FaultKind, str], ...]] = {
    Step.CLAIM: ((FaultKind.CRASH_AFTER_CLAIM, "after"),),
    Step.COMMIT: _AROUND_COMMIT,
    Step.APPLY_ONCE: _AROUND_COMMIT,
}
# Rolled in this order on every request, each the transport fault of its name; a conflict only on a TransactWriteItems.
_TRANSPORT_FAULTS: Mapping[FaultKind, TransportFault] = {
    FaultKind[name]: TransportFault[name]
    for name in ("TRANSACTION_CONFLICT", "THROTTLED", "SERVER_ERROR", "CONNECT_TIMEOUT", "LOST_ANSWER", "READ_TIMEOUT")
}
# Where an answer lost or timed out matters: a request that changed something. A forced one lands on a write.
_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems"})
_AMBIGUOUS = (FaultKind.LOST_ANSWER, FaultKind.READ_TIMEOUT)
_SENDS = frozenset({"SendMessage", "Publish", "PutEvents"})  # the relay's, one per outbox item
# The exit code of a runtime killed by a crash fault; the emulator reports it as Runtime.ExitError.
_CRASH_EXIT_CODE = 86
_OWNER_POLL_S = 0.05


def _flock(path: Path, mode: int) -> int | None:
    """A descriptor of ``path`` holding a flock, which closing it (or the process dying) drops; None if taken."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, mode)
    except BlockingIOError:
        os.close(descriptor)
        return None
    return descriptor


@dataclass
class Zombies:
    """The run's pause slots, and the fencing tokens of this process's zombies whose key was taken over.

    A paused worker holds its poller, so that at most ``max_paused`` pause at once across the run,
    leaving pollers free to take their keys over: lock files held with ``flock``, which the kernel
    drops when a process dies, so a crash never leaks a slot.
    """

    slots_dir: Path
    max_paused: int
    max_pause_s: float
    owner_of: Callable[[str], str | None]  # the record's current ownerToken, read outside the fault hooks
    # A set's add and membership test are atomic: no lock.
    overtaken: set[str] = field(default_factory=set, init=False)
    _holds: dict[str, int | None] = field(default_factory=dict, init=False)  # record id: its flocked descriptor

    @contextlib.contextmanager
    def slot(self) -> Iterator[bool]:
        """Hold a free pause slot for the block (True), or find none free (False)."""
        for index in range(self.max_paused):
            descriptor = _flock(self.slots_dir / f"pause-slot-{index}", fcntl.LOCK_EX | fcntl.LOCK_NB)
            if descriptor is None:
                continue
            try:
                yield True
            finally:
                os.close(descriptor)  # drops the flock
            return
        yield False

    def _held(self, record_id: str) -> Path:
        return self.slots_dir / f"held-{hashlib.sha256(record_id.encode()).hexdigest()[:16]}"

    def hold(self, record_id: str) -> None:
        """The key's next owner waits at its commit (``wait_for``) until this zombie's write is answered: the
        zombie always writes over an owner still at work, where only the fencing token stops it."""
        self._holds[record_id] = _flock(self._held(record_id), fcntl.LOCK_EX)

    def let_go(self, record_id: str) -> None:
        if (descriptor := self._holds.pop(record_id, None)) is not None:
            os.close(descriptor)

    def wait_for(self, record_id: str) -> bool:
        """Until no zombie holds ``record_id`` (or the pause's bound); whether it waited at all."""
        if not self._held(record_id).exists():
            return False  # no zombie ever held this key: no lock file made for every commit of the run
        deadline = time.monotonic() + self.max_pause_s
        waited = False
        while (held := _flock(self._held(record_id), fcntl.LOCK_SH | fcntl.LOCK_NB)) is None:
            if time.monotonic() > deadline:
                return True
            waited = True
            time.sleep(_OWNER_POLL_S)
        os.close(held)
        return waited

    def pause_until_taken_over(self, record_id: str, token: str) -> bool:
        """Block this worker until another owner holds ``record_id`` (True), or give up (False)."""
        deadline = time.monotonic() + self.max_pause_s
        while time.monotonic() < deadline:
            owner = self.owner_of(record_id)
            if owner is not None and owner != token:
                self.overtaken.add(token)
                return True
            time.sleep(_OWNER_POLL_S)
        return False


@dataclass
class FaultPolicy:
    """The transport policy of one runtime process: one decision per state-machine step, then per request.

    ``forced``: per kind, the faults this environment still owes whatever the draws, each taken at the kind's
    next opportunity (a first attempt), so that a short run injects every kind by construction. A forced crash at a
    commit waits for a moment when another lock-mode handler runs, a forced slow handler too: both land inside a
    lock wave. A forced crash after a claim is taken at the first claim."""

    rates: Mapping[FaultKind, float]
    rng: random.Random
    journal: Journal
    idempotency_table: str
    zombies: Zombies
    forced: Counter[FaultKind] = field(default_factory=Counter)
    # When set, the forced crashes and zombies are taken only on records of this event type.
    forced_on: str | None = None
    relay: bool = False  # the outbox's relay, whose sends may end in a crash
    # Records this invocation touched: a crash cuts off whatever the other threads were doing to them.
    _touched: set[str] = field(default_factory=set, init=False)
    # This invocation's lock-mode handlers by record: True while running.
    _handlers: dict[str, bool] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def new_invocation(self) -> None:
        with self._lock:
            self._touched.clear()
            self._handlers.clear()

    def _beside(self, record_id: str | None, running: bool = True) -> int:
        """This invocation's other lock-mode handlers: those running (or started, ``running=False``)."""
        with self._lock:
            return sum(record != record_id and (now or not running) for record, now in self._handlers.items())

    def slowed(self, handle: Handle, event_type: str, hold_s: float) -> Handle:
        """A lock-mode handler's ``handle``, known to be running, and for a slow handler fault held ``hold_s`` once
        its call is made: past its lease and its message's visibility, while its neighbours end at once."""

        def handle_watched(payload: Any, context: MessageContext) -> Effect:
            record = f"{event_type}#{context.idempotency_key}"
            with self._lock:
                self._handlers[record] = True
            try:
                effect = handle(payload, context)
                # Beside a handler still running: one that had ended may have committed already, and a lock group
                # that commits after its slowest handler (the negative control) then repeats nothing.
                beside = self._beside(record)
                if self.roll(FaultKind.SLOW_HANDLER, forcible=beside > 0, record_id=record):
                    # A pause slot, as a zombie takes: a poller stays free to take the neighbours' redeliveries over
                    # (with every poller held at once, none was, and nothing was tried while they were held).
                    with self.zombies.slot() as paused:
                        if paused:
                            self.inject(FaultKind.SLOW_HANDLER, record)
                            time.sleep(hold_s)
                return effect
            finally:
                with self._lock:
                    self._handlers[record] = False

        return handle_watched

    def _owes_on(self, record_id: str | None) -> bool:
        """Whether a forced fault may be taken on ``record_id``: any record, or one of ``forced_on``'s."""
        return record_id is None or self.forced_on is None or record_id.startswith(f"{self.forced_on}#")

    def roll(self, kind: FaultKind, forcible: bool = True, record_id: str | None = None) -> bool:
        if forcible and self.forced[kind] > 0 and self._owes_on(record_id):
            return True  # owed until injected: an opportunity that comes to nothing (no free pause slot) passes it on
        rate = self.rates.get(kind, 0.0)
        return rate > 0 and self._draw() < rate

    def inject(
        self,
        kind: FaultKind,
        record_id: str | None = None,
        others: Sequence[str] = (),
        *,
        anywhere: bool = False,
        **detail: Any,
    ) -> None:
        """Journal a fault on ``record_id`` (and ``others``, the records sharing its request), paying what is owed:
        ``anywhere``, a kind forced on any record (rolled with none), else one forced on ``forced_on``'s alone."""
        # A drawn fault on another handler's record pays nothing of what is owed to ``forced_on``'s: paid by it, a
        # draw could leave the forced handler without the fault. Paid by nothing, a kind forced anywhere would be
        # forced again at every call until one landed on the forced handler.
        with self._lock:
            paid = self.forced[kind] > 0 and (anywhere or self._owes_on(record_id))
            self.forced[kind] -= paid
        if others:
            detail["others"] = list(others)
        self.journal.write("fault", kind=kind, record=record_id, paid=paid, **detail)

    def __call__(self, call: TransportCall) -> TransportPlan | None:
        store_call = classify(call, self.idempotency_table)
        with self._lock:
            self._touched.update(record for record in (store_call.record_id, *store_call.others) if record)
        if store_call.step is not Step.OTHER:
            plan = self._state_machine_fault(store_call, call.attempt)
            if plan is not None:
                return plan
        if self.relay and call.attempt == 1 and call.operation in _SENDS and self.roll(FaultKind.RELAY_CRASH):
            return TransportPlan(after=self._crash(FaultKind.RELAY_CRASH, None))
        # The relay's sends are its writes: an answer lost there is a message sent twice.
        write = (call.service == "dynamodb" and call.operation in _WRITES) or (self.relay and call.operation in _SENDS)
        for kind, fault in _TRANSPORT_FAULTS.items():
            if fault is TransportFault.TRANSACTION_CONFLICT and call.operation != "TransactWriteItems":
                continue
            if self.roll(kind, forcible=call.attempt == 1 and (write or kind not in _AMBIGUOUS)):
                # A shared transaction's fault is each of its records' own: alone, each would have met it.
                self.inject(kind, store_call.record_id, others=store_call.others, anywhere=True)
                return TransportPlan(fault=fault)
        return None

    def _draw(self) -> float:
        with self._lock:
            return self.rng.random()

    def _state_machine_fault(self, call: StoreCall, attempt: int) -> TransportPlan | None:
        if call.step in (Step.COMMIT, Step.RELEASE) and call.owner_token in self.zombies.overtaken:
            return self._zombie_write(call)
        if call.step is Step.COMMIT and call.record_id is not None and self.zombies.wait_for(call.record_id):
            for other in call.others:  # held back with it, by a fault not theirs alone: they may lose their leases
                self.journal.write("held_back", record=other)
        if attempt > 1:
            return None  # one decision per call; its retries go through untouched
        for kind, when in _CRASH_POINTS.get(call.step, ()):
            # A wave's claims go out before its handlers start, so a forced crash after the claim waits for nobody:
            # one that waited for a lock handler beside it was owed, and never met, in some short runs.
            forcible = kind is FaultKind.CRASH_AFTER_CLAIM or self._beside(call.record_id) > 0
            if self.roll(kind, forcible=forcible, record_id=call.record_id):
                crash = self._crash(kind, call.record_id)
                return TransportPlan(before=crash) if when == "before" else TransportPlan(after=crash)
        if call.step is Step.COMMIT and self.roll(FaultKind.ZOMBIE, record_id=call.record_id):
            return self._zombie(call)
        return None

    def _crash(self, kind: FaultKind, record_id: str | None) -> Callable[[], NoReturn]:
        def crash() -> NoReturn:
            self.inject(kind, record_id, beside=self._beside(record_id))
            with self._lock:
                cut_off = self._touched - {record_id}
            for other in cut_off:
                self.journal.write("cut_off", record=other)
            # As Lambda's runtime dies: no finally, no release, no response; the journal is already on disk.
            os._exit(_CRASH_EXIT_CODE)

        return crash

    def _zombie(self, call: StoreCall) -> TransportPlan | None:
        assert call.record_id is not None and call.owner_token is not None
        with self.zombies.slot() as paused:
            if not paused:
                return None  # enough workers paused already: no zombie this time
            self.inject(FaultKind.ZOMBIE, call.record_id)
            for other in call.others:  # paused with it, past their leases too
                self.journal.write("cut_off", record=other)
            self.zombies.hold(call.record_id)
            overtaken = self.zombies.pause_until_taken_over(call.record_id, call.owner_token)
        if not overtaken:
            self.zombies.let_go(call.record_id)
            self.journal.write("zombie_without_takeover")
            return TransportPlan()
        # Half the zombies commit; the others see their commit fail and release instead (still held until then).
        if self._draw() < 0.5:
            return TransportPlan(fault=TransportFault.REJECTED)
        return self._zombie_write(call)

    def _zombie_write(self, call: StoreCall) -> TransportPlan:
        """A zombie's commit or release: journaled if the server applied it (the fencing failed); answered, it
        lets the new owner commit."""
        record_id = call.record_id or ""
        description = f"{call.step} of {record_id} by overtaken owner {call.owner_token}"
        return TransportPlan(
            after=lambda: self.journal.write("zombie_write_accepted", description=description),
            settled=lambda: self.zombies.let_go(record_id),
        )
