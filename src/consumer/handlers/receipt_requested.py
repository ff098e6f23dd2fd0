"""ReceiptRequested (lock): POST a receipt to a webhook, then record it in the ledger.

The call leaves DynamoDB, so it runs under a claim. It carries the
``Idempotency-Key`` header: a crash between the call and the commit makes the next
delivery call again, and a downstream that honours the key turns that second call
into a no-op. 4xx (but 408 and 429) is poison; 5xx, 408, 429 and timeouts are retried.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from consumer.errors import ConfigurationError, ErrorType, PoisonMessage, TransientError
from consumer.handlers.base import Effect, MessageContext, MessageHandler, Mode
from consumer.idempotency.writes import Put

_ID = r"^[A-Za-z0-9_.:-]{1,128}$"
_RETRYABLE_4XX = frozenset({408, 425, 429})


class ReceiptRequested(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    receiptId: str = Field(pattern=_ID)
    paymentId: str = Field(pattern=_ID)
    accountId: str = Field(pattern=_ID)
    amountCents: StrictInt = Field(gt=0, le=10**12)
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    email: str | None = Field(default=None, max_length=254)


class ReceiptRequestedHandler(MessageHandler[ReceiptRequested]):
    event_type: ClassVar[str] = "ReceiptRequested"
    mode: ClassVar[Mode] = Mode.LOCK
    payload_model: ClassVar[type[BaseModel]] = ReceiptRequested

    def __init__(self, ledger_table: str, webhook_url: str, timeout_ms: int) -> None:
        if webhook_url and not webhook_url.startswith(("http://", "https://")):
            raise ConfigurationError(f"RECEIPT_WEBHOOK_URL must be an http(s) URL, got {webhook_url!r}")
        self._table = ledger_table
        self._url = webhook_url
        self._timeout_ms = timeout_ms

    def handle(self, payload: ReceiptRequested, context: MessageContext) -> Effect:
        if not self._url:
            raise TransientError("RECEIPT_WEBHOOK_URL is not set; receipts wait in the queue until it is")
        # Never outlive the lease: past it another worker may already be calling.
        timeout_s = max(0.1, min(self._timeout_ms, context.remaining_ms()) / 1000)
        status = self._post(payload, context.idempotency_key, timeout_s)
        entry = Put(
            table=self._table,
            item={
                "accountId": payload.accountId,
                "entryId": f"RECEIPT#{payload.receiptId}",
                "paymentId": payload.paymentId,
                "webhookStatus": status,
                "idempotencyKey": context.idempotency_key,
            },
        )
        return Effect(result={"receiptId": payload.receiptId, "webhookStatus": status}, writes=(entry,))

    def _post(self, payload: ReceiptRequested, idempotency_key: str, timeout_s: float) -> int:
        request = urllib.request.Request(  # noqa: S310 (scheme checked in __init__)
            self._url,
            data=json.dumps(payload.model_dump(mode="json")).encode("utf-8"),
            headers={"Content-Type": "application/json", "Idempotency-Key": idempotency_key},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (scheme checked in __init__)
                return int(response.status)
        except urllib.error.HTTPError as error:
            detail = error.read(200).decode("utf-8", "replace")
            if 400 <= error.code < 500 and error.code not in _RETRYABLE_4XX:
                raise PoisonMessage(ErrorType.WEBHOOK_REJECTED, f"HTTP {error.code}: {detail}") from None
            raise TransientError(f"webhook answered HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as error:
            raise TransientError(f"webhook unreachable: {error}") from None
