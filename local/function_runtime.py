"""Load the template's handler and run it with the function's environment, as Lambda's runtime would.

The handler is imported by the path the template gives (``Handler`` within
``CodeUri``), with the environment the template declares plus the local endpoints.
The environment is process-wide, so one runtime is active at a time in a process.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from local.resources import FunctionSpec
from testkit.lambda_sqs import LambdaContext

Handler = Callable[[dict[str, Any], Any], Any]


@dataclass(frozen=True)
class Invocation:
    """One call of the handler: its response, or the exception it raised, or that it timed out."""

    response: Any
    error: BaseException | None
    timed_out: bool
    duration_s: float
    request_id: str

    @property
    def succeeded(self) -> bool:
        return self.error is None and not self.timed_out


def _clear_container_caches(module: ModuleType) -> None:
    # The handler module builds its clients once per container (an lru_cache reading
    # os.environ); a new environment is a new container, so forget the old clients.
    for value in vars(module).values():
        cache_clear = getattr(value, "cache_clear", None)
        if callable(cache_clear) and getattr(value, "__module__", None) == module.__name__:
            cache_clear()


class FunctionRuntime:
    """A warm container for one function: environment set, handler imported, ready to invoke."""

    def __init__(self, function: FunctionSpec, environment: Mapping[str, str]) -> None:
        self.function = function
        self.environment = dict(environment)
        self._saved: dict[str, str | None] = {}
        self._module: ModuleType | None = None
        self._handler: Handler | None = None

    def activate(self) -> FunctionRuntime:
        for name, value in self.environment.items():
            self._saved.setdefault(name, os.environ.get(name))
            os.environ[name] = value
        code_dir = str(self.function.code_dir)
        if code_dir not in sys.path:
            sys.path.insert(0, code_dir)
        module_name, _, attribute = self.function.handler.rpartition(".")
        self._module = importlib.import_module(module_name)
        _clear_container_caches(self._module)
        self._handler = getattr(self._module, attribute)
        return self

    def deactivate(self) -> None:
        if self._module is not None:
            _clear_container_caches(self._module)
        for name, value in self._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved.clear()
        self._module, self._handler = None, None

    def __enter__(self) -> FunctionRuntime:
        return self.activate()

    def __exit__(self, *exc_info: object) -> None:
        self.deactivate()

    @property
    def handler(self) -> Handler:
        if self._handler is None:
            raise RuntimeError("the function runtime is not active")
        return self._handler

    def new_context(self) -> LambdaContext:
        return LambdaContext(
            function_name=self.function.name,
            invoked_function_arn=self.function.arn,
            memory_limit_in_mb=self.function.memory_mb,
            timeout_s=self.function.timeout_s,
        )

    def invoke(self, event: dict[str, Any], context: LambdaContext | None = None) -> Invocation:
        """Call the handler once. Past the function's Timeout the call counts as timed out,
        as Lambda would have stopped it (a thread cannot be stopped, so it runs to its end)."""
        context = context or self.new_context()
        started = time.monotonic()
        try:
            response, error = self.handler(event, context), None
        except Exception as raised:
            response, error = None, raised
        return Invocation(response, error, context.timed_out(), time.monotonic() - started, context.aws_request_id)
