"""Helpers shared by the test suites."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from consumer.config import Settings
from consumer.idempotency import IdempotencyStore
from consumer.idempotency.transition import Transition
from testkit import application
from testkit.aws import session
from testkit.template import REPO_ROOT, TemplateError
from tests.core.handlers import TEST_TABLES, CallHandler, TallyHandler, create_test_tables
from tests.kit import NoTestValue, settings_for

if TYPE_CHECKING:
    from testkit.servers import LocalServers

IDEMPOTENCY_TABLE = "idempotency"


def settings_for_tests(tables: Mapping[str, Any] | None = None, **overrides: Any) -> Settings:
    """The function's settings as tests build them (the kit's ``settings_for``) for the core's test handlers
    (tests/core/handlers.py) and every registered handler: a handler with a table or a setting of its own
    needs no change here. An override that is no field of ``Settings`` sets a handler's own setting
    (``receipt_webhook_url=...``)."""
    # A shared transaction waits for the others' transitions this long at most: long enough that a loaded machine's
    # threads all arrive (which messages share one is then the test's to say, not the scheduler's), still a tenth
    # of the shortest lease.
    overrides.setdefault("group_commit_wait_ms", 100)
    try:
        return settings_for((TallyHandler, CallHandler, *application.registered()), tables, **overrides)
    except (TemplateError, NoTestValue) as error:
        # The static checks name the one mistake (a parameter without a value, a setting the function lacks).
        pytest.skip(f"the tests cannot give a handler its required setting: {error}")


def settings_on_local_servers(servers: LocalServers, **overrides: Any) -> Settings:
    """The template's tables and queues deployed afresh on the local servers, the test handlers' tables made
    beside them (named after this deployment's), and settings naming them all."""
    resources = servers.deploy()
    prefix = resources.tables["IdempotencyTable"].name
    own = {table: f"{prefix}-{table}" for table in TEST_TABLES}
    create_test_tables(servers.client("dynamodb"), own)
    overrides.setdefault("dead_letter_queue_url", resources.queues["ConsumerDeadLetterQueue"].url)
    return settings_for_tests(tables={**resources.tables, **own}, **overrides)


def page_blocks(page: str, heading: str | None = None) -> list[str]:
    """The code blocks of docs/``page``, or of its section ``heading`` (up to the next heading), in order."""
    text = (REPO_ROOT / "docs" / page).read_text(encoding="utf-8")
    if heading is not None:
        text = text[text.index(f"\n{heading}\n") + len(heading) + 2 :]
    end = text.find("\n#", 1)
    text = text if end < 0 else text[:end]
    return re.findall(r"^```\w*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def tables_checklist() -> list[str]:
    """The code blocks of docs/tables.md ("A handler with its own table"), in order: the registration,
    the table, its variable, its grant (then the local trial). Tests follow them as written, so the
    page cannot drift."""
    blocks = page_blocks("tables.md")
    assert len(blocks) == 5, "docs/tables.md's checklist changed shape: update tests/utils.py and its tests"
    return blocks[:4]


def lines_run(work: Callable[[], object]) -> int:
    """The lines of Python ``work`` runs, each pass of a loop counted: the work a test of linear cost compares, with no
    clock in it. A tracer already set (a coverage run's) is given back after."""
    lines = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        lines += event == "line"
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        work()
    finally:
        sys.settrace(previous)
    return lines


def offline_dynamodb() -> Any:
    """A DynamoDB client that reaches no server: for tests that answer it through botocore's Stubber."""
    return session().client("dynamodb")


def together(
    store: IdempotencyStore, transitions: Sequence[Transition[Any]], remaining_ms: Callable[[], int] | None = None
) -> list[object]:
    """Transitions ready at the same moment, each on a thread of its own as a batch's messages run: each one's answer,
    or what it raised. They all join the store's group commit before any starts, so a shared transaction waits for
    every one of them (``store`` needs group commit on, with a wait far longer than the threads take to start)."""
    answers: list[object] = [None] * len(transitions)

    def run(index: int) -> None:
        try:
            answers[index] = store.run(transitions[index], remaining_ms)
        except Exception as error:  # the transition's own outcome, as its message would meet it
            answers[index] = error
        finally:
            store.leave()

    store.join(len(transitions))
    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(transitions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers
