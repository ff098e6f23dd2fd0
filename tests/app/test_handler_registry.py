"""Every handler file is registered: an unregistered one would only show as UnknownEventType dead letters."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from typing import Any

import consumer.api
from consumer.config import Settings
from consumer.handler import MessageContext, MessageHandler
from service.registry import HANDLERS
from testkit.template import REPO_ROOT
from tests.deployment.environment import handler_classes, unregistered_handlers

_PATHS = {**os.environ, "PYTHONPATH": f"{REPO_ROOT / 'src'}{os.pathsep}{REPO_ROOT}"}


def test_every_handler_file_is_registered_in_handlers() -> None:
    defined = handler_classes()
    assert defined, "no handler found under service.handlers: the scan is broken"
    left_out = unregistered_handlers()
    assert not left_out, (
        f"register each handler file in HANDLERS (src/service/registry.py): {', '.join(left_out)} is left out"
    )
    # Routing is by event type: the start refuses two handlers of one (test_the_function_starts).
    assert sorted(h.event_type for h in HANDLERS) == sorted(h.event_type for h in defined)


HANDLER_API = {
    "MessageHandler", "Mode", "Effect", "MessageContext", "Put", "Update", "Delete", "ConditionCheck", "PoisonMessage",
    "TransientError", "ErrorType", "WebhookClient", "WebhookResponse", "SigningKey", "ID_PATTERN", "HandlerSettings",
    "SecretArn", "Settings", "ConfigurationError", "Guard", "ApiUrl", "QueueMessage", "TopicMessage", "BusEvent",
}  # fmt: skip


def test_consumer_api_exports_what_a_handler_needs_whichever_module_is_imported_first() -> None:
    assert set(consumer.api.__all__) == HANDLER_API
    # The handler base sits in the package whose registry imports the handlers, which import consumer.api:
    # a fresh interpreter that starts from consumer.api (or an example outside the package) must not cycle.
    for first in ("consumer.api", *(f"examples.{path.stem}" for path in (REPO_ROOT / "examples").glob("[!_]*.py"))):
        code = f"import {first}, consumer.api as api; print(all(hasattr(api, name) for name in api.__all__))"
        done = subprocess.run([sys.executable, "-c", code], env=_PATHS, capture_output=True, text=True, check=False)
        assert (done.returncode, done.stdout.strip()) == (0, "True"), (first, done.stderr[-2000:])


def test_handler_files_import_the_consumer_only_through_consumer_api() -> None:
    handler_files = [
        path
        for path in (REPO_ROOT / "src" / "service" / "handlers").glob("*.py")
        if path.stem not in ("__init__", "base")
    ]
    for path in [*handler_files, *(REPO_ROOT / "examples").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            modules += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for module in modules:
                assert module == "consumer.api" or not module.startswith("consumer"), (
                    f"{path.name} imports {module}: a handler imports the consumer from consumer.api"
                    " (add a name it needs to consumer.api's __all__)"
                )


def test_the_handler_in_message_handlers_docstring_runs_as_written() -> None:
    """The docstring is what an IDE shows first: its handler must import, start and apply as written."""
    doc = MessageHandler.__doc__ or ""
    code = textwrap.dedent(doc[doc.index("::\n") + 3 : doc.index("\n    Then add")])
    namespace: dict[str, Any] = {"__name__": "points_earned"}
    exec(compile(code, "MessageHandler.__doc__", "exec", dont_inherit=True), namespace)
    handler_class, settings_model = namespace["PointsEarnedHandler"], namespace["PointsSettings"]
    env = {
        "IDEMPOTENCY_TABLE_NAME": "i",
        "DEAD_LETTER_QUEUE_URL": "q",
        "POINTS_TABLE_NAME": "points",
        "POINTS_CAP": "50",
    }
    settings = Settings.from_env(env, tables=handler_class.tables, handler_settings=(settings_model,))
    handler = handler_class(settings)
    context = MessageContext(message_id="m", idempotency_key="k", receive_count=1, remaining_ms=lambda: 1_000)

    effect = handler.handle(handler_class.payload_model(memberId="m-1", points=20), context)

    (write,) = effect.writes
    assert (write.table, write.key, write.values) == ("points", {"memberId": "m-1"}, {":points": 20, ":room": 30})
