"""Every way a message can fail, and what each means for the batch.

A ``PoisonMessage`` will never succeed however often it is retried: it goes to the
dead-letter queue with its ``ErrorType`` and counts as handled. A ``TransientError``
may succeed later: the message is reported in ``batchItemFailures`` and SQS delivers
it again. A ``ConfigurationError`` is the function's, not a message's: found at start,
it fails the invocation before any message is touched; found while a message runs (a
handler writing a table it did not declare), that message is retried with it as reason.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from consumer.idempotency.writes import Write


class ErrorType(StrEnum):
    """Why the core dead-lettered a message: the ``ErrorType`` attribute of its DLQ copy.

    A closed set: a handler's own reasons are names of its own, given to ``PoisonMessage`` as text."""

    INVALID_JSON = "InvalidJson"
    SCHEMA_VIOLATION = "SchemaViolation"
    UNKNOWN_EVENT_TYPE = "UnknownEventType"
    IDEMPOTENCY_KEY_REUSED = "IdempotencyKeyReused"
    WEBHOOK_REJECTED = "WebhookRejected"
    # A 2xx answer the handler cannot read: a body past the client's bound, or not JSON where JSON was asked for.
    # The call was made; the redrive repeats it under the same Idempotency-Key once the handler is fixed.
    WEBHOOK_ANSWER_UNREADABLE = "WebhookAnswerUnreadable"
    BUSINESS_CONDITION_FAILED = "BusinessConditionFailed"
    BODY_TOO_LARGE = "BodyTooLarge"
    NESTING_TOO_DEEP = "NestingTooDeep"
    # Reading the message itself failed in a way no retry can change (a defect the
    # contract checks did not foresee): dead-lettered with the exception, not retried.
    UNPROCESSABLE_RECORD = "UnprocessableRecord"
    # A handler's guard or effect that DynamoDB can never take as one transaction (over the item limit,
    # two actions on one item): the handler's mistake, the same on every delivery.
    INVALID_HANDLER_TRANSACTION = "InvalidHandlerTransaction"
    # A message the handler emits (``Effect.messages``) that the relay could never send: the handler's mistake.
    UNDECLARED_DESTINATION = "UndeclaredDestination"
    OUTGOING_MESSAGE_TOO_LARGE = "OutgoingMessageTooLarge"
    INVALID_OUTGOING_MESSAGE = "InvalidOutgoingMessage"


# The longest reason a dead letter carries (its ErrorMessage attribute): a reason is written to fit it.
MAX_REASON_CHARS = 1_000


# A handler's own reason type: a name an operator filters dead letters by, as SQS carries it in an attribute.
_OWN_ERROR_TYPE = re.compile(r"[A-Z][A-Za-z0-9]{2,63}")


class PoisonMessage(Exception):
    """The message can never be applied (bad JSON, schema, unknown type, key reuse...).

    ``error_type`` is one of the core's (``ErrorType``) or a name of the handler's own
    (``PoisonMessage("InsufficientStock", "...")``): a capital, then letters and digits, 3 to 64 in all.
    """

    def __init__(self, error_type: ErrorType | str, message: str) -> None:
        if error_type in ErrorType.__members__.values():
            error_type = ErrorType(error_type)
        elif not _OWN_ERROR_TYPE.fullmatch(error_type):
            raise ValueError(
                f"PoisonMessage's error type {error_type[:80]!r} is no name a dead letter can carry:"
                " a capital, then letters and digits, 3 to 64 in all (InsufficientStock)"
            )
        super().__init__(f"{error_type}: {message}")
        self.error_type: ErrorType | str = error_type
        self.message = message


class BusinessConditionFailed(PoisonMessage):
    """A business write's own condition failed, so its transaction was cancelled."""

    def __init__(self, write: Write, *, then: str = "") -> None:
        self.write = write
        super().__init__(
            ErrorType.BUSINESS_CONDITION_FAILED,
            f"{write.reason + ' (' if write.reason else ''}condition of a {type(write).__name__} on {write.table}"
            f" failed: {write.condition}{')' if write.reason else ''}{'; ' + then if then else ''}",
        )


class TransientError(Exception):
    """The message may be applied on a later delivery (throttling, 5xx, timeout...)."""


class TransactionConflict(TransientError):
    """DynamoDB refused the write because another transaction holds one of its items.

    Worth retrying at once, in the same invocation: the other transaction lasts
    milliseconds, so handing the message back to SQS would only add seconds.
    """


class ConfigurationError(Exception):
    """The function's environment is missing or has an invalid setting."""
