"""Per-group order on a FIFO queue: a group's messages must complete in the order sent, the send's own (``send_all``
keeps it; moto's ``SequenceNumber`` is random): docs/local-stack.md, "A FIFO queue, locally"."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from local.poller import BatchReport
from testkit.messages import Outgoing


@dataclass
class CompletionLog:
    """The order in which messages completed, over every poller; pass ``record`` as ``on_batch``."""

    order: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, report: BatchReport) -> None:
        with self._lock:
            self.order.extend(report.completed_ids)

    def positions(self) -> dict[str, int]:
        """Each messageId's first completion (SQS may deliver a message twice)."""
        with self._lock:
            first: dict[str, int] = {}
            for position, message_id in enumerate(self.order):
                first.setdefault(message_id, position)
            return first


def out_of_order(sent: Mapping[str, Outgoing], completed: Mapping[str, int]) -> list[str]:
    """A line per message (``sent``, by messageId in send order) that completed before one sent earlier in its
    group, or never completed (``completed``: messageId -> its completion position)."""
    problems: list[str] = []
    latest: dict[str, tuple[int, str]] = {}
    for message_id, message in sent.items():
        group = message.group_id
        if message_id not in completed:
            problems.append(f"group {group}: {message_id} never completed")
            continue
        position = completed[message_id]
        previous = latest.get(group)
        if previous is not None and position < previous[0]:
            problems.append(f"group {group}: {message_id} completed before {previous[1]}, which was sent earlier")
        if previous is None or position > previous[0]:
            latest[group] = (position, message_id)
    return problems
