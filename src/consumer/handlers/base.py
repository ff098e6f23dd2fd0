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

from consumer.config import HandlerSettings, Settings
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
    # Settings of its own (a URL, a timeout, a secret's ARN), each field read from its upper-case
    # variable at start; the handler reads them with ``settings.of(<its model>)``.
    settings_model: ClassVar[type[HandlerSettings]] = HandlerSettings

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
