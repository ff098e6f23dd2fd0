"""One invocation of the function, whichever runtime ran it, and what a runtime offers the poller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

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
