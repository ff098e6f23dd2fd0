"""Count DynamoDB calls, add network latency to each HTTP request, keep moto to one request at a time.

- ``before-call`` fires once per API call, whatever botocore's retries do: that is the
  round-trip count a reader of the code expects (1 for a transaction, 1 for a put).
- ``before-send`` fires once per HTTP request, so the latency is paid per attempt, as on
  a network. botocore emits it with ``emit`` (not ``emit_until_response``): every
  handler runs even after moto's stub has produced the response, so the sleep here
  runs for moto in-process as it does for a real endpoint. It is registered first, so
  the sleep comes before the stub answers.
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
from typing import Any

from bench.hooks import REGISTER_FIRST, REGISTER_LAST, HandlerSpec, observed

_DYNAMODB_SEND = "before-send.dynamodb."


class RoundTripProbe:
    def __init__(self) -> None:
        self.latency_s = 0.0
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
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

    def calls(self) -> int:
        with self._lock:
            return sum(self._calls.values())

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
        if observed() and self.latency_s > 0:
            time.sleep(self.latency_s)
        self._server.acquire()
        self._in_server.held = True

    def _on_send_end(self, **_: Any) -> None:
        if not getattr(self._in_server, "held", False):
            return  # needs-retry after the last handler already released this attempt's hold
        self._in_server.held = False
        self._server.release()
