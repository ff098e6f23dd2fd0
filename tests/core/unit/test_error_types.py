"""A handler's own reason type: dead-lettered under its name, no core file edited; the core's own stay a closed set."""

from __future__ import annotations

from typing import Any

import pytest

from consumer.api import Effect, MessageContext, PoisonMessage
from consumer.errors import ErrorType
from testkit.lambda_sqs import sqs_record
from tests.core.handlers import TALLY_EVENT, TallyAdded, TallyHandler, tally_body
from tests.core.unit.conftest import Clock, Consumer, make_consumer, total


class StockHandler(TallyHandler):
    """A tally that refuses what its business cannot do, under a reason type of its own."""

    def handle(self, payload: TallyAdded, context: MessageContext) -> Effect:
        if payload.amount > 5_000:
            raise PoisonMessage("InsufficientStock", f"{payload.amount} asked, 5000 in stock")
        return super().handle(payload, context)


@pytest.fixture
def stock(dynamodb: Any, sqs: Any, clock: Clock) -> Consumer:
    consumer = make_consumer(dynamodb, sqs, clock)
    return make_consumer(
        dynamodb, sqs, clock, dlq_url=consumer.dlq_url, extra_handlers={TALLY_EVENT: StockHandler(consumer.settings)}
    )


def test_a_handlers_own_reason_type_is_the_dead_letters_error_type(stock: Consumer) -> None:
    response = stock.process([sqs_record("big", tally_body("e-1", amount=9_000)), sqs_record("ok", tally_body("e-2"))])

    assert response == {"batchItemFailures": []}
    (letter,) = stock.dead_letters()
    assert (letter.original_message_id, letter.error_type) == ("big", "InsufficientStock")
    assert letter.error_message == "9000 asked, 5000 in stock"
    assert total(stock.dynamodb, "t-1") == 1250


@pytest.mark.parametrize("name", ["insufficientStock", "Is", "Insufficient Stock", "Stock#1", "X" * 65, ""])
def test_a_reason_type_a_dead_letter_cannot_carry_is_refused_where_it_is_raised(name: str) -> None:
    with pytest.raises(ValueError, match="no name a dead letter can carry"):
        PoisonMessage(name, "why")


def test_a_core_reason_type_given_as_text_is_the_core_one() -> None:
    assert PoisonMessage("SchemaViolation", "why").error_type is ErrorType.SCHEMA_VIOLATION
