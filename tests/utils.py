"""Helpers shared by the test suites."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

from consumer.config import Settings
from service.registry import HANDLERS
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
    try:
        return settings_for((TallyHandler, CallHandler, *HANDLERS), tables, **overrides)
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


def offline_dynamodb() -> Any:
    """A DynamoDB client that reaches no server: for tests that answer it through botocore's Stubber."""
    return session().client("dynamodb")
