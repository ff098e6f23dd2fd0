"""The relay: a second function of the core, fed by the outbox table's stream, that sends each outbox item to its
destination. The static checks know a destination as they know a table: each one a handler declares
(``MessageHandler.destinations``) is a queue, topic or bus of the template, its address reaches the relay in a variable
named after it, and the relay's role may send to it (test_iam_matches_code.py); each missing piece one failure in its
own words, the others skipping behind a destination the template lacks (conftest.py's ``relay_destinations``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from consumer.config import destination_variable
from consumer.handler import declared_destinations
from consumer.outbox import OUTBOX_TABLE
from service.registry import HANDLERS
from testkit.template import REPO_ROOT, ResourceRef, Template, load_template
from tests.deployment.core_lines import CORE_LINES
from tests.deployment.environment import FUNCTION, RELAY, relay_environment_mistakes
from tests.deployment.lookups import destination_mistakes, event_source_mapping, properties

# A stream keeps a record 24 hours: a record age beyond it would never be reached.
STREAM_RETENTION_S = 24 * 3600


def test_each_destination_a_handler_declares_is_a_queue_topic_or_bus_of_the_template(
    transformed_template: dict[str, Any],
) -> None:
    # Its variable in the relay's environment and its grant: the test below and test_iam_matches_code's.
    if mistakes := destination_mistakes(transformed_template, declared_destinations(HANDLERS)):
        pytest.fail("\n".join(mistakes), pytrace=False)


def test_the_relays_environment_gives_it_each_destination(
    relay_destinations: tuple[str, ...], transformed_template: dict[str, Any], template_path: Path
) -> None:
    variables = properties(transformed_template, RELAY)["Environment"]["Variables"]
    if mistakes := relay_environment_mistakes(template_path, variables, relay_destinations):
        pytest.fail("\n".join(mistakes), pytrace=False)


def test_the_outbox_stream_feeds_the_relay_with_partial_batch_responses_halving_and_bounded_retries(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    mapping = resolver.resolve(event_source_mapping(transformed_template, RELAY))
    assert mapping["EventSourceArn"] == ResourceRef(OUTBOX_TABLE, "StreamArn")
    assert mapping["StartingPosition"] == "TRIM_HORIZON"
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["BisectBatchOnFunctionError"] is True
    # Bounded both ways (-1, Lambda's default, retries until the stream drops the record), the age within the stream's.
    assert 0 <= mapping["MaximumRetryAttempts"] <= 100
    assert 60 <= mapping["MaximumRecordAgeInSeconds"] < STREAM_RETENTION_S
    assert mapping["DestinationConfig"] == {"OnFailure": {"Destination": ResourceRef("RelayDeadLetterQueue", "Arn")}}
    assert mapping.get("ParallelizationFactor", 1) == 1
    # The relay is handed the items put (an outbox item is never updated), not their TTL deletions.
    (only,) = mapping["FilterCriteria"]["Filters"]
    assert json.loads(only["Pattern"]) == {"eventName": ["INSERT"]}


def test_the_relay_is_built_and_run_as_the_function_is_with_the_cores_relay_alone(
    source_template: dict[str, Any], transformed_template: dict[str, Any]
) -> None:
    relay, function = (properties(transformed_template, name) for name in (RELAY, FUNCTION))
    assert relay["Handler"] == "consumer.relay.handler"
    for setting in ("Runtime", "Architectures", "MemorySize"):
        assert relay[setting] == function[setting], setting
    written = {name: source_template["Resources"][name] for name in (RELAY, FUNCTION)}
    assert written[RELAY]["Properties"]["CodeUri"] == written[FUNCTION]["Properties"]["CodeUri"]
    for key in ("BuildMethod", "ContextPath"):
        assert written[RELAY]["Metadata"][key] == written[FUNCTION]["Metadata"][key], key
    # sam build runs build-<logical id>: the relay's ships the core, not the application.
    planned = subprocess.run(
        ["make", "-n", "-f", str(REPO_ROOT / "Makefile"), f"build-{RELAY}", "ARTIFACTS_DIR=/nowhere"],
        cwd=REPO_ROOT / "src",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert 'cp -R consumer "/nowhere/"' in planned and "-r requirements.txt" in planned


def test_the_relay_logs_to_its_own_log_group_with_the_functions_retention(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    logging = resolver.resolve(properties(transformed_template, RELAY)["LoggingConfig"])
    assert logging["LogGroup"] == ResourceRef("RelayLogGroup")
    retention = (
        properties(transformed_template, group)["RetentionInDays"] for group in ("RelayLogGroup", "ConsumerLogGroup")
    )
    assert next(retention) == next(retention)


# The relay's part of the core's lines, with destinations crafted beside it: no handler of the core's emits yet.
def _relay_template(tmp_path: Path, variables: dict[str, Any]) -> Path:
    document = load_template(CORE_LINES)
    document["Resources"]["ReceiptQueue"] = {"Type": "AWS::SQS::Queue"}
    document["Resources"][RELAY]["Properties"]["Environment"]["Variables"] = variables
    path = tmp_path / "template.yaml"
    path.write_text(json.dumps(document, indent=1), encoding="utf-8")
    return path


def test_a_destinations_variable_missing_misspelt_or_left_behind_is_named_with_the_line_to_write(
    tmp_path: Path,
) -> None:
    declared = ("ReceiptQueue",)
    assert destination_variable("ReceiptQueue") == "RECEIPT_QUEUE_DESTINATION"
    powertools = {"POWERTOOLS_SERVICE_NAME": "s"}
    right = {**powertools, "RECEIPT_QUEUE_DESTINATION": {"Ref": "ReceiptQueue"}}
    assert relay_environment_mistakes(_relay_template(tmp_path, right), right, declared) == []

    path = _relay_template(tmp_path, powertools)
    assert relay_environment_mistakes(path, powertools, declared) == [
        f"{path}:{_line(path, 'Variables')}: {RELAY}'s Environment.Variables lacks RECEIPT_QUEUE_DESTINATION:"
        ' add "RECEIPT_QUEUE_DESTINATION: !Ref ReceiptQueue" under it'
    ]
    misspelt = {**powertools, "RECIEPT_QUEUE_DESTINATION": {"Ref": "ReceiptQueue"}}
    path = _relay_template(tmp_path, misspelt)
    assert relay_environment_mistakes(path, misspelt, declared) == [
        f"{path}:{_line(path, 'RECIEPT_QUEUE_DESTINATION')}: {RELAY} sets RECIEPT_QUEUE_DESTINATION, which no code"
        ' reads: rename it to "RECEIPT_QUEUE_DESTINATION: !Ref ReceiptQueue"'
    ]
    wrong = {**powertools, "RECEIPT_QUEUE_DESTINATION": {"Fn::GetAtt": ["ReceiptQueue", "Arn"]}}
    path = _relay_template(tmp_path, wrong)
    assert relay_environment_mistakes(path, wrong, declared) == [
        f"{path}:{_line(path, 'RECEIPT_QUEUE_DESTINATION')}: RECEIPT_QUEUE_DESTINATION is"
        " {'Fn::GetAtt': ['ReceiptQueue', 'Arn']}; the function needs"
        ' "RECEIPT_QUEUE_DESTINATION: !Ref ReceiptQueue"'
    ]
    # A destination no handler declares any more: its variable is left behind.
    path = _relay_template(tmp_path, right)
    assert relay_environment_mistakes(path, right, ()) == [
        f"{path}:{_line(path, 'RECEIPT_QUEUE_DESTINATION')}: {RELAY} sets RECEIPT_QUEUE_DESTINATION, which no code"
        " reads (a misspelt name is silently ignored): remove the line or correct the name"
    ]


def _line(path: Path, text: str) -> int:
    """The last line (1-based) of ``path`` that names ``text`` as a key: the relay's, which comes last."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return max(number for number, line in enumerate(lines, 1) if line.strip().startswith(f'"{text}"'))


def test_a_destination_the_template_lacks_or_that_is_no_queue_topic_or_bus_is_named() -> None:
    template = load_template(CORE_LINES)
    template["Resources"]["OrdersTopic"] = {"Type": "AWS::SNS::Topic"}
    assert destination_mistakes(template, ("OrdersTopic",)) == []
    assert destination_mistakes(template, ("ReceiptQueue", OUTBOX_TABLE)) == [
        "a handler declares ReceiptQueue as a destination: add an AWS::SQS::Queue, AWS::SNS::Topic or"
        " AWS::Events::EventBus of that name to template.yaml",
        f"a handler declares {OUTBOX_TABLE} as a destination, but template.yaml's {OUTBOX_TABLE} is an"
        " AWS::DynamoDB::Table: a handler emits to an AWS::SQS::Queue, AWS::SNS::Topic or AWS::Events::EventBus"
        " alone",
    ]
