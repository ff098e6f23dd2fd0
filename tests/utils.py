"""Helpers shared by the test suites."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from consumer.config import Settings
from consumer.handlers import declared_settings, declared_tables
from testkit.template import REPO_ROOT

IDEMPOTENCY_TABLE = "idempotency"
LEDGER_TABLE = "ledger"


def table_name_for_tests(logical_id: str) -> str:
    """What the unit tests call a template table: LedgerTable -> ledger, InventoryTable -> inventory."""
    return logical_id.removesuffix("Table").lower()


def settings_for_tests(tables: Mapping[str, Any] | None = None, **overrides: Any) -> Settings:
    """The function's settings as tests build them: the one place a new required setting is given a value.

    The idempotency table and every table a registered handler declares are named by
    ``table_name_for_tests``, or by ``tables`` (logical id -> a name, or a deployed resource
    with a ``name``), so a handler with a table of its own needs no change here. An override that
    is no field of ``Settings`` sets a registered handler's own setting (``receipt_webhook_url=...``).
    """
    own = {name.upper(): str(overrides.pop(name)) for name in set(overrides) - set(Settings.model_fields)}
    declared = {name.upper() for model in declared_settings() for name in model.model_fields}
    assert set(own) <= declared, f"no setting and no registered handler's setting: {sorted(set(own) - declared)}"
    given = {table: getattr(name, "name", name) for table, name in (tables or {}).items()}
    names = {table: given.get(table, table_name_for_tests(table)) for table in ("IdempotencyTable", *declared_tables())}
    values: dict[str, Any] = {
        "idempotency_table_name": names.pop("IdempotencyTable"),
        "dead_letter_queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/test-dlq",
        "table_names": names,
        "handler_variables": own,
    }
    return Settings(**(values | overrides))


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
