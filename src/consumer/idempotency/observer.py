"""What the store tells of its transactions as it sends them: a hook, so that no count is threaded through answers.

The store reports every transaction it sends (shared by several messages or one message's own), every message that
a shared transaction could not settle and that fell back to its own (with the reason), and the transaction conflicts
the conflict policy absorbed. ``Tally`` collects them for one invocation's metrics and summary line.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol


class Observer(Protocol):
    """A hook the store reports to; called from any of a batch's threads."""

    def transaction(self, messages: int) -> None:
        """A write was sent for ``messages`` messages (1: a message's own)."""

    def fell_back(self, reason: str) -> None:
        """A message left a shared transaction for its own, for ``reason`` (one of ``FallBack``'s)."""

    def conflicts_absorbed(self, count: int) -> None:
        """``count`` transaction conflicts were met and retried before a transition's answer."""


class FallBack:
    """Why a message left a shared transaction for its own: the reasons an operator sees, by name."""

    ALONE = "alone"  # nothing else was ready at that moment
    SHARES_AN_ITEM = "shares_an_item"  # its items meet another message's
    NO_ROOM = "no_room"  # no shared transaction had room for it (100 items, 4 MB)
    UNBUILT = "unbuilt"  # its items cannot go in a transaction (a value with no type, two actions on one item...)
    NAMED = "named"  # the shared transaction's cancellation named its items without settling it (a conflict...)
    UNNAMED = "unnamed"  # the shared transaction failed with nothing naming an item (throttled, answer lost...)
    # The reasons that are metrics (a message alone because nothing else was ready fell back from nothing).
    ALL = (SHARES_AN_ITEM, NO_ROOM, UNBUILT, NAMED, UNNAMED)


class Unobserved:
    def transaction(self, messages: int) -> None:
        pass

    def fell_back(self, reason: str) -> None:
        pass

    def conflicts_absorbed(self, count: int) -> None:
        pass


@dataclass(frozen=True)
class Grouping:
    """One invocation's transactions: how many were sent, the messages they carried, the messages that fell back
    to their own (by reason) and the conflicts absorbed."""

    transactions: int = 0
    messages: int = 0
    fell_back: dict[str, int] = field(default_factory=dict)
    conflicts_absorbed: int = 0

    @property
    def messages_per_transaction(self) -> float:
        return self.messages / self.transactions if self.transactions else 0.0

    def log_keys(self) -> dict[str, object]:
        return {
            "transactions": self.transactions,
            "messages_per_transaction": round(self.messages_per_transaction, 2),
            "fell_back": dict(self.fell_back),
            "conflicts_absorbed": self.conflicts_absorbed,
        }


class Tally:
    """An ``Observer`` that counts; ``take`` hands an invocation its figures and starts the next one's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._transactions = 0
        self._messages = 0
        self._fell_back: Counter[str] = Counter()
        self._conflicts = 0

    def transaction(self, messages: int) -> None:
        with self._lock:
            self._transactions += 1
            self._messages += messages

    def fell_back(self, reason: str) -> None:
        with self._lock:
            self._fell_back[reason] += 1

    def conflicts_absorbed(self, count: int) -> None:
        with self._lock:
            self._conflicts += count

    def take(self) -> Grouping:
        with self._lock:
            taken = Grouping(self._transactions, self._messages, dict(self._fell_back), self._conflicts)
            self._transactions = self._messages = self._conflicts = 0
            self._fell_back.clear()
        return taken
