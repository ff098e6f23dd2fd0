"""What a business handler is: a payload model, a mode, and one method.

Write your own in one file of your application (``src/service/handlers/``): subclass
``MessageHandler``, set ``event_type``, ``mode``, ``payload_model`` and ``tables``, implement
``handle``, and add the class to ``HANDLERS`` in ``src/service/registry.py``. The core takes that
list as input (``consumer.lambda_handler``); it never imports your code.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from consumer.config import HandlerSettings, Settings
from consumer.errors import ConfigurationError
from consumer.idempotency.writes import Write
from consumer.outbox import OUTBOX_TABLE, Outgoing


class Mode(StrEnum):
    # Claim, run, commit: 2 round trips; for side effects outside DynamoDB.
    LOCK = "lock"
    # Run, then one transaction that claims and writes: 1 round trip; the handler
    # must be pure, because it also runs for duplicates before they are recognised.
    OPTIMISTIC = "optimistic"


@dataclass(frozen=True)
class Effect:
    """What a handler did or wants done, returned by ``handle`` and committed with the message's record, in one
    ``TransactWriteItems``: all of it or none of it, once per key.

    Attributes
    ----------
    result:
        Anything ``json.dumps`` takes, kept in the record (a digest past ``RESULT_MAX_BYTES``): in lock mode, what
        an API answered (a charge id) belongs here or in a write, so a repeated delivery finds it committed.
    writes:
        The business writes (``Put``, ``Update``, ``Delete``, ``ConditionCheck``) on the handler's declared tables;
        none may name the same item twice.
    messages:
        The messages it emits (``QueueMessage``, ``TopicMessage``, ``BusEvent``), each to one of its declared
        ``destinations``: written to the outbox in the same transaction, so they are sent if and only if the effect
        commits (a duplicate, a refusal or a fenced commit sends nothing), then sent by the relay, at least once,
        each with a key derived from this message's record and its position. Writes and messages: at most 99.

    Example
    -------
    ``Effect(result={"applied": payment_id}, writes=(entry, balance), messages=(QueueMessage("ReceiptQueue",
    "ReceiptRequested", {"paymentId": payment_id}),))``
    """

    result: object = None  # encoded with json.dumps
    writes: Sequence[Write] = field(default_factory=tuple)
    messages: Sequence[Outgoing] = field(default_factory=tuple)


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
    reservation into the final state. Mark the reservation with ``context.reservation_token``
    and let the guard accept a reservation carrying it, whatever the rule says (``(rule AND no
    reservation) OR reservation = :token``): a worker that crashed leaves its reservation, and
    the redelivery that takes its claim over must pass its own guard. Name the attribute that
    carries the token with the write's ``held_by``: a failure while it carries another message's
    token is "busy" (the message comes back with the retry backoff), not a refusal.

    Attributes
    ----------
    writes:
        The checks and reservations, committed with the claim (at most 99 with the claim's record).
    undo:
        The writes that take the reservations back, committed with a release.

    Example
    -------
    ``Guard(writes=(Update(table=t, key=k, expression="SET heldBy = :token", condition="(balance >= :amount AND
    attribute_not_exists(heldBy)) OR heldBy = :token", values={":token": context.reservation_token, ":amount": a},
    held_by="heldBy"),), undo=(Update(table=t, key=k, expression="REMOVE heldBy", condition="heldBy = :token",
    values={":token": context.reservation_token}),))``
    """

    writes: Sequence[Write]
    undo: Sequence[Write] = field(default_factory=tuple)


def _unbound_token() -> str:
    return f"unbound:{uuid.uuid4()}"


@dataclass(frozen=True)
class MessageContext:
    """What the core tells ``guard`` and ``handle`` about the delivery at hand (the payload is their first argument).

    Attributes
    ----------
    message_id:
        SQS's id of this delivery: for logs; a resend has another one, so never a key.
    idempotency_key:
        The message's key as the producer sent it: pass it downstream (``WebhookClient.post`` sends it as
        ``Idempotency-Key``), so a repeated call is one the downstream can recognise.
    receive_count:
        How many times SQS has delivered it (1 the first time).
    remaining_ms:
        A function: the milliseconds left before the lease (lock mode) or the invocation runs out. A call's
        deadline is at most ``remaining_ms() / 1000`` seconds.
    reservation_token:
        The token a guard's hold carries (see ``Guard``): the same for every delivery of this message.

    Example
    -------
    ``client.post(body, context.idempotency_key, min(5.0, context.remaining_ms() / 1000))``
    """

    message_id: str
    # The raw key (not namespaced): pass it downstream as the ``Idempotency-Key``.
    idempotency_key: str
    receive_count: int
    # Milliseconds left before the lease (lock mode) or the invocation runs out.
    remaining_ms: Callable[[], int]
    # Mark a guard's reservation with this and let the guard pass a reservation carrying it: the core derives
    # it from the message's record (event type and key) and payload hash, so only a delivery of the same
    # message passes. A context the core did not build (a tool calling ``handle`` alone) gets one that no
    # reservation carries, never one that passes another message's.
    reservation_token: str = field(default_factory=_unbound_token)


PayloadT = TypeVar("PayloadT", bound=BaseModel)
# An identifier in a payload (an account, a payment, a SKU): what a key or a log line can carry as it is.
ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"


