"""A transition of one message's record: what it writes, alone or in a transaction it shares with others.

Every transition (claim, apply, commit, release) is one of these. It builds its own items (its record first, then
its business writes), gives its answer when a shared transaction landed with them, reads its own part of a shared
transaction's cancellation, and runs alone (its own write, its conflicts absorbed) whatever a shared transaction
could not settle. The store decides which way it goes; the message's answer is the same either way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from consumer.idempotency.answers import RecordRefused, Refused
from consumer.idempotency.calls import Table
from consumer.idempotency.writes import Write

A = TypeVar("A")


class Transition(ABC, Generic[A]):
    @abstractmethod
    def items(self, table: Table, now_ms: int) -> list[dict[str, Any]]:
        """Its transaction items at ``now_ms``: the record's first, then ``writes()``'s."""

    @abstractmethod
    def writes(self) -> Sequence[Write]:
        """The business writes after the record, whose cancellation reasons it reads."""

    @abstractmethod
    def landed(self, items: list[dict[str, Any]]) -> A:
        """Its answer when a shared transaction landed with ``items``."""

    @abstractmethod
    def read(self, cancelled: RecordRefused | Refused) -> A | None:
        """Its answer from what its items' cancellation reasons said; None when only ``alone`` can tell."""

    @abstractmethod
    def alone(self, table: Table, remaining_ms: Callable[[], int] | None) -> A:
        """Its own write, conflicts absorbed while ``remaining_ms`` allows: the answer, or what it raises."""
