"""A receipt webhook on loopback that answers what the test tells it to."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class WebhookCall:
    idempotency_key: str | None
    body: dict[str, Any]


@dataclass
class Webhook:
    url: str
    calls: list[WebhookCall] = field(default_factory=list)
    # Answers consumed in order; when empty, 200.
    statuses: list[int] = field(default_factory=list)
    delay_s: float = 0.0

    def keys(self) -> list[str | None]:
        return [call.idempotency_key for call in self.calls]


@contextmanager
def running_webhook() -> Iterator[Webhook]:
    webhook = Webhook(url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            with lock:
                webhook.calls.append(WebhookCall(self.headers.get("Idempotency-Key"), body))
                status = webhook.statuses.pop(0) if webhook.statuses else 200
            time.sleep(webhook.delay_s)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (timeouts)
                self.wfile.write(json.dumps({"status": status}).encode())

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    webhook.url = f"http://127.0.0.1:{server.server_address[1]}/receipts"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield webhook
    finally:
        server.shutdown()
        server.server_close()
