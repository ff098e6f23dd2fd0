"""Faults between a boto3 client and its endpoint, through botocore's own events: hooks on a session
reach every client it creates, so the consumer's real code path meets them without knowing.

A policy decides what becomes of each attempt: let it through, answer in the server's place (nothing applied), or send
it and then lose the answer (applied, and botocore retries the very same request: the ambiguous success).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import boto3
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.compat import HTTPHeaders
from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError
from botocore.httpsession import URLLib3Session
from urllib3 import HTTPResponse

from testkit.conflict_rules import transaction_cancelled

# The request id of a failure we made up, so that its retry need not wait for backoff.
_INJECTED = "chaos-injected"
# Retrying an injected fault at once keeps runs short; the retry itself is botocore's own.
_RETRY_DELAY_S = 0.005
_ATTEMPT = re.compile(r"attempt=(\d+)")


class TransportFault(StrEnum):
    THROTTLED = "throttled"  # a throttling error in the server's place; nothing applied
    SERVER_ERROR = "server_error"  # a 500 in the server's place; nothing applied
    CONNECT_TIMEOUT = "connect_timeout"  # the request never left; nothing applied
    LOST_ANSWER = "lost_answer"  # applied, then a 2xx answer replaced by a 500
    READ_TIMEOUT = "read_timeout"  # sent (and maybe applied), then no answer in time
    REJECTED = "rejected"  # a 400 no retry can cure, in the server's place; nothing applied
    # A TransactWriteItems cancelled for a conflict, as DynamoDB answers it; nothing applied.
    TRANSACTION_CONFLICT = "transaction_conflict"


# The errors made up in the server's place: HTTP status, error code, message.
_ERRORS = {
    TransportFault.THROTTLED: (400, "ThrottlingException", "injected throttling"),
    TransportFault.SERVER_ERROR: (500, "InternalServerError", "injected server error"),
    TransportFault.LOST_ANSWER: (500, "InternalServerError", "injected: applied, answer lost"),
    TransportFault.REJECTED: (400, "ValidationException", "injected rejection"),
}
_DYNAMODB_THROTTLING = "ProvisionedThroughputExceededException"
# Neither a rejection (no retry cures it) nor a conflict: the SDK does not retry one, as it does not
# retry DynamoDB's, so the consumer's own conflict retry must absorb it.
_RETRIED_AT_ONCE = (TransportFault.THROTTLED, TransportFault.SERVER_ERROR, TransportFault.LOST_ANSWER)


@dataclass(frozen=True)
class TransportCall:
    service: str  # botocore's service id: "dynamodb", "sqs"
    operation: str  # "UpdateItem", "TransactWriteItems", "SendMessage"...
    params: Mapping[str, Any]  # the API parameters as sent (both services speak JSON)
    attempt: int  # 1 for the first attempt, then one more per retry


@dataclass(frozen=True)
class TransportPlan:
    """What to do with one attempt. The default lets it through untouched."""

    fault: TransportFault | None = None
    # Runs before the request is sent; may block (a paused worker) or end the process (a crash).
    before: Callable[[], None] | None = None
    # Runs once the server applied the request (a 2xx), before the caller sees the answer.
    after: Callable[[], None] | None = None
    # Runs once the server answered, whatever it answered (after ``after``).
    settled: Callable[[], None] | None = None


TransportPolicy = Callable[[TransportCall], TransportPlan | None]


def _injected(error: Exception) -> Exception:
    setattr(error, _INJECTED.replace("-", "_"), True)
    return error


class _TransportHook:
    def __init__(self, policy: TransportPolicy, service: str) -> None:
        self._policy = policy
        self._service = service
        # Our own connection pool: the hook sends the request itself when it has to act after the server answered.
        self._http = URLLib3Session(timeout=30, max_pool_connections=32)

    def before_send(self, request: AWSPreparedRequest, event_name: str, **_: Any) -> AWSResponse | None:
        body = request.body
        params = json.loads(body) if isinstance(body, str | bytes) and body else {}
        header = request.headers.get("amz-sdk-request", b"")
        attempt = _ATTEMPT.search(header.decode() if isinstance(header, bytes) else str(header))
        operation = event_name.rsplit(".", 1)[-1]
        plan = self._policy(TransportCall(self._service, operation, params, int(attempt[1]) if attempt else 1))
        if plan is None:
            return None
        if plan.before is not None:
            plan.before()
        if plan.fault is TransportFault.CONNECT_TIMEOUT:
            raise _injected(ConnectTimeoutError(endpoint_url=request.url, error="injected connect timeout"))
        if plan.fault is None and plan.after is None and plan.settled is None:
            return None
        if plan.fault in (None, TransportFault.LOST_ANSWER, TransportFault.READ_TIMEOUT):
            return self._send_then(request, plan)
        return self._made_up(request, plan.fault, params)

    def _send_then(self, request: AWSPreparedRequest, plan: TransportPlan) -> AWSResponse:
        response = self._http.send(request)
        response.content  # noqa: B018 (read it all: the connection goes back to the pool)
        applied = 200 <= response.status_code < 300
        if plan.after is not None and applied:
            plan.after()
        if plan.settled is not None:
            plan.settled()
        if plan.fault is TransportFault.READ_TIMEOUT:
            raise _injected(ReadTimeoutError(endpoint_url=request.url, error="injected read timeout after sending"))
        if plan.fault is TransportFault.LOST_ANSWER and applied:
            return self._made_up(request, TransportFault.LOST_ANSWER)
        return response

    def _made_up(
        self, request: AWSPreparedRequest, fault: TransportFault, params: Mapping[str, Any] | None = None
    ) -> AWSResponse:
        if fault is TransportFault.TRANSACTION_CONFLICT:
            actions = len((params or {}).get("TransactItems") or [None])
            status, document = 400, transaction_cancelled(actions, conflicting={0})
        else:
            status, code, message = _ERRORS[fault]
            if fault is TransportFault.THROTTLED and self._service == "dynamodb":
                code = _DYNAMODB_THROTTLING
            document = {"__type": code, "message": message}
        body = json.dumps(document).encode()
        headers = {
            "Content-Type": "application/x-amz-json-1.0",
            "Content-Length": str(len(body)),
            "x-amzn-RequestId": _INJECTED if fault in _RETRIED_AT_ONCE else "chaos-rejected",
        }
        if self._service == "sqs":
            # SQS's JSON protocol names the error in this header as well.
            headers["x-amzn-query-error"] = f"{document.get('__type', '')};{'Sender' if status < 500 else 'Receiver'}"
        raw = HTTPResponse(body=io.BytesIO(body), preload_content=False)
        return AWSResponse(request.url, status, HTTPHeaders.from_dict(headers), raw)

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
        config = (request_dict.get("context") or {}).get("client_config")
        retries = getattr(config, "retries", None) or {}
        return _RETRY_DELAY_S if attempts < int(retries.get("total_max_attempts", 3)) else None


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
