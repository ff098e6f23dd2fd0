"""A webhook sink on loopback: records every POST, verifies its signature, answers as a test tells it to.

``verified``: ``standardwebhooks`` accepts its signature with ``secret``. ``GET /requests`` lists what was received
(for ``make run`` users and other processes); ``answer_next`` lets tests make the downstream fail, stall, reject or
answer a document of their own. Unscripted, it answers as an idempotent API does: ``{"status": <status>, "id":
<an id derived from the Idempotency-Key>}``, the same id for every call with one key.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from testkit.processes import LOOPBACK, Lifecycle

_MAX_BODY_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Answer:
    status: int = HTTPStatus.OK
    delay_s: float = 0.0
    trickle_s: float = 0.0
    # Trickle only the body: the status and headers go at once, so only a deadline over the body's read ends the call.
    trickle_body_only: bool = False
    # The JSON document answered (bytes: sent as they are); None answers the default one (the status, the key's id).
    body: Any = None


def answer_id(idempotency_key: str | None) -> str:
    """The id the sink answers for a key: the same for every call with it, as an idempotent API's."""
    return "wh_" + hashlib.sha256((idempotency_key or "").encode("utf-8")).hexdigest()[:20]


@dataclass(frozen=True)
class ReceivedRequest:
    path: str
    idempotency_key: str | None
    body: str
    headers: dict[str, str]
    status: int
    received_at: float
    verified: bool = False

    def json(self) -> Any:
        return json.loads(self.body)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up on a kept-alive connection is no error of the sink's: no traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class WebhookSink(Lifecycle):
    """An HTTP server on 127.0.0.1 in a daemon thread of this process."""

    def __init__(self, default: Answer = Answer()) -> None:
        self.default = default
        self.secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
        self._lock = threading.Lock()
        self._received: list[ReceivedRequest] = []
        self._plan: deque[Answer] = deque()
        self._plans_by_key: dict[str, deque[Answer]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL; POST to any path under it."""
        if self._server is None:
            raise RuntimeError("the webhook sink is not running")
        return f"http://{LOOPBACK}:{self._server.server_address[1]}"

    def received(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._received)

    def unverified(self) -> list[ReceivedRequest]:
        """The calls that were unsigned or whose signature does not verify with ``secret``."""
        return [request for request in self.received() if not request.verified]

    def keys(self) -> list[str | None]:
        return [request.idempotency_key for request in self.received()]

    def answer_next(self, *answers: Answer, key: str | None = None) -> None:
        """Answer the next POSTs (those with this ``Idempotency-Key``, if given) with these, in order."""
        with self._lock:
            plan = self._plan if key is None else self._plans_by_key.setdefault(key, deque())
            plan.extend(answers)

    def clear(self) -> None:
        with self._lock:
            self._received.clear()
            self._plan.clear()
            self._plans_by_key.clear()

    def start(self) -> Self:
        self._server = _Server((LOOPBACK, 0), _handler_for(self))
        self._server.daemon_threads = True
        # shutdown() waits out one poll of serve_forever: the default half second was most of a unit test's time.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="webhook-sink", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server, self._thread = None, None

    def _answer(self, request: ReceivedRequest) -> Answer:
        """The next planned answer (its key's plan first), recorded with the request."""
        with self._lock:
            plan = next((p for p in (self._plans_by_key.get(request.idempotency_key or ""), self._plan) if p), None)
            answer = plan.popleft() if plan else self.default
            self._received.append(replace(request, status=int(answer.status)))
            return answer


def _handler_for(sink: WebhookSink) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = min(int(self.headers.get("Content-Length") or 0), _MAX_BODY_BYTES)
            raw = self.rfile.read(length)
            if len(raw) < length:
                # The caller died mid-request (a crash fault): a receiver acts on no half of a request.
                self.close_connection = True
                return
            headers = dict(self.headers.items())
            verified = False
            with contextlib.suppress(WebhookVerificationError, ValueError):
                Webhook(sink.secret).verify(raw, headers, json_parse=False)
                verified = True
            body = raw.decode("utf-8", "replace")
            key = self.headers.get("Idempotency-Key")
            answer = sink._answer(ReceivedRequest(self.path, key, body, headers, 0, time.time(), verified))
            if answer.delay_s:
                time.sleep(answer.delay_s)
            document = {"status": int(answer.status), "id": answer_id(key)} if answer.body is None else answer.body
            self._reply(answer.status, document, answer.trickle_s, answer.trickle_body_only)

        def do_GET(self) -> None:
            if self.path.rstrip("/") != "/requests":
                self._reply(HTTPStatus.NOT_FOUND, {"error": "GET /requests lists what was received"})
                return
            self._reply(HTTPStatus.OK, [asdict(request) for request in sink.received()])

        def _reply(self, status: int, document: Any, trickle_s: float = 0.0, body_only: bool = False) -> None:
            payload = document if isinstance(document, bytes) else json.dumps(document).encode("utf-8")
            # The caller may have given up (a delay past its timeout): nothing to tell it then.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                if trickle_s:
                    head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
                    if body_only:
                        self.wfile.write(head)
                        self.wfile.flush()
                    for byte in payload if body_only else head + payload:
                        self.wfile.write(bytes([byte]))
                        time.sleep(trickle_s)
                    return
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Location", "/requests")  # where a 3xx would send the caller
                self.end_headers()
                self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: requests are recorded, not printed over the pollers' output."""

    return Handler
