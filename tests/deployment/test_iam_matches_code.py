"""The role grants exactly what the deployed code calls, read from src/consumer.

A new boto3 call or a new kind of business write without its permission fails here,
and so does a permission nothing calls any more. Where an operation lands:

- DynamoDB operations live in the idempotency package and act on the idempotency table;
  TransactWriteItems is authorized per item, by the item kinds its transitions put in it.
  The cold-start check (``sdk.py``) describes every table the function writes.
- The business writes (Put, Update, ...) a handler module constructs act on each table its
  handler declares (``tables``), inside the store's transaction: the processor refuses a
  write to any other, so a new table without its grant fails here.
- SQS operations in ``dead_letter.py`` act on the dead-letter queue, any other on the
  consumer queue; a batch operation needs the single-message action.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from testkit.template import load_template
from tests.deployment.core_lines import CORE_LINES
from tests.deployment.lookups import EVENT_SOURCE_POLLING, grants_by_statement, policy_statements
from tests.deployment.source_scan import (
    PACKAGE_ROOT,
    TRANSACTION_ITEM_ACTIONS,
    business_write_kinds,
    declared_tables,
    operation_uses,
    transaction_item_kinds,
)

ROLE = "ConsumerFunctionRole"
IDEMPOTENCY = "consumer/idempotency/"
DEAD_LETTER = "consumer/dead_letter.py"
COLD_START_CHECKS = "consumer/sdk.py"
HANDLERS = "service/handlers/"
LOGGING = {"ConsumerLogGroup": {"logs:CreateLogStream", "logs:PutLogEvents"}}


def required_grants(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """IAM actions per stack resource that the code at ``root`` needs."""
    required: dict[str, set[str]] = defaultdict(set)
    handler_tables = declared_tables(HANDLERS, root)
    written = {table for tables in handler_tables.values() for table in tables}
    for use in operation_uses(root):
        if use.service == "dynamodb" and use.module == COLD_START_CHECKS:
            for table in {"IdempotencyTable", *written}:
                required[table].add(f"dynamodb:{use.operation}")
        elif use.service == "dynamodb":
            assert use.module.startswith(IDEMPOTENCY), f"{use}: which table does it act on? Map it in this test."
            if use.operation == "TransactWriteItems":
                # writes.py builds the handlers' items, on their own tables (granted below, by handler).
                kinds = transaction_item_kinds(IDEMPOTENCY, root, excluding=f"{IDEMPOTENCY}writes.py")
                required["IdempotencyTable"].update(f"dynamodb:{TRANSACTION_ITEM_ACTIONS[kind]}" for kind in kinds)
            else:
                required["IdempotencyTable"].add(f"dynamodb:{use.operation}")
        elif use.service == "sqs":
            queue = "ConsumerDeadLetterQueue" if use.module == DEAD_LETTER else "ConsumerQueue"
            # SQS authorizes SendMessageBatch, DeleteMessageBatch, ... by the single-message action.
            required[queue].add(f"sqs:{use.operation.removesuffix('Batch')}")
        else:
            raise AssertionError(f"{use}: no resource mapping for {use.service}; add one to this test")
    for module, kinds in business_write_kinds(HANDLERS, root).items():
        assert handler_tables.get(module), f"{module} constructs writes but its handler declares no tables"
        for table in handler_tables[module]:
            required[table].update(f"dynamodb:{TRANSACTION_ITEM_ACTIONS[kind]}" for kind in kinds)
    return dict(required)


def _expected_grants(root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    expected = {**required_grants(root), **LOGGING}
    expected["ConsumerQueue"] = expected.get("ConsumerQueue", set()) | EVENT_SOURCE_POLLING
    return expected


def grant_mistakes(template: dict[str, Any], expected: dict[str, set[str]]) -> list[str]:
    """Each grant the code needs and the role lacks, and each the role has and no code needs, with the statement
    to change (the one granting on that resource; the role when none does)."""
    statements = grants_by_statement(template, ROLE)
    mistakes = []
    for resource in sorted(expected.keys() | {r for by_resource in statements.values() for r in by_resource}):
        granted = {sid: by_resource[resource] for sid, by_resource in statements.items() if resource in by_resource}
        missing = expected.get(resource, set()).difference(*granted.values())
        if missing:
            where, hint = (" or ".join(granted), "") if granted else (ROLE, " (no statement grants on it: add one)")
            mistakes.append(f"missing grant: {where} needs {', '.join(sorted(missing))} on {resource}{hint}")
        for sid, actions in granted.items():
            if extra := sorted(actions - expected.get(resource, set())):
                mistakes.append(
                    f"extra grant: {sid} allows {', '.join(extra)} on {resource}, which no code calls: remove it"
                )
    return mistakes


def test_role_grants_exactly_what_the_code_calls(started_function: str, transformed_template: dict[str, Any]) -> None:
    # Read from code that cannot start, a grant would be advice about the wrong thing: the start's error comes first.
    mistakes = grant_mistakes(transformed_template, _expected_grants())
    if mistakes:
        pytest.fail("\n".join(mistakes), pytrace=False)


def _statement(template: dict[str, Any], sid: str) -> dict[str, Any]:
    (statement,) = [statement for statement in policy_statements(template, ROLE) if statement.get("Sid") == sid]
    return statement


@pytest.fixture
def the_core_alone(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """The core's lines of the template (core-lines.yaml, its role among them) and a copy of the core's code without
    the application: what the self-checks below run on, so that they test this check, never the template or the
    handlers under it."""
    copy = tmp_path / "src"
    shutil.copytree(PACKAGE_ROOT / "consumer", copy / "consumer", ignore=shutil.ignore_patterns("__pycache__"))
    return load_template(CORE_LINES), copy


def test_a_grant_taken_away_or_added_is_named_with_its_statement_and_table(
    the_core_alone: tuple[dict[str, Any], Path],
) -> None:
    template, code = the_core_alone
    assert grant_mistakes(template, _expected_grants(code)) == []
    _statement(template, "FenceIdempotencyRecords")["Action"].remove("dynamodb:DeleteItem")
    _statement(template, "FenceIdempotencyRecords")["Action"].append("dynamodb:Scan")
    assert sorted(grant_mistakes(template, _expected_grants(code))) == [
        "extra grant: FenceIdempotencyRecords allows dynamodb:Scan on IdempotencyTable, which no code calls: remove it",
        "missing grant: FenceIdempotencyRecords needs dynamodb:DeleteItem on IdempotencyTable",
    ]


def test_a_new_call_without_its_permission_is_caught(the_core_alone: tuple[dict[str, Any], Path]) -> None:
    template, code = the_core_alone
    dead_letter = code / "consumer" / "dead_letter.py"
    dead_letter.write_text(
        dead_letter.read_text(encoding="utf-8")
        + "\n\ndef empty_the_dead_letter_queue(sqs, url):\n"
        + "    sqs.purge_queue(QueueUrl=url)\n",
        encoding="utf-8",
    )
    assert grant_mistakes(template, _expected_grants(code)) == [
        "missing grant: ParkPoisonMessages needs sqs:PurgeQueue on ConsumerDeadLetterQueue"
    ]
