"""Faults between a boto3 client and its endpoint, injected through botocore's own events.

Hooks registered on a ``boto3.session.Session`` before its clients are created are
copied into every client the session makes, so the consumer's real code path (the
idempotency store, the dead-letter queue) meets them without knowing. One
``before-send`` hook asks a policy what to do with each request: let it through,
answer in the server's place (nothing applied), or send it for real and then lose
the answer (applied, yet the caller cannot know: the ambiguous success that botocore
answers by retrying the very same request).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import boto3
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.compat import HTTPHeaders
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError
from botocore.httpsession import URLLib3Session

from testkit.conflict_rules import transaction_cancelled

# Marks a failure we made up (a response header, an exception attribute), so that its
# retry need not wait for backoff.
_INJECTED = "chaos-injected"
# Retrying an injected fault at once keeps runs short; the retry itself is botocore's own.
_RETRY_DELAY_S = 0.005


class TransportFault(StrEnum):
    THROTTLED = "throttled"  # a throttling error in the server's place; nothing applied
    SERVER_ERROR = "server_error"  # a 500 in the server's place; nothing applied
    CONNECT_TIMEOUT = "connect_timeout"  # the request never left; nothing applied
    LOST_ANSWER = "lost_answer"  # applied, then a 2xx answer replaced by a 500
    READ_TIMEOUT = "read_timeout"  # sent (and maybe applied), then no answer in time
    REJECTED = "rejected"  # a 400 no retry can cure, in the server's place; nothing applied
    # A TransactWriteItems cancelled for a conflict, as DynamoDB answers it; nothing applied.
    TRANSACTION_CONFLICT = "transaction_conflict"

    @property
    def reaches_server(self) -> bool:
        return self in (TransportFault.LOST_ANSWER, TransportFault.READ_TIMEOUT)


@dataclass(frozen=True)
class TransportCall:
    """One attempt of one API call, as the hook sees it."""

    service: str  # botocore's service id: "dynamodb", "sqs"
    operation: str  # "UpdateItem", "TransactWriteItems", "SendMessage"...
    params: Mapping[str, Any]  # the API parameters as sent (both services speak JSON)
    attempt: int  # 1 for the first attempt, then one more per retry


@dataclass(frozen=True)
class TransportPlan:
    """What to do with one attempt. The default lets it through untouched."""

    fault: TransportFault | None = None
    # Runs before the request is sent; may block (a paused worker) or raise (a crash).
    before: Callable[[], None] | None = None
    # Runs once the server answered, with its HTTP status, before the caller sees it;
    # may raise (a crash after the write) or block.
    after: Callable[[int], None] | None = None


TransportPolicy = Callable[[TransportCall], TransportPlan | None]


class _Body:
    """The raw stream of a made-up response."""

    def __init__(self, content: bytes) -> None:
        self._content = content

    def stream(self, **_: Any) -> Any:
        yield self._content


def _made_up(
    request: AWSPreparedRequest,
    service: str,
    status: int,
    code: str,
    message: str,
    *,
    retryable: bool = True,
    document: Mapping[str, Any] | None = None,
) -> AWSResponse:
    body = json.dumps(document or {"__type": code, "message": message}).encode()
    headers = {
        "Content-Type": "application/x-amz-json-1.0",
        "Content-Length": str(len(body)),
        "x-amzn-RequestId": _INJECTED if retryable else "chaos-rejected",
    }
    if service == "sqs":
        # SQS's JSON protocol names the error in this header as well.
        headers["x-amzn-query-error"] = f"{code};{'Sender' if status < 500 else 'Receiver'}"
    return AWSResponse(request.url, status, HTTPHeaders.from_dict(headers), _Body(body))


def _injected(error: Exception) -> Exception:
    setattr(error, _INJECTED.replace("-", "_"), True)
    return error


def _attempt(request: AWSPreparedRequest) -> int:
    """The attempt number botocore announces in the ``amz-sdk-request`` header."""
    header = request.headers.get("amz-sdk-request", b"")
    text = header.decode() if isinstance(header, bytes) else str(header)
    for part in text.split(";"):
        name, _, value = part.strip().partition("=")
        if name == "attempt" and value.isdigit():
            return int(value)
    return 1


def _throttling_code(service: str) -> str:
    return "ProvisionedThroughputExceededException" if service == "dynamodb" else "ThrottlingException"


class _TransportHook:
    def __init__(self, policy: TransportPolicy, service: str) -> None:
        self._policy = policy
        self._service = service
        # Our own connection pool: the hook sends the request itself when it has to act
        # after the server answered.
        self._http = URLLib3Session(timeout=30, max_pool_connections=32)

    def before_send(self, request: AWSPreparedRequest, event_name: str, **_: Any) -> AWSResponse | None:
        operation = event_name.rsplit(".", 1)[-1]
        body = request.body
        params = json.loads(body) if isinstance(body, str | bytes) and body else {}
        plan = self._policy(TransportCall(self._service, operation, params, _attempt(request)))
        if plan is None:
            return None
        if plan.before is not None:
            plan.before()
        if plan.fault is not None and not plan.fault.reaches_server:
            return self._instead_of_sending(request, plan.fault, params)
        if plan.fault is None and plan.after is None:
            return None
        return self._send_then(request, plan)

    def _instead_of_sending(
        self, request: AWSPreparedRequest, fault: TransportFault, params: Mapping[str, Any]
    ) -> AWSResponse:
        service = self._service
        if fault is TransportFault.THROTTLED:
            return _made_up(request, service, 400, _throttling_code(service), "injected throttling")
        if fault is TransportFault.SERVER_ERROR:
            return _made_up(request, service, 500, "InternalServerError", "injected server error")
        if fault is TransportFault.REJECTED:
            return _made_up(request, service, 400, "ValidationException", "injected rejection", retryable=False)
        if fault is TransportFault.TRANSACTION_CONFLICT:
            # Not retried by the SDK (DynamoDB's is not either): the consumer's own conflict retry must absorb it.
            actions = len(params.get("TransactItems") or [None])
            document = transaction_cancelled(actions, conflicting={0})
            return _made_up(request, service, 400, "", "", retryable=False, document=document)
        raise _injected(ConnectTimeoutError(endpoint_url=request.url, error="injected connect timeout"))

    def _send_then(self, request: AWSPreparedRequest, plan: TransportPlan) -> AWSResponse:
        response = self._http.send(request)
        response.content  # noqa: B018 (read it all: the connection goes back to the pool)
        if plan.after is not None:
            plan.after(response.status_code)
        if plan.fault is TransportFault.READ_TIMEOUT:
            raise _injected(ReadTimeoutError(endpoint_url=request.url, error="injected read timeout after sending"))
        if plan.fault is TransportFault.LOST_ANSWER and 200 <= response.status_code < 300:
            return _made_up(request, self._service, 500, "InternalServerError", "injected: applied, answer lost")
        return response

    @staticmethod
    def needs_retry(
        attempts: int,
        request_dict: Mapping[str, Any],
        response: tuple[AWSResponse, Any] | None = None,
        caught_exception: Exception | None = None,
        **_: Any,
    ) -> float | None:
        """Retry an injected failure without backoff, within the client's own attempt budget."""
        injected = getattr(caught_exception, _INJECTED.replace("-", "_"), False) or (
            response is not None and response[0].headers.get("x-amzn-RequestId") == _INJECTED
        )
        if not injected:
            return None  # not ours: botocore's retry handler decides, backoff included
        context = request_dict.get("context") or {}
        config = context.get("client_config")
        retries = getattr(config, "retries", None) or {}
        max_attempts = int(retries.get("total_max_attempts", 3))
        return _RETRY_DELAY_S if attempts < max_attempts else None


def install_faults(
    session: boto3.session.Session, policy: TransportPolicy, services: tuple[str, ...] = ("dynamodb",)
) -> None:
    """Put ``policy`` between every client ``session`` creates from now on and its endpoint."""
    for service in services:
        hook = _TransportHook(policy, service)
        # botocore's stubs type every handler as returning None; these two answer in botocore's place.
        session.events.register(f"before-send.{service}", hook.before_send)  # type: ignore[arg-type]
        # One level deeper than botocore's own retry handler, so this one is asked first.
        session.events.register(f"needs-retry.{service}.*", hook.needs_retry)  # type: ignore[arg-type]
