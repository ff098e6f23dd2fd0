"""ReceiptRequested (lock): POST a receipt to a webhook, then record it in the ledger.

The call leaves DynamoDB, so it runs under a claim, through ``WebhookClient`` (no
redirects, one deadline within the lease, https, the key in ``Idempotency-Key``): a
crash between the call and the commit makes the next delivery call again, and a
downstream that honours the key turns that second call into a no-op, answering the
same delivery id, which the ledger entry keeps in the same commit as the record.
"""

from __future__ import annotations

import json
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, StrictInt

from consumer.api import (
    ID_PATTERN,
    ApiUrl,
    Effect,
    HandlerSettings,
    MessageContext,
    MessageHandler,
    Mode,
    Put,
    SecretArn,
    Settings,
    SigningKey,
    TransientError,
    WebhookClient,
    WebhookResponse,
)


class ReceiptRequested(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    receiptId: str = Field(pattern=ID_PATTERN)
    paymentId: str = Field(pattern=ID_PATTERN)
    accountId: str = Field(pattern=ID_PATTERN)
    amountCents: StrictInt = Field(gt=0, le=10**12)
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    email: str | None = Field(default=None, max_length=254)


class ReceiptSettings(HandlerSettings):
    # Where receipts are posted (RECEIPT_WEBHOOK_URL); while empty, receipts wait in the queue.
    receipt_webhook_url: ApiUrl = ""
    # The whole call's deadline (WEBHOOK_TIMEOUT_MS), never beyond the lease.
    webhook_timeout_ms: PositiveInt = 5_000
    # The Secrets Manager secret (whsec_<base64>) that signs the calls (WEBHOOK_SECRET_ARN): beyond
    # loopback, the client refuses to start without it.
    webhook_secret_arn: SecretArn = ""


class ReceiptRequestedHandler(MessageHandler[ReceiptRequested]):
    event_type: ClassVar[str] = "ReceiptRequested"
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = ReceiptRequested
    tables: ClassVar[tuple[str, ...]] = ("LedgerTable",)
    settings_model: ClassVar[type[HandlerSettings]] = ReceiptSettings

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        own = settings.of(ReceiptSettings)
        self._timeout_ms = own.webhook_timeout_ms
        self._client: WebhookClient | None = None
        if own.receipt_webhook_url:
            key = SigningKey(own.webhook_secret_arn) if own.webhook_secret_arn else None
            self._client = WebhookClient(own.receipt_webhook_url, "RECEIPT_WEBHOOK_URL", signing_key=key)

    def handle(self, payload: ReceiptRequested, context: MessageContext) -> Effect:
        if self._client is None:
            raise TransientError("RECEIPT_WEBHOOK_URL is not set; receipts wait in the queue until it is")
        # Never outlive the lease: past it another worker may already be calling.
        deadline_s = max(0.1, min(self._timeout_ms, context.remaining_ms()) / 1000)
        body = json.dumps(payload.model_dump(mode="json")).encode("utf-8")
        answer = self._client.post(body, context.idempotency_key, deadline_s)
        delivery_id = _delivery_id(answer)
        entry = Put(
            table=self.table_names["LedgerTable"],
            item={
                "accountId": payload.accountId,
                "entryId": f"RECEIPT#{payload.receiptId}",
                "paymentId": payload.paymentId,
                "webhookStatus": answer.status,
                "idempotencyKey": context.idempotency_key,
                **({"deliveryId": delivery_id} if delivery_id is not None else {}),
            },
        )
        result = {"receiptId": payload.receiptId, "webhookStatus": answer.status, "deliveryId": delivery_id}
        return Effect(result=result, writes=(entry,))


def _delivery_id(answer: WebhookResponse) -> str | None:
    """The receipt service's id for this delivery: its JSON answer's ``id``, or None for an empty answer (204).

    A body that is not JSON is dead-lettered (``WebhookAnswerUnreadable``): the service broke its contract, and
    a redrive once it is fixed asks again under the same key, which it answers with the same id."""
    if not answer.body:
        return None
    document = answer.json()
    identifier = document.get("id") if isinstance(document, dict) else None
    return identifier if isinstance(identifier, str) and 0 < len(identifier) <= 256 else None
