"""Put botocore event handlers on every client created while they are installed.

The consumer creates its DynamoDB client inside ``build_consumer()`` and Powertools
inside ``DynamoDBPersistenceLayer``: neither hands its client out before using it. But
botocore copies ``botocore.handlers.BUILTIN_HANDLERS`` into the event system of every
new session, and each client copies its session's, so a handler added there lands on
each client's own event system at creation. moto's in-process stub arrives the same
way. The three systems measured are therefore observed by the very same handlers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from botocore import handlers as botocore_handlers

HandlerSpec = tuple[str, Any] | tuple[str, Any, object]
REGISTER_FIRST = botocore_handlers.REGISTER_FIRST
REGISTER_LAST = botocore_handlers.REGISTER_LAST

_bench_thread = threading.local()


@contextmanager
def on_new_clients(specs: Sequence[HandlerSpec]) -> Iterator[None]:
    """Handlers for clients created inside the block (they keep them after it)."""
    botocore_handlers.BUILTIN_HANDLERS.extend(specs)
    try:
        yield
    finally:
        for spec in specs:
            botocore_handlers.BUILTIN_HANDLERS.remove(spec)


@contextmanager
def unobserved() -> Iterator[None]:
    """Calls the benchmark makes itself (reading item sizes, creating tables) are not counted."""
    previous = getattr(_bench_thread, "unobserved", False)
    _bench_thread.unobserved = True
    try:
        yield
    finally:
        _bench_thread.unobserved = previous


def observed() -> bool:
    return not getattr(_bench_thread, "unobserved", False)
