"""A loopback HTTP proxy in front of DynamoDB Local that raises transaction conflicts as DynamoDB does.

One proxy serves every process of the local stack (pollers, function runtimes, tests), so
transactions from different processes contend as they would on DynamoDB. The rules are in
``local.conflict_rules``. A ``TransactWriteItems`` holds its items for a prepare time and
then while DynamoDB Local applies it; requests on other items never wait for it (one thread
and one upstream connection per client connection, the rule table locked only to look up).

Everything that is not a conflict is forwarded as it is: body, status, headers (DynamoDB
Local's ``x-amz-crc32`` included), errors. Only hop-by-hop headers are rewritten.

A latency can be injected on every call, half on the way in and half on the way out, so a
transaction's hold covers its time in DynamoDB, not the network's.

Run as a child of the local stack (``local.conflict_emulation``)::

    python -m local.conflict_proxy --upstream http://127.0.0.1:P --port Q [--hold-ms 5] [--latency-ms 0]

It binds 127.0.0.1 only and exits when its stdin closes (the local stack's lifeline).
``GET /conflict-proxy/stats`` answers what it has seen (transactions, cancellations, refused
writes): DynamoDB has no such path, so no request of a client is ever taken for it.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import sys
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from local.conflict_rules import (
    SINGLE_ITEM_WRITES,
    TRANSACT_WRITE,
    ItemHolds,
    ItemKey,
    item_key,
    transaction_cancelled,
    transaction_conflict,
    transaction_items,
)
from local.processes import LOOPBACK

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
)
_TABLE_CHANGES = frozenset({"CreateTable", "DeleteTable"})
_JSON = "application/x-amz-json-1.0"
_UPSTREAM_TIMEOUT_S = 60.0
STATS_PATH = "/conflict-proxy/stats"

Reply = tuple[int, str, list[tuple[str, str]], bytes]


class ConflictProxyServer(ThreadingHTTPServer):
    """The proxy on ``127.0.0.1:port``; ``emulate=False`` forwards everything (latency still applies)."""

    daemon_threads = True

    def __init__(self, port: int, upstream: str, *, hold_s: float, latency_s: float, emulate: bool = True) -> None:
        if hold_s < 0:
            raise ValueError(f"the transaction hold must be >= 0 seconds, got {hold_s}")
        if latency_s < 0:
            raise ValueError(f"the injected latency must be >= 0 seconds, got {latency_s}")
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the upstream must be http://host:port, got {upstream!r}")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.hold_s, self.latency_s, self.emulate = hold_s, latency_s, emulate
        self.holds = ItemHolds()
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        self._key_names: dict[str, tuple[str, ...]] = {}
        self._key_names_lock = threading.Lock()
        self._connections = threading.local()
        super().__init__((LOOPBACK, port), _ProxyHandler)

    def forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> Reply:
        """One exchange with DynamoDB Local on this thread's connection, reopened once if it went stale."""
        for attempt in (1, 2):
            connection = self._connection()
            reused = getattr(self._connections, "used", False)
            try:
                connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    connection.putheader(name, value)
                connection.endheaders(body)
                response = connection.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                connection.close()
                self._connections.connection = None
                # Only an idle kept-alive connection closed by the server is retried, as urllib3
                # does; a fresh connection failing is a real fault and reaches the client.
                if attempt == 2 or not reused:
                    raise
                continue
            self._connections.used = True
            if response.will_close:
                connection.close()
                self._connections.connection = None
            return response.status, response.reason, response.getheaders(), data
        raise AssertionError("unreachable")

    def key_names(self, table: str, authorization: str | None, target_prefix: str) -> tuple[str, ...] | None:
        """The table's key attribute names (DescribeTable once, cached until the table changes)."""
        with self._key_names_lock:
            known = self._key_names.get(table)
        if known is not None:
            return known
        headers = [("X-Amz-Target", f"{target_prefix}DescribeTable"), ("Content-Type", _JSON)]
        if authorization is not None:
            # DynamoDB Local wants credentials present; it does not check the signature.
            headers.append(("Authorization", authorization))
        body = json.dumps({"TableName": table}).encode()
        headers += [("Host", f"{self.upstream_host}:{self.upstream_port}"), ("Content-Length", str(len(body)))]
        status, _, _, data = self.forward("POST", "/", headers, body)
        if status != 200:
            return None
        names = tuple(key["AttributeName"] for key in json.loads(data)["Table"]["KeySchema"])
        with self._key_names_lock:
            self._key_names[table] = names
        return names

    def count(self, event: str) -> None:
        with self._counts_lock:
            self._counts[event] += 1

    def counts(self) -> dict[str, int]:
        with self._counts_lock:
            return dict(self._counts)

    def forget_table(self, table: Any) -> None:
        with self._key_names_lock:
            self._key_names.pop(table, None)

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._connections, "connection", None)
        if connection is None:
            connection = _NoDelayConnection(self.upstream_host, self.upstream_port, timeout=_UPSTREAM_TIMEOUT_S)
            self._connections.connection = connection
            self._connections.used = False
        return connection


