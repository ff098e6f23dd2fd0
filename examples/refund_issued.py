"""An optimistic handler of your own: debit an account when a refund is issued.

Copy this file to ``src/service/handlers/``, add the class to ``HANDLERS`` in
``src/service/registry.py``, and messages with ``"eventType": "RefundIssued"``
are applied exactly once. It writes the ledger the template already has and grants;
``inventory_reserved.py`` is a handler with a table of its own. Each runs in its own
``tests/app/`` file.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from consumer.api import ID_PATTERN, Effect, MessageContext, MessageHandler, Mode, Put, Update


class RefundIssued(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    refundId: str = Field(pattern=ID_PATTERN)
    accountId: str = Field(pattern=ID_PATTERN)
    amountCents: StrictInt = Field(gt=0)


class RefundIssuedHandler(MessageHandler[RefundIssued]):
    event_type: ClassVar[str] = "RefundIssued"
    # Pure: it only returns writes, so one transaction applies them with the record.
    mode: ClassVar[Mode] = Mode.OPTIMISTIC
    payload_model: ClassVar[type[BaseModel]] = RefundIssued
    # The template's LedgerTable, named to the function as LEDGER_TABLE_NAME.
    tables: ClassVar[tuple[str, ...]] = ("LedgerTable",)

    def contention_key(self, payload: RefundIssued) -> str:
        # Refunds and payments to one account update its BALANCE item: in a batch they run one
        # after another, instead of racing in transactions that DynamoDB would cancel.
        return f"LedgerTable/{payload.accountId}"

    def handle(self, payload: RefundIssued, context: MessageContext) -> Effect:
        ledger = self.table_names["LedgerTable"]
        debit = Update(
            table=ledger,
            key={"accountId": payload.accountId, "entryId": "BALANCE"},
            expression="ADD balanceCents :amount",
            # Refuse a refund larger than the balance: the message goes to the DLQ.
            condition="balanceCents >= :refund",
            values={":amount": -payload.amountCents, ":refund": payload.amountCents},
            reason=f"balance of account {payload.accountId} below the refund of {payload.amountCents} cents",
        )
        entry = Put(
            table=ledger,
            item={"accountId": payload.accountId, "entryId": f"REFUND#{payload.refundId}"},
            condition="attribute_not_exists(entryId)",
        )
        return Effect(result={"refundedCents": payload.amountCents}, writes=(debit, entry))
