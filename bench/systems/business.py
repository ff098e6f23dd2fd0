"""The business logic the baselines run: the consumer's handlers, their writes one call each.

A Powertools or seed-pattern user keeps the idempotency record apart from the business
effect: the ledger is credited by its own ``UpdateItem`` and ``PutItem`` calls, not in
a transaction with the record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from consumer.config import Settings
from consumer.envelope import Message, parse_message
from consumer.handlers import MessageContext, MessageHandler, build_handlers
from consumer.idempotency.writes import Write


@dataclass(frozen=True)
class ParsedRecord:
    message: Message
    handler: MessageHandler
    payload: Any


class LedgerBusiness:
    def __init__(self, client: Any, settings: Settings) -> None:
        self._client = client
        self._handlers = build_handlers(settings)
        self._calls: dict[str, Callable[..., Any]] = {
            "Put": client.put_item,
            "Update": client.update_item,
            "Delete": client.delete_item,
        }

    def parse(self, record: dict[str, Any]) -> ParsedRecord:
        message = parse_message(record)
        handler = self._handlers[message.event_type]
        return ParsedRecord(message, handler, handler.payload_model.model_validate(message.payload))

    def apply(self, parsed: ParsedRecord, remaining_ms: Callable[[], int]) -> Any:
        """Run the handler, then its writes in order, one DynamoDB call each; return its result."""
        context = MessageContext(
            message_id=parsed.message.message_id,
            idempotency_key=parsed.message.idempotency_key,
            receive_count=parsed.message.receive_count,
            remaining_ms=remaining_ms,
        )
        effect = parsed.handler.handle(parsed.payload, context)
        for write in effect.writes:
            self._write(write)
        return effect.result

    def _write(self, write: Write) -> None:
        ((action, request),) = write.to_transact_item().items()
        self._calls[action](**request)
