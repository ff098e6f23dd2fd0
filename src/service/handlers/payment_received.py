"""PaymentReceived (optimistic): credit an account in the ledger table, and ask for a receipt.

Pure: it only returns writes, so the credit, the entry and the idempotency record land
in one transaction (3 items). A payment that names a ``receiptEmail`` also emits a
``ReceiptRequested`` onto the consumer's own queue, through the outbox, in that same
transaction (4 items): the receipt is asked for if and only if the payment was credited, and
the relay sends it with a key derived from this payment's record, so ``ReceiptRequested``
applies it once however often it is sent. The ledger keeps the balance at ``(accountId, "BALANCE")``
and one entry per applied payment at ``(accountId, "PAYMENT#" + paymentId)``. Two
identities, two guards: the record (named by the idempotency key) refuses the key reused
for other content, whichever payment that content names; the entry's condition refuses the
same payment under another key, and keeps refusing it after the record has expired.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from consumer.api import ID_PATTERN, Effect, MessageContext, MessageHandler, Mode, Put, QueueMessage, Update


class PaymentReceived(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    paymentId: str = Field(pattern=ID_PATTERN)
    accountId: str = Field(pattern=ID_PATTERN)
    amountCents: StrictInt = Field(gt=0, le=10**12)
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    # Where the receipt goes: with it, the payment asks for one (ReceiptRequested, through the outbox).
    receiptEmail: str | None = Field(default=None, min_length=3, max_length=254, pattern=r"^[^@\s]+@[^@\s]+$")


class PaymentReceivedHandler(MessageHandler[PaymentReceived]):
    event_type: ClassVar[str] = "PaymentReceived"
    mode: ClassVar[Mode] = Mode.OPTIMISTIC
    payload_model: ClassVar[type[BaseModel]] = PaymentReceived
    tables: ClassVar[tuple[str, ...]] = ("LedgerTable",)
    # The queue its receipt requests go to: this function's own, where ReceiptRequestedHandler takes them.
    destinations: ClassVar[tuple[str, ...]] = ("ConsumerQueue",)

    def contention_key(self, payload: PaymentReceived) -> str:
        # Every payment to an account updates its BALANCE item.
        return f"LedgerTable/{payload.accountId}"

    def handle(self, payload: PaymentReceived, context: MessageContext) -> Effect:
        ledger = self.table_names["LedgerTable"]
        credit = Update(
            table=ledger,
            key={"accountId": payload.accountId, "entryId": "BALANCE"},
            expression="ADD balanceCents :amount SET #currency = if_not_exists(#currency, :currency)",
            # An account holds one currency; crediting another is refused, not converted.
            condition="attribute_not_exists(#currency) OR #currency = :currency",
            names={"#currency": "currency"},
            values={":amount": payload.amountCents, ":currency": payload.currency},
        )
        entry = Put(
            table=ledger,
            item={
                "accountId": payload.accountId,
                "entryId": f"PAYMENT#{payload.paymentId}",
                "amountCents": payload.amountCents,
                "currency": payload.currency,
                "idempotencyKey": context.idempotency_key,
                "messageId": context.message_id,
            },
            # The same payment under another idempotency key must not credit twice.
            condition="attribute_not_exists(entryId)",
        )
        result = {"accountId": payload.accountId, "paymentId": payload.paymentId, "creditedCents": payload.amountCents}
        return Effect(result=result, writes=(credit, entry), messages=self._receipt(payload))

    @staticmethod
    def _receipt(payload: PaymentReceived) -> tuple[QueueMessage, ...]:
        if payload.receiptEmail is None:
            return ()
        request = {
            "receiptId": payload.paymentId,  # one receipt per payment
            "paymentId": payload.paymentId,
            "accountId": payload.accountId,
            "amountCents": payload.amountCents,
            "currency": payload.currency,
            "email": payload.receiptEmail,
        }
        # Grouped by account: on a FIFO queue an account's receipts keep their order; on a standard one the account
        # is a fair-queue tenant.
        return (QueueMessage("ConsumerQueue", "ReceiptRequested", request, group_id=payload.accountId),)
