"""One invocation of the function, whichever runtime ran it, and what a runtime offers the poller."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from testkit.lambda_sqs import LambdaContext
from testkit.resources import FunctionSpec


class FunctionError(RuntimeError):
    """The function's invocation failed as Lambda reports it: ``errorType`` and ``errorMessage``."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


@dataclass(frozen=True)
class Invocation:
    """One call of the handler: its response, or the error it ended with, or that it timed out.

    ``init_duration_ms``, set on a cold start, is the time the runtime took to initialise.
    """

    response: Any
    error: BaseException | None
    timed_out: bool
    duration_s: float
    request_id: str
    init_duration_ms: float | None = None

    @property
    def succeeded(self) -> bool:
        return self.error is None and not self.timed_out

    @property
    def error_type(self) -> str | None:
        return None if self.error is None else getattr(self.error, "error_type", type(self.error).__name__)


class Invoker(Protocol):
    """What a poller invokes: one execution environment of ``function``."""

    @property
    def function(self) -> FunctionSpec: ...

    def invoke(self, event: dict[str, Any]) -> Invocation: ...


@dataclass
class InProcess:
    """An ``Invoker`` that calls a handler in this process: for a poller whose function needs no runtime of its own
    (a test's relay, whose environment is the test's)."""

    function: FunctionSpec
    handler: Callable[[dict[str, Any], Any], Any]

    def invoke(self, event: dict[str, Any]) -> Invocation:
        context = LambdaContext(timeout_s=self.function.timeout_s, function_name=self.function.name)
        started = time.perf_counter()
        try:
            response, error = self.handler(event, context), None
        except Exception as raised:  # as Lambda reports it: the invocation's error, not the poller's
            response, error = None, raised
        return Invocation(response, error, False, time.perf_counter() - started, context.aws_request_id)
