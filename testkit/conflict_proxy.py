"""A loopback HTTP proxy in front of DynamoDB Local that raises transaction conflicts as DynamoDB does.

The rule it applies: docs/local-stack.md#conflicts-locally (code in ``testkit.conflict_rules``). One proxy serves
every process of the local stack; everything else is forwarded as it is (body, status, headers, ``x-amz-crc32``,
errors). Injected latency is spent half each way, so a hold covers only DynamoDB's time. It exits when its stdin closes.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Sequence
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import urllib3

from testkit.conflict_emulation import COMMITS_PATH, STATS_PATH, ConflictEmulation
from testkit.conflict_rules import (
    SINGLE_ITEM_WRITES,
    TRANSACT_WRITE,
    TRANSACTION_CONFLICT,
    ItemHolds,
    ItemKey,
    item_key,
    transaction_cancelled,
    transaction_items,
)
from testkit.processes import LOOPBACK, wait_for_parent

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
)
_TABLE_CHANGES = frozenset({"CreateTable", "DeleteTable"})
_JSON = "application/x-amz-json-1.0"
# The idempotency record's COMPLETED status as the store writes it (``consumer.idempotency.record.Status``): a write
# DynamoDB accepted that sets it is a commit, seen here rather than believed from the consumer.
_COMPLETED = {"S": "COMPLETED"}

Reply = tuple[int, str, list[tuple[str, str]], bytes]


class ConflictProxyServer(ThreadingHTTPServer):
    """The proxy on ``127.0.0.1:port``; with conflicts off it forwards everything (latency still applies)."""

    daemon_threads = True

    def __init__(self, port: int, upstream: str, emulation: ConflictEmulation) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the upstream must be http://host:port, got {upstream!r}")
        # Kept-alive connections, one per concurrent request, with TCP_NODELAY; one the server has
        # closed is replaced before use. The proxy retries nothing: the client's SDK does.
        self.upstream = urllib3.HTTPConnectionPool(parts.hostname, parts.port, maxsize=128, timeout=60.0, retries=False)
        self.emulation = emulation
        self.holds = ItemHolds()
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        self.key_schemas: dict[str, tuple[str, ...]] = {}
        # "table/record id" -> the accepted commits' transaction tokens (a replayed transaction is one commit).
        self.commits: dict[str, set[str]] = {}
        super().__init__((LOOPBACK, port), _ProxyHandler)

    def forward(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> Reply:
        answer = self.upstream.urlopen(
            method, path, body=body or None, headers=dict(headers), redirect=False, decode_content=False
        )
        return answer.status, answer.reason or "", list(answer.headers.items()), answer.data

    def key_names(self, table: str, authorization: str | None) -> tuple[str, ...] | None:
        """The table's key attribute names (DescribeTable once, forgotten when the table changes)."""
        if (names := self.key_schemas.get(table)) is None:
            headers = [("X-Amz-Target", "DynamoDB_20120810.DescribeTable"), ("Content-Type", _JSON)]
            if authorization is not None:
                # DynamoDB Local wants credentials present; it does not check the signature.
                headers.append(("Authorization", authorization))
            status, _, _, data = self.forward("POST", "/", headers, json.dumps({"TableName": table}).encode())
            if status != 200:
                return None
            names = tuple(key["AttributeName"] for key in json.loads(data)["Table"]["KeySchema"])
            self.key_schemas[table] = names
        return names

    def count(self, event: str) -> None:
        with self._counts_lock:
            self._counts[event] += 1

    def document(self, path: str) -> dict[str, int]:
        with self._counts_lock:
            if path == STATS_PATH:
                return dict(self._counts)
            return {record: len(tokens) for record, tokens in self.commits.items()}

    def observe_commits(self, request: dict[str, Any]) -> None:
        transaction = request.get("TransactItems")
        updates = [item.get("Update") or {} for item in transaction or []] if transaction else [request]
        token = request.get("ClientRequestToken") or uuid.uuid4().hex
        for update in updates:
            if _COMPLETED in (update.get("ExpressionAttributeValues") or {}).values():
                record = f"{update.get('TableName')}/{((update.get('Key') or {}).get('id') or {}).get('S')}"
                with self._counts_lock:
                    self.commits.setdefault(record, set()).add(token)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ConflictProxyServer

    def setup(self) -> None:
        super().setup()
        # Small answers go out at once: Nagle's algorithm would hold them for the client's delayed ACK.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: a load run makes thousands of requests."""

    def do_GET(self) -> None:
        if self.path in (STATS_PATH, COMMITS_PATH):
            document = json.dumps(self.server.document(self.path)).encode()
            self._reply(200, "OK", [("Content-Type", "application/json")], document)
        else:
            self.do_POST()  # any other path is DynamoDB Local's to answer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = [(name, value) for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP]
        operation = (self.headers.get("X-Amz-Target") or "").rpartition(".")[2]
        self._wait_half_latency()
        reply = self._answer(operation, headers, body)
        if reply[0] == 200 and operation in (TRANSACT_WRITE, "UpdateItem"):
            self.server.observe_commits(_json_object(body) or {})
        self._wait_half_latency()
        self._reply(*reply)

    def _answer(self, operation: str, headers: list[tuple[str, str]], body: bytes) -> Reply:
        server = self.server
        request = _json_object(body) if server.emulation.conflicts else None
        if request is None:
            return server.forward(self.command, self.path, headers, body)
        key_names = partial(server.key_names, authorization=self.headers.get("Authorization"))
        if operation == TRANSACT_WRITE:
            server.count("transactions")
            return self._transaction(transaction_items(request, key_names), headers, body)
        if operation in SINGLE_ITEM_WRITES and server.holds.held(item_key(request, key_names)):
            server.count("writes_refused")
            return _error(TRANSACTION_CONFLICT)
        reply = server.forward(self.command, self.path, headers, body)
        if operation in _TABLE_CHANGES:
            server.key_schemas.pop(request.get("TableName", ""), None)
        return reply

    def _transaction(self, items: Sequence[ItemKey | None], headers: list[tuple[str, str]], body: bytes) -> Reply:
        server = self.server
        token, conflicting = server.holds.hold(items)
        if token is None:
            server.count("transactions_cancelled")
            return _error(transaction_cancelled(len(items), conflicting))
        try:
            time.sleep(server.emulation.hold_ms / 1000)
            return server.forward(self.command, self.path, headers, body)
        finally:
            server.holds.release(items, token)

    def _wait_half_latency(self) -> None:
        if self.server.emulation.latency_ms:
            time.sleep(self.server.emulation.latency_ms / 2000)

    def _reply(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        # Headers and body in one write, for the same reason as TCP_NODELAY.
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.conflict_proxy", description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True, help="DynamoDB Local's endpoint, http://127.0.0.1:PORT")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on, on 127.0.0.1")
    parser.add_argument("--hold-ms", type=float, default=5.0, help="a transaction's prepare time (default 5)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="round-trip latency added to every call")
    parser.add_argument("--no-conflicts", action="store_true", help="forward everything, emulate nothing")
    arguments = parser.parse_args(argv)
    try:
        emulation = ConflictEmulation(not arguments.no_conflicts, arguments.hold_ms, arguments.latency_ms)
        server = ConflictProxyServer(arguments.port, arguments.upstream, emulation)
    except (ValueError, OSError) as error:
        print(f"conflict proxy: {error}", file=sys.stderr)
        return 2
    threading.Thread(target=server.serve_forever, name="conflict-proxy", daemon=True).start()
    wait_for_parent()
    return 0


if __name__ == "__main__":
    sys.exit(main())