class MessageHandler(ABC, Generic[PayloadT]):
    """One message type's business logic: declare what it needs, return the writes to commit.

    A complete handler, in ``src/service/handlers/points_earned.py``::

        from typing import ClassVar

        from pydantic import BaseModel, ConfigDict, Field, PositiveInt

        from consumer.api import (
            ID_PATTERN, Effect, HandlerSettings, MessageContext, MessageHandler, Mode, Settings, Update
        )


        class PointsEarned(BaseModel):
            model_config = ConfigDict(extra="forbid", frozen=True)

            memberId: str = Field(pattern=ID_PATTERN)
            points: PositiveInt


        class PointsSettings(HandlerSettings):
            points_cap: PositiveInt = 10_000  # read from POINTS_CAP at start; a bad value fails the start


        class PointsEarnedHandler(MessageHandler[PointsEarned]):
            event_type: ClassVar[str] = "PointsEarned"  # the envelope's eventType
            mode: ClassVar[Mode] = Mode.OPTIMISTIC  # pure: writes only, one transaction with the record
            payload_model: ClassVar[type[BaseModel]] = PointsEarned
            tables: ClassVar[tuple[str, ...]] = ("PointsTable",)  # POINTS_TABLE_NAME, granted in template.yaml
            settings_model: ClassVar[type[HandlerSettings]] = PointsSettings

            def __init__(self, settings: Settings) -> None:
                super().__init__(settings)
                self.cap = settings.of(PointsSettings).points_cap

            def handle(self, payload: PointsEarned, context: MessageContext) -> Effect:
                add = Update(
                    table=self.table_names["PointsTable"],
                    key={"memberId": payload.memberId},
                    expression="ADD points :points",
                    condition="attribute_not_exists(points) OR points <= :room",  # else dead-lettered
                    values={":points": payload.points, ":room": self.cap - payload.points},
                    reason=f"member {payload.memberId} would pass the cap of {self.cap} points",
                )
                return Effect(result={"added": payload.points}, writes=(add,))

    Then add ``PointsEarnedHandler`` to ``HANDLERS`` in ``src/service/registry.py``. A handler that must tell
    another service declares ``destinations`` and returns ``Effect(..., messages=(QueueMessage(...),))``: they are
    sent, through the outbox, if and only if its effect commits (docs/outbox.md). A lock-mode
    handler (``Mode.LOCK``) may call outside DynamoDB before returning its writes, through a
    ``WebhookClient``; raise ``PoisonMessage`` for a message that can never succeed, ``TransientError``
    for one that may later. docs/writing-a-handler.md has the rest.
    """

    event_type: ClassVar[str]
    mode: ClassVar[Mode]
    payload_model: ClassVar[type[BaseModel]]
    # The DynamoDB tables its writes target, by their logical ids in template.yaml: the one place a
    # handler says what it needs. Each reaches the function as a variable named after it
    # (``consumer.config.table_variable``: OrdersTable -> ORDERS_TABLE_NAME); the infrastructure tests
    # check that variable and the role's grants for each, and a write to any other table is refused.
    tables: ClassVar[tuple[str, ...]] = ()
    # The queues, topics and buses its ``Effect.messages`` go to, by their logical ids in template.yaml: each
    # reaches the relay as a variable named after it (``consumer.config.destination_variable``: ReceiptQueue ->
    # RECEIPT_QUEUE_DESTINATION), the relay's role may send to it, and a message to any other is dead-lettered.
    destinations: ClassVar[tuple[str, ...]] = ()
    # Settings of its own (a URL, a timeout, a secret's ARN), each field read from its upper-case
    # variable at start; the handler reads them with ``settings.of(<its model>)``.
    settings_model: ClassVar[type[HandlerSettings]] = HandlerSettings

    def __init__(self, settings: Settings) -> None:
        # Each declared table's deployed name; a handler writes ``self.table_names["OrdersTable"]``.
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


# The handlers an application registers: the classes, built once its settings are read.
Handlers = Sequence[type[MessageHandler[Any]]]


def declared_destinations(handlers: Handlers) -> tuple[str, ...]:
    """The destinations the handlers emit to, each once: what the relay must be able to send to."""
    return tuple(dict.fromkeys(destination for handler in handlers for destination in handler.destinations))


def declared_tables(handlers: Handlers) -> tuple[str, ...]:
    """The tables the handlers write, each once, and the outbox when one emits: what the function must reach."""
    outbox = (OUTBOX_TABLE,) if declared_destinations(handlers) else ()
    return tuple(dict.fromkeys((*(table for handler in handlers for table in handler.tables), *outbox)))


def declared_settings(handlers: Handlers) -> tuple[type[HandlerSettings], ...]:
    """The settings models of the handlers, each once: what the function reads at start."""
    return tuple(dict.fromkeys(handler.settings_model for handler in handlers))


def build_handlers(handlers: Handlers, settings: Settings) -> dict[str, MessageHandler[Any]]:
    """Each handler built from the settings, by the event type it routes."""
    built: dict[str, MessageHandler[Any]] = {}
    for handler in handlers:
        if handler.event_type in built:
            # Routing is by event type: a second handler would silently take the first one's messages.
            raise ConfigurationError(
                f"two handlers for eventType {handler.event_type!r}: {type(built[handler.event_type]).__name__}"
                f" and {handler.__name__}; register one"
            )
        built[handler.event_type] = handler(settings)
    return built
