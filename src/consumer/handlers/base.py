"""What a business handler is: a payload model, a mode, and one method.

Write your own in one file: subclass ``MessageHandler``, set ``event_type``,
``mode``, ``payload_model`` and ``tables``, implement ``handle``, and add the class to
``consumer.handlers.HANDLERS``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from consumer.config import Settings
from consumer.idempotency.writes import Write


class Mode(StrEnum):
    # Claim, run, commit: 2 round trips; for side effects outside DynamoDB.
    LOCK = "lock"
    # Run, then one transaction that claims and writes: 1 round trip; the handler
    # must be pure, because it also runs for duplicates before they are recognised.
    OPTIMISTIC = "optimistic"


@dataclass(frozen=True)
class Effect:
    """What a handler did or wants done: a small JSON result and the DynamoDB writes."""

    result: Any = None
    writes: Sequence[Write] = field(default_factory=tuple)


@dataclass(frozen=True)
class Guard:
    """What a lock-mode handler needs to hold before its side effect, committed with the claim.

    ``writes`` are the conditions that must hold (``ConditionCheck`` on business items) and
    the writes that reserve what the call will consume (a renewal marked pending under this
    idempotency key, an amount held). They go in one transaction with the claim: if any
    condition fails, nothing is claimed or written, ``handle`` never runs, and the message is
    dead-lettered as ``BusinessConditionFailed`` with that write's ``reason``. ``undo`` takes
    the reservation back; it is applied with the release, in the same transaction fenced on
    the claim, when the message fails before its commit. The commit's own writes must turn the
    reservation into the final state. Mark the reservation with the idempotency key and let
    the guard accept a reservation carrying it: a worker that crashed leaves its reservation,
    and the redelivery that takes its claim over must pass its own guard.
    """

    writes: Sequence[Write]
    undo: Sequence[Write] = field(default_factory=tuple)


@dataclass(frozen=True)
class MessageContext:
    message_id: str
    # The raw key (not namespaced): pass it downstream as the ``Idempotency-Key``.
    idempotency_key: str
    receive_count: int
    # Milliseconds left before the lease (lock mode) or the invocation runs out.
    remaining_ms: Callable[[], int]


PayloadT = TypeVar("PayloadT", bound=BaseModel)
# An identifier in a payload (an account, a payment, a SKU): what a key or a log line can carry as it is.
ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


class MessageHandler(ABC, Generic[PayloadT]):
    event_type: ClassVar[str]
    mode: ClassVar[Mode]
    payload_model: ClassVar[type[BaseModel]]
    # The DynamoDB tables its writes target, by their logical ids in template.yaml: the one place a
    # handler says what it needs. Each reaches the function as a variable named after it
    # (``consumer.config.table_variable``: LedgerTable -> LEDGER_TABLE_NAME); the infrastructure tests
    # check that variable and the role's grants for each, and a write to any other table is refused.
    tables: ClassVar[tuple[str, ...]] = ()

    def __init__(self, settings: Settings) -> None:
        # Each declared table's deployed name; a handler writes ``self.table_names["LedgerTable"]``.
        self.table_names: dict[str, str] = {table: settings.table_names[table] for table in self.tables}

    @abstractmethod
    def handle(self, payload: PayloadT, context: MessageContext) -> Effect:
        """Apply the message. Raise ``PoisonMessage`` or ``TransientError`` to fail it."""

    def contention_key(self, payload: PayloadT) -> str | None:
        """The business item this message's writes contend on, if many messages share it.

        Records of one batch with the same key run one after another instead of racing
        for the item in parallel transactions, which DynamoDB would cancel as conflicts.
        """
        return None

    def guard(self, payload: PayloadT, context: MessageContext) -> Guard | None:
        """Lock mode: the checks and reservations to commit with the claim, before ``handle`` runs.

        ``None`` (the default) claims with a single ``UpdateItem``; a guard makes the claim a
        transaction (each of its items two write units). Build it from the payload and the
        context alone, without I/O: it is built again on every delivery, duplicates included.
        """
        return None
