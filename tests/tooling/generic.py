"""Messages of every registered handler for the out-of-process tests, and what any handler's outcome must be.

Each handler's payload is drawn from its model (``testkit.payloads``), its seed items written first; a test is
parametrized by handler so its id names the event type. What is checked holds for any handler: a message ends
applied once (its record completed) or in the dead-letter queue with a reason, and a resend changes no item of the
declared tables. An example's own checks (a ledger's balance, a webhook's calls) live in ``tests/app/``.
"""

from __future__ import annotations

import time
from typing import Any

from consumer.envelope import payload_hash
from consumer.handler import declared_tables
from consumer.idempotency.record import Attr, Status
from local.smoke import Items, table_items
from local.stack import DeployedStack
from testkit import dead_letters, messages, payloads

HANDLERS = payloads.registered()
IDS = [handler.event_type for handler in HANDLERS]
Handler = payloads.Handler


def tables(stack: DeployedStack) -> dict[str, str]:
    """The declared tables' names on this stack, by logical id."""
    return {table: stack.table_name(table) for table in declared_tables(HANDLERS)}


def declared_items(stack: DeployedStack) -> Items:
    return table_items(stack.servers.client("dynamodb"), tables(stack))


def drawn(stack: DeployedStack, handler: Handler, key: str, seed: int = 0, index: int = 0) -> messages.Outgoing:
    """A message of this handler (the ``index``-th draw for ``seed``), its seed items written to the stack first."""
    payload = payloads.valid_payloads(handler, index + 1, seed)[index]
    items = payloads.seed_items(handler, payload)
    payloads.put_seeds(stack.servers.client("dynamodb"), tables(stack), items)
    return messages.drawn(handler, key, payload)


def record(stack: DeployedStack, event_type: str | None, key: str | None) -> dict[str, Any] | None:
    """The idempotency record of a key (the consumer's id: event type and key), read consistently."""
    found = stack.servers.client("dynamodb").get_item(
        TableName=stack.table_name("IdempotencyTable"), Key={Attr.ID: {"S": f"{event_type}#{key}"}}, ConsistentRead=True
    )
    item: dict[str, Any] | None = found.get("Item")
    return item


def letters(stack: DeployedStack) -> list[dead_letters.DeadLetter]:
    return dead_letters.peek(stack.servers.client("sqs"), stack.dead_letter_queue.url)


def outcome(stack: DeployedStack, message: messages.Outgoing) -> str | None:
    """``applied`` (its record completed), ``dead-lettered: <reason>``, or ``None`` while neither."""
    found = record(stack, message.event_type, message.key)
    if found is not None and found[Attr.STATUS]["S"] == Status.COMPLETED:
        return "applied"
    parked = [letter for letter in letters(stack) if letter.body == message.body and letter.error_type]
    return f"dead-lettered: {parked[0].reason}" if parked else None


def hold(stack: DeployedStack, message: messages.Outgoing, for_ms: int) -> None:
    """The message's key claimed by another worker whose lease runs ``for_ms`` more (a crashed one's)."""
    now = time.time()
    stack.servers.client("dynamodb").put_item(
        TableName=stack.table_name("IdempotencyTable"),
        Item={
            Attr.ID: {"S": f"{message.event_type}#{message.key}"},
            Attr.STATUS: {"S": Status.IN_PROGRESS},
            Attr.EXPIRES_AT: {"N": str(int(now) + 3600)},
            Attr.LEASE_EXPIRES_AT: {"N": str(int(now * 1000) + for_ms)},
            Attr.OWNER_TOKEN: {"S": "another-worker"},
            Attr.PAYLOAD_HASH: {"S": payload_hash(message.payload or {})},
            Attr.ATTEMPTS: {"N": "1"},
        },
    )
