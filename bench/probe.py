"""Count DynamoDB calls, add network latency to each HTTP request, time moto's own work.

- ``before-call`` fires once per API call, whatever botocore's retries do: that is the
  round-trip count a reader of the code expects (1 for a transaction, 1 for a put).
- ``before-send`` fires once per HTTP request, so the latency is paid per attempt, as on
  a network. botocore emits it with ``emit`` (not ``emit_until_response``): every
  handler runs even after moto's stub has produced the response, so the sleep here
  runs for moto in-process as it does for a real endpoint. It is registered first, so
  the sleep comes before the stub answers, and a second handler registered last closes
  a CPU stopwatch around moto's stub: that CPU is the simulated server's, not the
  function's, and is subtracted from the CPU per record.
- moto in-process is not thread-safe (its ``TransactWriteItems`` deep-copies the tables
  while other threads write them, and fails with "dictionary changed size during
  iteration"), so the same two handlers hold a lock around its stub: the simulated
  server answers one request at a time, while the latency sleeps, outside the lock,
  overlap as network waits do. For a real endpoint the lock covers no I/O (botocore
  sends the request after ``before-send``). ``needs-retry``, emitted after every
  attempt, releases the lock if the stub raised before the last handler could.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bench.hooks import REGISTER_FIRST, REGISTER_LAST, HandlerSpec, observed

_DYNAMODB_SEND = "before-send.dynamodb."


@dataclass(frozen=True)
class ProbeReading:
    calls: int
    # CPU spent answering requests in process (moto's stub); about 0 for a real endpoint.
    server_cpu_s: float


class RoundTripProbe:
    def __init__(self) -> None:
        self.latency_s = 0.0
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._server_cpu_s = 0.0
        self._server = threading.Lock()
        self._in_server = threading.local()

    def handler_specs(self) -> list[HandlerSpec]:
        return [
            ("before-call.dynamodb", self._on_call),
            # On moto's own node, "before-send": botocore runs the handlers of a more
            # specific name ("before-send.dynamodb") before all of a broader name's, so
            # only there do first and last bracket moto's stub.
            ("before-send", self._on_send_start, REGISTER_FIRST),
            ("before-send", self._on_send_end, REGISTER_LAST),
            ("needs-retry.dynamodb", self._on_send_end),
        ]

    def reading(self) -> ProbeReading:
        with self._lock:
            return ProbeReading(sum(self._calls.values()), self._server_cpu_s)

    def calls_by_operation(self) -> dict[str, int]:
        with self._lock:
            return dict(self._calls)

    def _on_call(self, model: Any, **_: Any) -> None:
        if observed():
            with self._lock:
                self._calls[model.name] += 1

    def _on_send_start(self, event_name: str, **_: Any) -> None:
        if not event_name.startswith(_DYNAMODB_SEND):
            return
        counted = observed()
        if counted and self.latency_s > 0:
            time.sleep(self.latency_s)
        self._server.acquire()
        self._in_server.counted = counted
        self._in_server.cpu_s = time.thread_time()

    def _on_send_end(self, **_: Any) -> None:
        started = getattr(self._in_server, "cpu_s", None)
        if started is None:
            return  # needs-retry after the last handler already closed this attempt
        elapsed = time.thread_time() - started
        self._in_server.cpu_s = None
        self._server.release()
        if self._in_server.counted:
            with self._lock:
                self._server_cpu_s += elapsed
