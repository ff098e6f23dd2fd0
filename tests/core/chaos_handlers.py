"""What the core's chaos test runs on beside the core's test handlers, and consumers that get it wrong on purpose.

``CallOnTheSink``: the core's ``CallHandler`` built from the settings alone, as a chaos runtime builds a handler: its
calls go to the run's webhook sink, within the run's webhook deadline.

``GuardedPeriod``: a lock-mode handler with a guard, whatever the examples are. Its rule, a paid-up period that
only moves forward, is checked with the claim, before its outside call (to the run's webhook sink): the guard
marks the item pending with the message's reservation token, the commit settles it, a release undoes it. Its
table is not in the template: the harness makes it in the idempotency table's shape (key ``id``).

``ChainedNotice`` and ``LockedChainedNotice``: notices that emit one to three tally messages to ``NoticeQueue``, in
each mode; a chaos run relays them back to its own queue, where ``TallyHandler`` applies them (a chain of two).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, StrictInt

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import HandlerSettings, Settings
from consumer.handler import ID_PATTERN, Effect, Guard, MessageContext, MessageHandler, Mode
from consumer.idempotency import calls as store_module
from consumer.idempotency.writes import Update
from consumer.webhook import WebhookClient
from tests.core.handlers import CallHandler, LockedNoticeHandler, NoticeHandler, NoticeRequested

WEBHOOK_VARIABLE = "CHAOS_WEBHOOK_URL"


class Period(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    itemId: str = Field(pattern=ID_PATTERN)
    through: StrictInt = Field(gt=0, le=999_999)


class CallTimeout(HandlerSettings):
    # The run's webhook deadline (WEBHOOK_TIMEOUT_MS, set by the harness from ChaosConfig.webhook_timeout_ms).
    webhook_timeout_ms: PositiveInt = 5_000


class CallOnTheSink(CallHandler):
    settings_model: ClassVar[type[HandlerSettings]] = CallTimeout

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, os.environ[WEBHOOK_VARIABLE], settings.of(CallTimeout).webhook_timeout_ms)


class GuardedPeriod(MessageHandler[Period]):
    event_type: ClassVar[str] = "GuardedPeriodMoved"
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = Period
    tables: ClassVar[tuple[str, ...]] = ("ChaosPeriodTable",)
    settings_model: ClassVar[type[HandlerSettings]] = CallTimeout

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._timeout_ms = settings.of(CallTimeout).webhook_timeout_ms
        self._webhook = WebhookClient(os.environ[WEBHOOK_VARIABLE], WEBHOOK_VARIABLE)

    def contention_key(self, payload: Period) -> str:
        return payload.itemId

    def _write(self, payload: Period, token: str, expression: str, condition: str) -> Update:
        values = {":token": token, ":through": payload.through}
        return Update(
            self.table_names["ChaosPeriodTable"],
            {"id": payload.itemId},
            expression,
            condition=condition,
            values={name: value for name, value in values.items() if name in expression + condition},
            reason=f"{payload.itemId} through {payload.through}: not forward, or another move pending",
        )

    def guard(self, payload: Period, context: MessageContext) -> Guard:
        token = context.reservation_token
        reserve = replace(
            self._write(
                payload,
                token,
                "SET pendingToken = :token",
                "(attribute_not_exists(pendingToken) AND (attribute_not_exists(through) OR through < :through))"
                " OR pendingToken = :token",
            ),
            held_by="pendingToken",
        )
        return Guard((reserve,), undo=(self._write(payload, token, "REMOVE pendingToken", "pendingToken = :token"),))

    def handle(self, payload: Period, context: MessageContext) -> Effect:
        deadline_s = max(0.1, min(self._timeout_ms, context.remaining_ms()) / 1000)
        self._webhook.post(json.dumps(payload.model_dump()).encode(), context.idempotency_key, deadline_s)
        settle = self._write(
            payload, context.reservation_token, "SET through = :through REMOVE pendingToken", "pendingToken = :token"
        )
        return Effect(result={"through": payload.through}, writes=(settle,))


class ChainedNoticeRequested(NoticeRequested):
    """A notice whose draws always emit (one to three tally messages) to the declared queue, unpadded."""

    count: StrictInt = Field(default=1, ge=1, le=3)
    padding: Literal[0] = 0
    destination: Literal["NoticeQueue"] = "NoticeQueue"


class ChainedNotice(NoticeHandler):
    """The source of a chain: its notices' tally messages go out through the outbox to the downstream queue."""

    event_type: ClassVar[str] = "ChainedNoticeRequested"
    payload_model: ClassVar[type[BaseModel]] = ChainedNoticeRequested


class LockedChainedNotice(LockedNoticeHandler):
    event_type: ClassVar[str] = "LockedChainedNoticeRequested"
    payload_model: ClassVar[type[BaseModel]] = ChainedNoticeRequested


# The claim's condition made to hold for any record (its placeholders kept, as DynamoDB wants them all used):
# a duplicate claims a COMPLETED key again, whatever its payload.
UNCONDITIONAL = store_module._CLAIMABLE.replace("#expires < :now_s", "#expires <> :now_s")


def unconditional_wire(
    settings: Settings, session: Any, *, clock: Callable[[], float], handlers: Mapping[str, MessageHandler[Any]]
) -> BatchRunner:
    store_module._CLAIMABLE = UNCONDITIONAL
    return wire(settings, session, clock, handlers=handlers)
