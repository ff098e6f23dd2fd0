"""The reservation token a guard marks its hold with: the same for every delivery of one message, and only for it."""

from __future__ import annotations

from consumer.handler import MessageContext
from consumer.idempotency.record import reservation_token


def test_every_delivery_of_one_message_gets_the_same_token() -> None:
    assert reservation_token("Charge#k-1", "sha256:a") == reservation_token("Charge#k-1", "sha256:a")


def test_another_event_type_key_or_content_gets_another_token() -> None:
    tokens = {
        reservation_token("Charge#k-1", "sha256:a"),
        reservation_token("Refund#k-1", "sha256:a"),
        reservation_token("Charge#k-2", "sha256:a"),
        reservation_token("Charge#k-1", "sha256:b"),
    }
    assert len(tokens) == 4


def test_the_token_does_not_carry_the_key() -> None:
    assert "card-4242" not in reservation_token("Charge#card-4242", "sha256:a")


def test_a_context_the_core_did_not_build_gets_a_token_no_other_context_has() -> None:
    def context() -> MessageContext:
        return MessageContext("m", "k-1", 1, lambda: 1_000)

    assert context().reservation_token != context().reservation_token
