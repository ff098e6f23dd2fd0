"""X-Ray subsegments for the function's calls (``TRACING=true``): DynamoDB, SQS, Secrets Manager and webhooks.

Imported only when tracing is on, so a function that does not trace loads none of it. No tracing SDK: the X-Ray
SDK (Powertools' tracer included) would put botocore, which Lambda's runtime already provides, into the artifact,
and its patching into every cold start. What it would send is small: with active tracing, Lambda's runtime records
the invocation's segment and runs the X-Ray daemon beside the function; each call is one subsegment document, sent
by UDP to the daemon (``AWS_XRAY_DAEMON_ADDRESS``) when the call ends, as the SDKs do in Lambda, under the segment
the invocation's trace header names (``_X_AMZN_TRACE_ID``: ``Root``, ``Parent``, ``Sampled``).

Tracing never fails a call: a document that cannot be sent is dropped, as UDP to the daemon would drop it anyway.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import botocore.session

from consumer import webhook

DAEMON_ADDRESS = "127.0.0.1:2000"  # the X-Ray daemon's default, as the SDKs assume when the variable is unset
_HEADER = b'{"format": "json", "version": 1}\n'
# Longer texts are cut: a document must stay under the daemon's 64 KB, whatever an error message says.
_TEXT_MAX = 1_000


def _trace_parent(header: str) -> tuple[str, str] | None:
    """The trace and parent segment of a sampled invocation; None when it is not sampled (nothing is sent)."""
    fields = dict(part.strip().split("=", 1) for part in header.split(";") if "=" in part)
    if fields.get("Sampled") != "1" or not fields.get("Root") or not fields.get("Parent"):
        return None
    return fields["Root"], fields["Parent"]


def _failure(status: int) -> dict[str, bool]:
    """X-Ray's flags for an answer: error (4xx), throttle (429, also an error), fault (5xx)."""
    if status == 429:
        return {"error": True, "throttle": True}
    if status >= 500:
        return {"fault": True}
    return {"error": True} if status >= 400 else {}


def _cause(error: BaseException) -> dict[str, Any]:
    exception = {"id": secrets.token_hex(8), "type": type(error).__name__, "message": str(error)[:_TEXT_MAX]}
    return {"fault": True, "cause": {"exceptions": [exception]}}


class Tracer:
    """Sends one subsegment per call, under the current invocation's segment."""

    def __init__(
        self,
        address: str = DAEMON_ADDRESS,
        environ: Mapping[str, str] = os.environ,
        clock: Callable[[], float] = time.time,
    ) -> None:
        host, _, port = address.rpartition(":")
        self._daemon = (host, int(port))
        self._environ = environ
        self._clock = clock
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def start(self, name: str, namespace: str, **fields: Any) -> dict[str, Any] | None:
        """A new subsegment's document, or None when the invocation is not sampled."""
        parent = _trace_parent(self._environ.get("_X_AMZN_TRACE_ID", ""))
        if parent is None:
            return None
        trace_id, parent_id = parent
        return {
            "type": "subsegment",
            "id": secrets.token_hex(8),
            "trace_id": trace_id,
            "parent_id": parent_id,
            "name": name[:200],
            "namespace": namespace,
            "start_time": self._clock(),
            **fields,
        }

    def end(self, document: dict[str, Any] | None, **fields: Any) -> None:
        if document is None:
            return
        document.update(fields, end_time=self._clock())
        with contextlib.suppress(OSError):
            self._socket.sendto(_HEADER + json.dumps(document).encode(), self._daemon)

    @contextlib.contextmanager
    def http_call(self, method: str, url: str) -> Iterator[dict[str, Any]]:
        """A call the function makes itself (``WebhookClient``); the caller puts the answer's status in the dict."""
        answer: dict[str, Any] = {}
        host = url.split("://", 1)[-1].split("/", 1)[0]
        document = self.start(host, "remote", http={"request": {"method": method, "url": url}})
        try:
            yield answer
        except BaseException as error:
            self.end(document, **_cause(error))
            raise
        status = answer.get("status")
        if document is not None and status is not None:
            document["http"]["response"] = {"status": status}
        self.end(document, **_failure(status or 0))

    def trace_sdk(self, session: botocore.session.Session) -> None:
        """Every call of the clients ``session`` creates from now on, one subsegment each (retries included)."""
        session.register("before-parameter-build", self._before_call)
        session.register("after-call", self._after_call)
        session.register("after-call-error", self._after_call_error)

    # botocore's events pass their arguments by name: ``model``, ``params``, ``context``, ``http_response``, ...
    def _before_call(self, **event: Any) -> None:
        # Before the parameters are built: the call's own parameters, and its time includes their serialising.
        model, params = event["model"], event["params"]
        aws: dict[str, Any] = {"operation": model.name}
        tables = {item[kind]["TableName"] for item in params.get("TransactItems", ()) for kind in item}
        if "TableName" in params:
            aws["table_name"] = params["TableName"]
        elif tables:
            aws["table_names"] = sorted(tables)
        if "QueueUrl" in params:
            aws["queue_url"] = params["QueueUrl"]
        event["context"]["xray_subsegment"] = self.start(model.service_model.service_id, "aws", aws=aws)

    def _after_call(self, **event: Any) -> None:
        document, status = event["context"].pop("xray_subsegment", None), event["http_response"].status_code
        if document is not None:
            metadata = event["parsed"].get("ResponseMetadata", {})
            document["aws"]["request_id"] = metadata.get("RequestId", "")
            document["aws"]["retries"] = metadata.get("RetryAttempts", 0)
            document["http"] = {"response": {"status": status}}
        self.end(document, **_failure(status))

    def _after_call_error(self, **event: Any) -> None:
        self.end(event["context"].pop("xray_subsegment", None), **_cause(event["exception"]))


def trace_calls(session: botocore.session.Session, environ: Mapping[str, str] = os.environ) -> Tracer:
    """Trace the SDK calls of ``session``'s clients and every ``WebhookClient`` call, to the daemon Lambda names."""
    tracer = Tracer(environ.get("AWS_XRAY_DAEMON_ADDRESS") or DAEMON_ADDRESS, environ)
    tracer.trace_sdk(session)
    webhook.trace_call = tracer.http_call
    return tracer
