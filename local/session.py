"""Start the whole local stack for a command, and stop every process it started, whatever happens."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from typing import Any, TextIO

from local import state
from local.stack import DeployedStack, deploy_stack
from testkit.servers import LocalServers
from testkit.webhook import WebhookSink

FUNCTION_LOG = state.STATE_DIR / "function.log"


@contextlib.contextmanager
def running_stack(
    *,
    stack_name: str = "local",
    parameter_overrides: Mapping[str, Any] | None = None,
    publish: bool = False,
    memory_mb: int | None = None,
    log_sink: TextIO | None = None,
) -> Iterator[tuple[DeployedStack, WebhookSink]]:
    """Servers, webhook sink and the template deployed; with ``publish``, the state file too. The function logs to
    ``log_sink``, else to ``sys.stdout`` as it is now (a command that sent it to the function log gets them there)."""
    with LocalServers() as servers, WebhookSink() as sink:
        stack = deploy_stack(
            servers,
            stack_name=stack_name,
            parameter_overrides=parameter_overrides,
            webhook=sink,
            memory_mb=memory_mb,
            log_sink=log_sink or sys.stdout,
        )
        try:
            if publish:
                state.write(describe(stack))
            yield stack, sink
        finally:
            stack.stop()
            if publish:
                state.STATE_FILE.unlink(missing_ok=True)


def describe(stack: DeployedStack) -> state.StackState:
    return state.StackState(
        pid=os.getpid(),
        stack_name=stack.resources.stack_name,
        dynamodb_endpoint_url=stack.servers.dynamodb_endpoint_url,
        sqs_endpoint_url=stack.servers.sqs_endpoint_url,
        queue_url=stack.queue.url,
        dead_letter_queue_url=stack.dead_letter_queue.url,
        tables={logical_id: table.name for logical_id, table in stack.resources.tables.items()},
        function={**asdict(stack.function), "code_dir": str(stack.function.code_dir)},
        function_environment=stack.function_environment,
    )
