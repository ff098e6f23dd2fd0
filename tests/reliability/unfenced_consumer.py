"""The real consumer with its store's fencing condition made vacuous: a negative control.

Chaos runs the consumer in Lambda's runtime, a process of its own, so the harness cannot
patch the store from the test: the runtime builds its consumer with this factory instead
(``ChaosConfig``'s consumer), which patches the store in that process before wiring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.idempotency import store as store_module

# The owner check of the store's fencing condition, made to hold for every owner.
UNFENCED = "(#owner = :owner OR #owner <> :owner) AND #status = :in_progress"


def unfenced_wire(settings: Settings, session: Any, *, clock: Callable[[], float]) -> BatchRunner:
    store_module._OWNED = UNFENCED
    return wire(settings, session, clock)
