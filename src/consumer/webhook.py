"""The one HTTP client for lock-mode side effects: one POST, within one deadline, never redirected.

What it promises (outcomes per status, the key's headers and their encoding, Standard Webhooks
signing, the secret's rotation, headers a caller adds) is docs/writing-a-handler.md,
the paragraphs on ``WebhookClient``; this module keeps only why it is built as it is.

The deadline covers the whole call (connect, send, status, headers and body), enforced by a
timer that closes the socket: a lock-mode call must end before its lease does (past it another
worker may be calling too), and a server that trickles bytes must not hold it longer. The body
is read up to a bound and no further, so an answer cannot cost more memory than the caller chose.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import http.client
import ipaddress
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from consumer.errors import ConfigurationError, ErrorType, PoisonMessage, TransientError


def _untraced(method: str, url: str) -> AbstractContextManager[dict[str, Any]]:
    return contextlib.nullcontext({})


# What each call runs in: ``consumer.tracing`` puts its subsegment here when the function traces (TRACING=true),
# so a function that does not trace imports nothing of it. The call puts its answer's status in the dict.
trace_call: Callable[[str, str], AbstractContextManager[dict[str, Any]]] = _untraced

_RETRYABLE_4XX = frozenset({408, 425, 429})
# The most of an answer's body a client reads by default: an API's answer (an id, a status) is far smaller.
MAX_ANSWER_BYTES = 1024 * 1024
_KEY_SAFE = "!#$&'()*+,-./:;<=>?@[]^_`{|}~"
# Ours, and HTTP's framing: a caller's copy in another case would be sent beside them.
_OWN_HEADERS = frozenset(
    {"content-type", "content-length", "transfer-encoding", "idempotency-key"}
    | {"webhook-id", "webhook-timestamp", "webhook-signature"}
)
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")


def header_key(key: str) -> str:
    """The idempotency key as an HTTP header value can carry it (see the module's docstring)."""
    return urllib.parse.quote(key, safe=_KEY_SAFE)


_SECRET_PREFIX = "whsec_"  # noqa: S105 (the format's prefix, not a secret)
# Standard Webhooks asks for 24 to 64 bytes of key; longer keys work with the reference (HMAC hashes them).
_MIN_KEY_BYTES = 24
# How long a container signs with what it read: a rotation reaches every container within this.
SECRET_MAX_AGE_S = 300.0


def signing_key(secret: str, name: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret ``whsec_<base64>``.

    As the reference library reads it: line breaks (``base64`` wraps at 76 columns, so a 64-byte
    key spans two lines) and missing padding are accepted; any other character is refused.
    """
    try:
        if not secret.startswith(_SECRET_PREFIX):
            raise ValueError("no whsec_ prefix")
        encoded = "".join(secret.removeprefix(_SECRET_PREFIX).split())
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except (ValueError, binascii.Error):
        raise ConfigurationError(f"secret {name} is not a Standard Webhooks secret (whsec_<base64>)") from None
    if len(key) < _MIN_KEY_BYTES:
        raise ConfigurationError(f"secret {name} holds {len(key)} bytes of key; at least {_MIN_KEY_BYTES} are needed")
    return key


def signature(key: bytes, webhook_id: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(key, f"{webhook_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


class SigningKey:
    """The webhook secret named by its ARN: its current key, then its previous one if Secrets Manager keeps one.

    Read on first use and again once ``max_age_s`` has passed since the last read.
    """

    def __init__(
        self, secret_arn: str, max_age_s: float = SECRET_MAX_AGE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._arn = secret_arn
        self._max_age_s = max_age_s
        self._clock = clock
        self._keys: tuple[bytes, ...] = ()
        self._read_at = 0.0

    def __call__(self) -> tuple[bytes, ...]:
        if not self._keys or self._clock() - self._read_at >= self._max_age_s:
            keys = [signing_key(self._value("AWSCURRENT") or "", self._arn)]
            if (previous := self._value("AWSPREVIOUS")) is not None:
                # A malformed previous value is one a fix replaced: it signs nothing.
                with contextlib.suppress(ConfigurationError):
                    keys.append(signing_key(previous, self._arn))
            self._keys = tuple(dict.fromkeys(keys))
            self._read_at = self._clock()
        return self._keys

    def _value(self, stage: str) -> str | None:
        # Only a signing function pays for the parameters utility, and only when it first signs.
        from aws_lambda_powertools.utilities import parameters  # noqa: PLC0415

        try:
            # force_fetch: the utility caches by name alone, whatever the version stage.
            return str(parameters.get_secret(self._arn, force_fetch=True, VersionStage=stage))
        except parameters.GetParameterError as error:
            # The utility raises it while handling the SDK's error, without ``from``.
            cause = error.__cause__ or error.__context__
            code = getattr(cause, "response", {}).get("Error", {}).get("Code")
            if stage == "AWSPREVIOUS" and code == "ResourceNotFoundException":
                return None
            raise ConfigurationError(
                f"webhook secret {self._arn} cannot be read ({type(cause).__name__ if cause else 'no value'})"
            ) from None


@dataclass(frozen=True)
class WebhookResponse:
    """A 2xx answer to ``WebhookClient.post``: what a lock-mode handler may commit (a charge id, a label id).

    Attributes
    ----------
    status:
        The HTTP status, 200 to 299 (any other is raised as an error before a response is made).
    headers:
        The answer's headers, names in lower case (a repeated header's values joined by ", ").
    body:
        The body's bytes, at most the client's ``max_answer_bytes``.

    Example
    -------
    ``label = client.post(body, context.idempotency_key, deadline_s).json()["labelId"]``
    """

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON; ``PoisonMessage(WebhookAnswerUnreadable)`` when it is not JSON."""
        try:
            return json.loads(self.body)
        except ValueError:
            # Never quoted: the body is the remote side's.
            raise PoisonMessage(
                ErrorType.WEBHOOK_ANSWER_UNREADABLE,
                f"HTTP {self.status}: the answer's {len(self.body)} bytes are not JSON",
            ) from None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class WebhookClient:
    def __init__(
        self,
        url: str,
        setting: str = "webhook URL",
        signing_key: Callable[[], Sequence[bytes]] | None = None,
        clock: Callable[[], float] = time.time,
        *,
        allow_unsigned: bool = False,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        """Refuse, at start, a URL that is not http(s), http beyond loopback, and a call beyond
        loopback without a ``signing_key``: unsigned, a receiver could not tell this function's calls
        from anyone's. ``allow_unsigned=True`` lifts the last, only for a receiver that cannot verify.
        ``max_answer_bytes``: the most of a 2xx answer's body read; a longer one is an error, never cut."""
        if max_answer_bytes < 0:
            raise ConfigurationError(f"{setting}: max_answer_bytes must be 0 or more, got {max_answer_bytes}")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"{setting} must be an https URL, got {url!r}")
        leaves_host = not _is_loopback(parts.hostname)
        if parts.scheme == "http" and leaves_host:
            raise ConfigurationError(f"{setting} must use https (http only to loopback), got {url!r}")
        if leaves_host and signing_key is None and not allow_unsigned:
            raise ConfigurationError(
                f"{setting} beyond loopback needs a signing key to sign its calls (or allow_unsigned=True for a"
                f" receiver that cannot verify), got {url!r}"
            )
        self._https = parts.scheme == "https"
        self._url = url.split("?", 1)[0].split("#", 1)[0]  # traced without its query: it may carry a token
        self._host = parts.hostname
        self._port = parts.port
        # Everything after the authority (path and query string), without a fragment.
        self._path = url.split(parts.netloc, 1)[1].split("#", 1)[0] or "/"
        self._signing_key = signing_key
        self._clock = clock
        self._max_answer_bytes = max_answer_bytes

    def post(
        self, body: bytes, idempotency_key: str, deadline_s: float, headers: Mapping[str, str] = {}
    ) -> WebhookResponse:
        """POST ``body``; a 2xx answer (status, headers, body), or raise as docs/writing-a-handler.md maps it."""
        _check_headers(headers)
        key = header_key(idempotency_key)
        sent = {**headers, "Content-Type": "application/json", "Idempotency-Key": key, "webhook-id": key}
        if self._signing_key is not None:
            # Before any connection: a secret that cannot be read stops the call, never an unsigned one.
            timestamp = int(self._clock())
            signatures = (signature(secret, key, timestamp, body) for secret in self._signing_key())
            sent |= {"webhook-timestamp": str(timestamp), "webhook-signature": " ".join(signatures)}
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
        try:
            with trace_call("POST", self._url) as answer:
                connection.request("POST", self._path, body=body, headers=sent)
                response = connection.getresponse()
                status = answer["status"] = response.status
                # Only a 2xx answer's body is read (the others are errors that quote none of it), within the deadline.
                read = response.read(self._max_answer_bytes + 1) if 200 <= status < 300 else b""
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
        _check_status(status)
        if len(read) > self._max_answer_bytes:
            raise PoisonMessage(
                ErrorType.WEBHOOK_ANSWER_UNREADABLE,
                f"HTTP {status}: the answer's body is over the client's {self._max_answer_bytes} bytes"
                " (max_answer_bytes)",
            )
        names: dict[str, str] = {}
        for name, value in response.getheaders():
            names[name.lower()] = f"{names[name.lower()]}, {value}" if name.lower() in names else value
        return WebhookResponse(status, names, read)


def _check_headers(headers: Mapping[str, str]) -> None:
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name):
            raise PoisonMessage(ErrorType.WEBHOOK_REJECTED, "a header name holds characters HTTP cannot carry")
        if name.lower() in _OWN_HEADERS:
            raise ConfigurationError(f"header {name} is set by WebhookClient; a caller cannot send its own")
        if not _HEADER_VALUE.fullmatch(value):
            # The value may come from the message: named, never quoted into the log.
            raise PoisonMessage(
                ErrorType.WEBHOOK_REJECTED,
                f"header {name}: value holds CR, LF, another control character or one beyond Latin-1",
            )


def _check_status(status: int) -> None:
    if 200 <= status < 300:
        return
    if 300 <= status < 400:
        raise PoisonMessage(ErrorType.WEBHOOK_REJECTED, f"HTTP {status}: redirect not followed")
    if 400 <= status < 500 and status not in _RETRYABLE_4XX:
        raise PoisonMessage(ErrorType.WEBHOOK_REJECTED, f"HTTP {status}")
    raise TransientError(f"webhook answered HTTP {status}")
