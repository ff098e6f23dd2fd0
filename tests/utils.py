"""Helpers shared by the test suites."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from consumer.config import Settings
from consumer.handler import declared_settings, declared_tables
from service.registry import HANDLERS
from testkit.aws import session
from testkit.template import REPO_ROOT
from tests.handlers import TEST_TABLES, create_test_tables

if TYPE_CHECKING:
    from testkit.servers import LocalServers

IDEMPOTENCY_TABLE = "idempotency"


def table_name_for_tests(logical_id: str) -> str:
    """What the unit tests call a template table: LedgerTable -> ledger, InventoryTable -> inventory."""
    return logical_id.removesuffix("Table").lower()


def settings_for_tests(tables: Mapping[str, Any] | None = None, **overrides: Any) -> Settings:
    """The function's settings as tests build them: the one place a new required setting is given a value.

    The idempotency table, the core's test handlers' tables (tests/handlers.py) and every table a
    registered handler declares are named by ``table_name_for_tests``, or by ``tables`` (logical
    id -> a name, or a deployed resource with a ``name``), so a handler with a table of its own
    needs no change here, and the core's tests need none of the registered handlers. An override
    that is no field of ``Settings`` sets a registered handler's own setting (``receipt_webhook_url=...``).
    """
    own = {name.upper(): str(overrides.pop(name)) for name in set(overrides) - set(Settings.model_fields)}
    declared = {name.upper() for model in declared_settings(HANDLERS) for name in model.model_fields}
    assert set(own) <= declared, f"no setting and no registered handler's setting: {sorted(set(own) - declared)}"
    given = {table: getattr(name, "name", name) for table, name in (tables or {}).items()}
    every = dict.fromkeys(("IdempotencyTable", *TEST_TABLES, *declared_tables(HANDLERS), *given))
    names = {table: given.get(table, table_name_for_tests(table)) for table in every}
    values: dict[str, Any] = {
        "idempotency_table_name": names.pop("IdempotencyTable"),
        "dead_letter_queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/test-dlq",
        "table_names": names,
        "handler_variables": own,
    }
    return Settings(**(values | overrides))


def settings_on_local_servers(servers: LocalServers, **overrides: Any) -> Settings:
    """The template's tables and queues deployed afresh on the local servers, the test handlers' tables made
    beside them (named after this deployment's), and settings naming them all."""
    resources = servers.deploy()
    prefix = resources.tables["IdempotencyTable"].name
    own = {table: f"{prefix}-{table}" for table in TEST_TABLES}
    create_test_tables(servers.client("dynamodb"), own)
    overrides.setdefault("dead_letter_queue_url", resources.queues["ConsumerDeadLetterQueue"].url)
    return settings_for_tests(tables={**resources.tables, **own}, **overrides)


def readme_checklist() -> list[str]:
    """The code blocks of README's "A handler with its own table", in order: the registration,
    the table, its variable, its grant (then the local trial). Tests follow them as written, so the
    README cannot drift."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### A handler with its own table") :]
    section = section[: section.index("\n## ")]
    blocks = re.findall(r"^```\w*\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 5, "README's checklist changed shape: update tests/utils.py and the tests that follow it"
    return blocks[:4]


class Remaining:
    """A remaining time the test sets: fixed, or read from a script and then its last value."""

    def __init__(self, ms: int = 30_000, then: list[int] | None = None) -> None:
        self.ms = ms
        self._script = list(then or [])

    def __call__(self) -> int:
        if self._script:
            self.ms = self._script.pop(0)
        return self.ms


def offline_dynamodb() -> Any:
    """A DynamoDB client that reaches no server: for tests that answer it through botocore's Stubber."""
    return session().client("dynamodb")
