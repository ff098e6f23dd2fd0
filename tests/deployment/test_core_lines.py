"""The template carries every line its core needs (core-lines.yaml): a template that lags its core after an upgrade
fails here once, naming each line to merge, and the checks that would fail on the same gap skip behind it
(conftest.py). The self-checks run on the core's own lines, never on template.yaml."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

import consumer
from consumer.config import Settings
from testkit.template import load_template
from tests.deployment.core_lines import CORE_LINES, lag, missing_lines, newest_section

FUNCTION = ("Resources", "ConsumerFunction", "Properties")


def test_the_template_carries_every_line_its_core_needs(template_path: Path) -> None:
    lags = lag(template_path)
    if lags:
        pytest.fail(lags, pytrace=False)


def _at(document: Any, *path: str | int) -> Any:
    for key in path:
        document = document[key]
    return document


def test_a_template_lacking_core_lines_is_told_each_in_one_message_with_the_changelog_section(tmp_path: Path) -> None:
    core = load_template(CORE_LINES)
    assert missing_lines(core, core) == []
    lagging = copy.deepcopy(core)
    statements = _at(lagging, "Resources", "ConsumerFunctionRole", "Properties", "Policies", 0, "PolicyDocument")
    statements["Statement"] = [s for s in statements["Statement"] if s["Sid"] != "ParkPoisonMessages"]
    statements["Statement"][3]["Action"].remove("dynamodb:GetItem")
    del _at(lagging, *FUNCTION, "Environment", "Variables")["DEAD_LETTER_QUEUE_URL"]
    del _at(lagging, *FUNCTION, "Environment", "Variables")["POWERTOOLS_LOG_LEVEL"]
    _at(lagging, *FUNCTION, "Events", "Queue", "Properties")["FunctionResponseTypes"] = []
    # The application's lines beside them change nothing.
    _at(lagging, *FUNCTION, "Environment", "Variables")["LEDGER_TABLE_NAME"] = {"Ref": "LedgerTable"}
    path = tmp_path / "template.yaml"
    path.write_text(json.dumps(lagging), encoding="utf-8")

    role = "  Resources.ConsumerFunctionRole.Properties.Policies[consumer].PolicyDocument.Statement"
    function = "  Resources.ConsumerFunction.Properties"
    assert lag(path) == (
        f"template.yaml lags its core (consumer {consumer.__version__}): merge these lines of the core's"
        " (tests/deployment/core-lines.yaml has each in its place); CHANGELOG.md says what each is for, in its sections"
        f' from "## {newest_section()}" down to the version you upgraded from:\n'
        f"{role}[FenceIdempotencyRecords].Action: dynamodb:GetItem\n"
        f"{role}: {{Sid: ParkPoisonMessages, Effect: Allow, Action: [sqs:SendMessage],"
        " Resource: !GetAtt ConsumerDeadLetterQueue.Arn}\n"
        f"{function}.Environment.Variables.DEAD_LETTER_QUEUE_URL: !Ref ConsumerDeadLetterQueue\n"
        f"{function}.Environment.Variables.POWERTOOLS_LOG_LEVEL: <a value of yours>\n"
        f"{function}.Events.Queue.Properties.FunctionResponseTypes: ReportBatchItemFailures"
    )


def test_a_variable_of_the_cores_misspelt_is_left_to_the_check_that_names_the_line_to_rename(tmp_path: Path) -> None:
    lagging = load_template(CORE_LINES)
    variables = _at(lagging, *FUNCTION, "Environment", "Variables")
    variables["IDEMPOTENCY_TABEL_NAME"] = variables.pop("IDEMPOTENCY_TABLE_NAME")
    path = tmp_path / "template.yaml"
    path.write_text(json.dumps(lagging), encoding="utf-8")
    assert lag(path) is None
    # Gone, not misspelt: a line to merge.
    del variables["IDEMPOTENCY_TABEL_NAME"]
    path.write_text(json.dumps(lagging), encoding="utf-8")
    assert str(lag(path)).endswith("Environment.Variables.IDEMPOTENCY_TABLE_NAME: !Ref IdempotencyTable")


def test_the_changelog_section_named_is_the_newest_with_an_entry(tmp_path: Path) -> None:
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text(
        "# Changelog\n\n## Unreleased\n\nNothing yet.\n\n## 2.1.0\n\n- a change\n\n## 2.0.0\n\n- one\n"
    )
    assert newest_section(changelog) == "2.1.0"
    changelog.write_text(changelog.read_text().replace("Nothing yet.", "- a line the core now needs"))
    assert newest_section(changelog) == "Unreleased"


def test_the_core_lines_give_every_setting_the_core_requires() -> None:
    variables = _at(load_template(CORE_LINES), *FUNCTION, "Environment", "Variables")
    required = [name.upper() for name, field in Settings.model_fields.items() if field.is_required()]
    assert required and [name for name in required if name not in variables] == []