class _NoDelayConnection(http.client.HTTPConnection):
    """An upstream connection that sends each request at once (see ``_ProxyHandler.setup``)."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ConflictProxyServer

    def do_POST(self) -> None:
        self._proxy()

    def do_GET(self) -> None:
        if self.path == STATS_PATH:
            body = json.dumps(self.server.counts()).encode()
            self._reply(200, "OK", [("Content-Type", "application/json")], body)
            return
        self._proxy()

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: a load run makes thousands of requests."""

    def _proxy(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = [(name, value) for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP]
        if body or self.command == "POST":
            headers.append(("Content-Length", str(len(body))))
        target = self.headers.get("X-Amz-Target") or ""
        prefix, _, operation = target.rpartition(".")
        self._wait_half_latency()
        reply = self._answer(operation, f"{prefix}." if prefix else "", headers, body)
        self._wait_half_latency()
        self._reply(*reply)

    def _answer(self, operation: str, target_prefix: str, headers: list[tuple[str, str]], body: bytes) -> Reply:
        server = self.server
        request = _json_object(body) if server.emulate else None
        if request is None:
            return server.forward(self.command, self.path, headers, body)

        def key_names(table: str) -> tuple[str, ...] | None:
            return server.key_names(table, self.headers.get("Authorization"), target_prefix)

        if operation == TRANSACT_WRITE:
            server.count("transactions")
            return self._transaction(transaction_items(request, key_names), headers, body)
        if operation in SINGLE_ITEM_WRITES and server.holds.held(item_key(request, key_names)):
            server.count("writes_refused")
            return _error(transaction_conflict())
        reply = server.forward(self.command, self.path, headers, body)
        if operation in _TABLE_CHANGES:
            server.forget_table(request.get("TableName"))
        return reply

    def _transaction(self, items: Sequence[ItemKey | None], headers: list[tuple[str, str]], body: bytes) -> Reply:
        server = self.server
        token, conflicting = server.holds.hold(items)
        if token is None:
            server.count("transactions_cancelled")
            return _error(transaction_cancelled(len(items), conflicting))
        try:
            if server.hold_s:
                time.sleep(server.hold_s)
            return server.forward(self.command, self.path, headers, body)
        finally:
            server.holds.release(items, token)

    def _wait_half_latency(self) -> None:
        if self.server.latency_s:
            time.sleep(self.server.latency_s / 2)

    def setup(self) -> None:
        super().setup()
        # Small answers go out at once: Nagle's algorithm would hold them for the client's delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _reply(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        # Headers and body in one write, for the same reason.
        self._headers_buffer.append(b"\r\n" + body)  # type: ignore[attr-defined]
        self.flush_headers()


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None


def _error(document: dict[str, Any]) -> Reply:
    body = json.dumps(document, separators=(",", ":")).encode()
    headers = [
        ("x-amzn-RequestId", str(uuid.uuid4())),
        ("Content-Type", _JSON),
        # botocore checks this checksum on every DynamoDB response that carries it.
        ("x-amz-crc32", str(zlib.crc32(body))),
    ]
    return 400, "Bad Request", headers, body


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m local.conflict_proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="DynamoDB Local's endpoint, http://127.0.0.1:PORT")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on, on 127.0.0.1")
    parser.add_argument("--hold-ms", type=float, default=5.0, help="a transaction's prepare time (default 5)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="round-trip latency added to every call")
    parser.add_argument("--no-conflicts", action="store_true", help="forward everything, emulate nothing")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _arguments(argv)
    try:
        server = ConflictProxyServer(
            arguments.port,
            arguments.upstream,
            hold_s=arguments.hold_ms / 1000,
            latency_s=arguments.latency_ms / 1000,
            emulate=not arguments.no_conflicts,
        )
    except (ValueError, OSError) as error:
        print(f"conflict proxy: {error}", file=sys.stderr)
        return 2
    serving = threading.Thread(target=server.serve_forever, name="conflict-proxy", daemon=True)
    serving.start()
    # The parent holds the other end of stdin: when it closes (the parent stopped or died), stop.
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
