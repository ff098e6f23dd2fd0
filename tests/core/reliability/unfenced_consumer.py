"""The real consumer with its store's fencing condition made vacuous: a negative control.

Chaos runs the consumer in Lambda's runtime, a process of its own, so the harness cannot
patch the store from the test: the runtime builds its consumer with this factory instead
(``ChaosConfig``'s consumer), which patches the store in that process before wiring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.handler import MessageHandler
from consumer.idempotency import calls as store_module
from consumer.idempotency import release as release_module

# The store's fencing condition made to hold whoever owns the record and whatever its status: a zombie's write
# lands whether the new owner is still at work or has committed, so the run shows it by construction, not by
# the zombie resuming before the new owner's commit. (The expression keeps every name and value it is sent.)
UNFENCED = "(#owner = :owner OR #owner <> :owner) AND (#status = :in_progress OR #status <> :in_progress)"


def unfenced_wire(
    settings: Settings, session: Any, *, clock: Callable[[], float], handlers: Mapping[str, MessageHandler[Any]]
) -> BatchRunner:
    # Both of a zombie's writes: its commit, and the release that follows a commit refused (half the zombies), each
    # module's own name for the condition. With the release left fenced, a run whose every zombie drew the refusal
    # showed nothing (five zombies: one run in 32).
    store_module.OWNED = UNFENCED
    release_module.OWNED = UNFENCED
    return wire(settings, session, clock, handlers=handlers)
