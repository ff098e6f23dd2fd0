"""botocore handlers on every new client: count DynamoDB calls, add network latency, keep moto to one request at a time.

The systems create their clients inside their own code and never hand them out. But botocore
copies ``botocore.handlers.BUILTIN_HANDLERS`` into every new session's event system, and each
client copies its session's: a handler added there lands on every client created meanwhile,
moto's in-process stub arrives the same way, and the three systems are observed alike.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from botocore import handlers as botocore_handlers

HandlerSpec = tuple[str, Any] | tuple[str, Any, object]

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


class RoundTripProbe:
    """Counts calls, sleeps ``latency_s`` per HTTP request, serialises moto's stub.

    ``before-call`` fires once per API call, whatever the retries: the round trips a reader of the code expects.
    ``before-send`` fires once per HTTP request, so the latency is paid per attempt, as on a network; botocore emits it
    with ``emit``, not ``emit_until_response``, so the sleep (registered first, before the stub answers) runs for moto
    in-process too. moto in-process is not thread-safe (its ``TransactWriteItems`` deep-copies the tables while other
    threads write them), so the same handlers hold a lock around its stub, the sleeps outside it overlapping as network
    waits do; for a real endpoint the lock covers no I/O. ``needs-retry``, emitted after every attempt, releases it if
    the stub raised first.
    """

    def __init__(self) -> None:
        self.latency_s = 0.0
        self.calls = 0
        # botocore's own CPU in its DynamoDB calls: each call's thread time from its first event to its last (sleeps
        # use none), serialising, signing, sending and parsing; the floor a system's CPU is read against.
        self.botocore_cpu_s = 0.0
        self.server_s = 0.0  # each request's wall time from its send to its answer, no latency: DynamoDB Local's own
        self._lock = threading.Lock()
        self._server = threading.Lock()
        self._thread = threading.local()

    def handler_specs(self) -> list[HandlerSpec]:
        return [
            ("before-parameter-build.dynamodb", self._on_start),
            ("after-call.dynamodb", self._on_end),
            ("before-call.dynamodb", self._on_call),
            # On moto's own node, "before-send": botocore runs the handlers of a more specific name
            # ("before-send.dynamodb") before all of a broader name's: only there do first and last bracket moto's stub.
            ("before-send", self._on_send_start, botocore_handlers.REGISTER_FIRST),
            ("before-send", self._on_send_end, botocore_handlers.REGISTER_LAST),
            ("needs-retry.dynamodb", self._on_send_end),
        ]

    def _on_start(self, **_: Any) -> None:
        self._thread.cpu_s = time.thread_time()

    def _on_end(self, **_: Any) -> None:
        with self._lock:
            self.botocore_cpu_s += time.thread_time() - self._thread.cpu_s

    def _on_call(self, **_: Any) -> None:
        if observed():
            with self._lock:
                self.calls += 1

    def _on_send_start(self, event_name: str, **_: Any) -> None:
        if not event_name.startswith("before-send.dynamodb."):
            return
        if observed() and self.latency_s > 0:
            time.sleep(self.latency_s)
        self._server.acquire()
        self._thread.held = True

    def _on_send_end(self, event_name: str, **_: Any) -> None:
        if (sent := self._thread.__dict__.pop("sent", None)) is not None and event_name.startswith("needs-retry"):
            with self._lock:
                self.server_s += time.perf_counter() - sent
        if not getattr(self._thread, "held", False):
            return  # needs-retry after the last handler already released this attempt's hold
        self._thread.held, self._thread.sent = False, time.perf_counter()
        self._server.release()
