"""The real consumer with the old engine's lock group: a negative control for "no call repeated that alone would not".

The old engine committed a wave's lock messages together once its slowest handler had returned, so a quick message
whose lease ran out meanwhile was taken over by its redelivery and called out again, where alone it commits at once
and its redelivery is a duplicate. Here every lock-mode commit waits until no lock-mode handler of the batch still
runs (the runtime runs one invocation at a time); the runtime builds its consumer with this factory, since a patch in
the test's process cannot reach it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chaos.faults import Handle
from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.handler import Effect, MessageContext, MessageHandler, Mode
from consumer.idempotency.commit import Commit
from consumer.idempotency.store import IdempotencyStore


def committed_after_the_slowest(
    settings: Settings, session: Any, *, clock: Callable[[], float], handlers: Mapping[str, MessageHandler[Any]]
) -> BatchRunner:
    running = [0]
    changed = threading.Condition()

    def counted(handle: Handle) -> Handle:
        def handle_counted(payload: Any, context: MessageContext) -> Effect:
            with changed:
                running[0] += 1
            try:
                return handle(payload, context)
            finally:
                with changed:
                    running[0] -= 1
                    changed.notify_all()

        return handle_counted

    for handler in handlers.values():
        if handler.mode is Mode.LOCK:
            handler.handle = counted(handler.handle)  # type: ignore[method-assign,assignment]
    run_all = IdempotencyStore.run_all

    def commit_after_the_slowest(store: IdempotencyStore, transitions: Sequence[Any], *args: Any) -> Any:
        if any(isinstance(transition, Commit) for transition in transitions):
            with changed:
                changed.wait_for(lambda: running[0] == 0)
        return run_all(store, transitions, *args)

    IdempotencyStore.run_all = commit_after_the_slowest  # type: ignore[method-assign,assignment]
    return wire(settings, session, clock, handlers=handlers)
