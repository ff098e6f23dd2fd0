"""The webhook sink records what a receiver would act on: whole requests only."""

from __future__ import annotations

import json
import socket
import urllib.request
from urllib.parse import urlsplit

from consumer.webhook import WebhookClient, signing_key
from testkit.webhook import WebhookSink


def _post(url: str, document: dict[str, str], key: str) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(document).encode(), headers={"Idempotency-Key": key}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        return int(answer.status)


def test_a_request_cut_short_by_its_caller_is_not_recorded() -> None:
    with WebhookSink() as sink:
        address = urlsplit(sink.url)
        body = json.dumps({"receiptId": "r-1"}).encode()
        head = (
            f"POST /receipts HTTP/1.1\r\nHost: {address.netloc}\r\nIdempotency-Key: rcpt-cut\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        with socket.create_connection((address.hostname, address.port), timeout=5) as caller:
            caller.sendall(head + body[:7])
            caller.shutdown(socket.SHUT_WR)
            assert caller.recv(1024) == b""  # closed without an answer

        assert _post(f"{sink.url}/receipts", {"receiptId": "r-2"}, "rcpt-whole") == 200
        assert [(request.idempotency_key, request.json()) for request in sink.received()] == [
            ("rcpt-whole", {"receiptId": "r-2"})
        ]


def test_the_sink_counts_the_unsigned_and_the_badly_signed_calls() -> None:
    with WebhookSink() as sink:
        WebhookClient(sink.url, signing_key=lambda: (signing_key(sink.secret, "sink"),)).post(b"{}", "k-signed", 5)
        WebhookClient(sink.url, signing_key=lambda: (bytes(32),)).post(b"{}", "k-forged", 5)
        _post(f"{sink.url}/receipts", {"receiptId": "r-3"}, "k-unsigned")

        assert [request.idempotency_key for request in sink.unverified()] == ["k-forged", "k-unsigned"]
        assert [request.verified for request in sink.received()] == [True, False, False]
