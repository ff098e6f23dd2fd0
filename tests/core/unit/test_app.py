"""The Lambda entry point as Lambda calls it: environment, logs and metrics.

The entry point is given the core's test handlers (tests/core/handlers.py) here, not the application's:
it builds whatever it is given.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from consumer import app
from consumer.errors import ConfigurationError
from consumer.handler import build_handlers
from consumer.outcome import Outcome
from testkit.lambda_sqs import LambdaContext, sqs_record
from tests.core.handlers import TallyHandler, tally_body
from tests.core.unit.conftest import (
    IDEMPOTENCY_TABLE,
    TEST_REGISTRY,
    fresh_interpreter,
    function_tables,
    run,
    table_environment,
    total,
)
from tests.utils import settings_for_tests


def test_the_handler_returns_the_partial_batch_response(
    function_env: str, dynamodb: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    event = {"Records": [sqs_record("good", tally_body("p-1")), sqs_record("bad", "{oops")]}

    response, _ = run(event, capsys)

    assert response == {"batchItemFailures": []}
    assert total(dynamodb, "t-1") == 1250


def test_every_record_log_line_carries_its_message_id_and_key_but_never_the_body(
    function_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    body = tally_body("e-secret-777", key="key-42")

    _, lines = run({"Records": [sqs_record("m-42", body)]}, capsys)

    record_lines = [line for line in lines if line.get("message_id") == "m-42"]
    assert record_lines
    assert all(line["idempotency_key"] == "key-42" for line in record_lines)
    assert all("e-secret-777" not in json.dumps(line) for line in lines)


def test_one_metric_per_outcome_is_emitted(function_env: str, capsys: pytest.CaptureFixture[str]) -> None:
    event = {
        "Records": [
            sqs_record("a", tally_body("p-1")),
            sqs_record("b", tally_body("p-1")),
            sqs_record("c", "{oops"),
        ]
    }

    _, lines = run(event, capsys)

    (emf,) = [line for line in lines if "_aws" in line]
    assert emf["_aws"]["CloudWatchMetrics"][0]["Namespace"]
    counts = {outcome.value: emf[outcome.value] for outcome in Outcome}
    # Powertools writes each metric as a list of the values added in this invocation.
    assert counts == {
        "applied": [1.0],
        "duplicate": [1.0],
        "poison": [1.0],
        "in_flight": [0.0],
        "retried": [0.0],
        "conflict": [0.0],
    }
    assert emf["conflicts_absorbed"] == [0.0]


def test_a_missing_setting_fails_the_invocation_with_its_name(
    function_env: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TALLY_TABLE_NAME")

    with pytest.raises(Exception, match="TALLY_TABLE_NAME"):
        app.lambda_handler(TEST_REGISTRY)({"Records": [sqs_record("a", tally_body("p-1"))]}, LambdaContext())


def test_settings_that_cannot_work_together_fail_the_first_invocation_before_any_record(
    function_env: str, dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEASE_MIN_MS", "5000")
    monkeypatch.setenv("LEASE_MAX_MS", "1000")

    with pytest.raises(ConfigurationError, match="LEASE_MIN_MS must not exceed LEASE_MAX_MS"):
        app.lambda_handler(TEST_REGISTRY)({"Records": [sqs_record("a", tally_body("p-1"))]}, LambdaContext())

    # Refused before the message was looked at: nothing applied, nothing claimed.
    assert total(dynamodb, "t-1") == 0
    assert dynamodb.scan(TableName=IDEMPOTENCY_TABLE)["Count"] == 0


@pytest.mark.parametrize("event", [{}, {"Records": None}, {"Records": [{"body": "{}"}]}, [], "text"])
def test_an_event_that_is_not_an_sqs_event_fails_the_invocation_loudly(function_env: str, event: Any) -> None:
    with pytest.raises(ValueError, match="SQS"):
        app.lambda_handler(TEST_REGISTRY)(event, LambdaContext())


def test_a_runtime_sdk_too_old_for_the_store_fails_the_first_invocation_naming_the_version(
    function_env: str, dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("consumer.sdk.missing_features", lambda model: ["UpdateItem"])

    with pytest.raises(ConfigurationError, match="botocore>="):
        app.lambda_handler(TEST_REGISTRY)({"Records": [sqs_record("a", tally_body("p-1"))]}, LambdaContext())

    assert total(dynamodb, "t-1") == 0


def test_a_table_that_does_not_exist_fails_the_first_invocation_naming_it_and_its_variable(
    function_env: str, dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TALLY_TABLE_NAME", "talli")

    with pytest.raises(ConfigurationError, match=r"table TallyTable \(TALLY_TABLE_NAME='talli'\) does not exist"):
        app.lambda_handler(TEST_REGISTRY)({"Records": [sqs_record("a", tally_body("p-1"))]}, LambdaContext())

    # Refused before the message was looked at: no claim to expire, no record to retry one by one.
    assert dynamodb.scan(TableName=IDEMPOTENCY_TABLE)["Count"] == 0


@pytest.mark.parametrize(
    # A failing check (a setting, the SDK, a table) raises ConfigurationError alike: one such case stands for all.
    ("tables_exist", "built_at_init"),
    [(True, 1), (False, 0)],
)
def test_in_lambdas_runtime_the_consumer_is_built_at_init_unless_a_check_fails(
    tables_exist: bool, built_at_init: int
) -> None:
    # A fresh interpreter: Lambda's runtime imports the handler's module once, with its variables set.
    variables = {
        "AWS_LAMBDA_FUNCTION_NAME": "ConsumerFunction",
        **table_environment(),
        "DEAD_LETTER_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/dlq",
    }
    tables = function_tables() if tables_exist else {}
    script = (
        "import boto3, moto; moto.mock_aws().start();"
        " import tests.core.handlers as t;"
        f" t.create_test_tables(boto3.client('dynamodb', region_name='us-east-1'), {tables!r});"
        " from consumer import app; print(int(app.lambda_handler((t.TallyHandler, t.CallHandler)).built))"
    )
    assert int(fresh_interpreter(script, variables)[-1]) == built_at_init


def test_two_handlers_of_one_event_type_are_refused_at_start_naming_both() -> None:
    class AnotherTally(TallyHandler):
        pass

    with pytest.raises(
        ConfigurationError, match="two handlers for eventType 'TallyAdded': TallyHandler and AnotherTally"
    ):
        build_handlers((TallyHandler, AnotherTally), settings_for_tests())
