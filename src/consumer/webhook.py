"""The one HTTP client for lock-mode side effects: one POST, within one deadline, never redirected.

A lock-mode handler calls outside DynamoDB under a claim that lasts as long as its
lease, so the call must end before the lease does (past it another worker may be
calling too). The deadline covers the whole call (connect, send, status and
headers): a timer closes the socket when it passes, so a server that trickles bytes
cannot hold the call longer. The response body is never read nor copied.

Outcomes: 2xx returns the status; 408, 425, 429, 5xx and a failed or late call raise
``TransientError`` (retried); a 3xx is ``PoisonMessage(WebhookRejected)`` "redirect
not followed" (the endpoint is configuration: a redirect would carry the POST and
its key elsewhere, and a retry would meet it again); other 4xx are
``PoisonMessage(WebhookRejected)``.

The idempotency key travels as ``Idempotency-Key`` and ``webhook-id`` (Standard
Webhooks), both ``header_key(key)``: the key percent-encoded (UTF-8) except
printable ASCII other than ``%``, ``"``, ``\\`` and space. Every key the envelope
accepts (non-ASCII, CR/LF) can thus be sent, the same on every try; the keys made of
``[A-Za-z0-9_.:-]`` are sent as they are.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import threading
import urllib.parse
from collections.abc import Mapping

from consumer.errors import ConfigurationError, ErrorType, PoisonMessage, TransientError

_RETRYABLE_4XX = frozenset({408, 425, 429})
_KEY_SAFE = "!#$&'()*+,-./:;<=>?@[]^_`{|}~"


def header_key(key: str) -> str:
    """The idempotency key as an HTTP header value can carry it (see the module's docstring)."""
    return urllib.parse.quote(key, safe=_KEY_SAFE)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class WebhookClient:
    def __init__(self, url: str, setting: str = "webhook URL") -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"{setting} must be an https URL, got {url!r}")
        if parts.scheme == "http" and not _is_loopback(parts.hostname):
            raise ConfigurationError(f"{setting} must use https (http only to loopback), got {url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def post(self, body: bytes, idempotency_key: str, deadline_s: float, headers: Mapping[str, str] = {}) -> int:
        """POST ``body``; the status of a 2xx answer, or raise as the module's docstring maps it."""
        connection_type = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = connection_type(self._host, self._port, timeout=deadline_s)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            with contextlib.suppress(OSError):
                if connection.sock is not None:
                    connection.sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(deadline_s, expire)
        timer.start()
        key = header_key(idempotency_key)
        try:
            connection.request(
                "POST",
                self._path,
                body=body,
                headers={**headers, "Content-Type": "application/json", "Idempotency-Key": key, "webhook-id": key},
            )
            status = connection.getresponse().status
        except (OSError, http.client.HTTPException) as error:
            if expired.is_set():
                raise TransientError(f"webhook call passed its {deadline_s:.1f} s deadline") from None
            # The class only: the text may quote the remote side.
            raise TransientError(f"webhook unreachable: {type(error).__name__}") from None
        finally:
            timer.cancel()
            connection.close()
        if expired.is_set():
            raise TransientError(f"webhook call passed its {deadline_s:.1f} s deadline")
        return _outcome(status)


def _outcome(status: int) -> int:
    if 200 <= status < 300:
        return status
    if 300 <= status < 400:
        raise PoisonMessage(ErrorType.WEBHOOK_REJECTED, f"HTTP {status}: redirect not followed")
    if 400 <= status < 500 and status not in _RETRYABLE_4XX:
        raise PoisonMessage(ErrorType.WEBHOOK_REJECTED, f"HTTP {status}")
    raise TransientError(f"webhook answered HTTP {status}")
