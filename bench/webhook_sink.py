"""The receipt webhook: a loopback HTTP server that accepts every POST with 200."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Accept(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: one line per request would drown the benchmark's output."""


@contextmanager
def webhook_sink() -> Iterator[str]:
    """Yield the sink's URL; the server stops when the block ends, whatever happens in it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="webhook-sink", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/receipts"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
