"""The function, its event source mapping, its environment and its logs."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path
from typing import Any

import pytest

from consumer.config import Settings
from consumer.handler import declared_settings, declared_tables
from service.registry import HANDLERS
from testkit.lambda_venv import LAMBDA_PYTHON_VERSION
from testkit.template import REPO_ROOT, ResourceRef, Template
from tests.deployment.conftest import start_error
from tests.deployment.environment import FUNCTION, environment_mistakes, table_source
from tests.deployment.lookups import endpoint_mistakes, parameter_name, properties, read


def _as_environment_value(value: Any) -> str:
    """What Lambda would put in the variable, with a stand-in for values known only after deployment."""
    if isinstance(value, ResourceRef):
        return f"{value.logical_id}-after-deployment"
    return str(value)


def test_function_runs_the_handler_on_python_3_13_arm64(
    source_template: dict[str, Any], transformed_template: dict[str, Any]
) -> None:
    function = properties(transformed_template, "ConsumerFunction")
    assert function["Runtime"] == "python3.13"
    # The build (the Makefile's FUNCTION_PYTHON) and the local runtime's venv use the same version.
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert f"\nFUNCTION_PYTHON := {LAMBDA_PYTHON_VERSION}\n" in makefile
    assert function["Runtime"] == f"python{LAMBDA_PYTHON_VERSION}"
    # arm64 unless the stack is deployed with Architecture=x86_64 (the build step reads the same parameter).
    assert function["Architectures"] == [{"Ref": "Architecture"}]
    architecture = source_template["Parameters"]["Architecture"]
    assert (architecture["Default"], architecture["AllowedValues"]) == ("arm64", ["arm64", "x86_64"])
    assert function["Role"] == {"Fn::GetAtt": ["ConsumerFunctionRole", "Arn"]}

    code_uri = properties(source_template, "ConsumerFunction")["CodeUri"]
    module_name, _, attribute = function["Handler"].rpartition(".")
    assert (REPO_ROOT / code_uri / (module_name.replace(".", "/") + ".py")).is_file()
    assert callable(getattr(importlib.import_module(module_name), attribute))


def test_environment_is_what_the_code_reads(
    registered_handlers: None, transformed_template: dict[str, Any], template_path: Path
) -> None:
    # Every variable the code needs, each table's as a !Ref to it; and nothing it does not read: a misspelt name
    # is silently ignored by the code, so here it is an error, with the line to fix.
    variables = properties(transformed_template, FUNCTION)["Environment"]["Variables"]
    mistakes = environment_mistakes(template_path, variables)
    if mistakes:
        pytest.fail("\n".join(mistakes), pytrace=False)


def test_each_endpoint_setting_comes_from_a_parameter_the_local_stack_can_point_at_its_sink(
    registered_handlers: None, transformed_template: dict[str, Any]
) -> None:
    mistakes = endpoint_mistakes(transformed_template, declared_settings(HANDLERS))
    if mistakes:
        pytest.fail("\n".join(mistakes), pytrace=False)


def test_the_function_starts(function_start: subprocess.CompletedProcess[str]) -> None:
    # What stops the function starting stops every invocation: said once, in the start's own words (a guard on an
    # optimistic handler, a setting refused, two handlers of one event type, ...), before any check that needs it.
    if error := start_error(function_start):
        pytest.fail(f"the function cannot start: {error}", pytrace=False)


def test_environment_at_the_defaults_is_accepted_by_the_settings(
    started_function: str, function_variables: dict[str, Any], resolver: Template, template_path: Path
) -> None:
    variables = resolver.resolve(function_variables)
    environment = {name: _as_environment_value(value) for name, value in variables.items()}
    settings = Settings.from_env(
        environment, tables=declared_tables(HANDLERS), handler_settings=declared_settings(HANDLERS)
    )
    assert settings.idempotency_table_name == "IdempotencyTable-after-deployment"
    # A table's resource, or the parameter naming an existing one.
    names = {
        table: resolver.resolve({"Ref": table_source(template_path, table)}) for table in declared_tables(HANDLERS)
    }
    assert settings.table_names == {table: _as_environment_value(name) for table, name in names.items()}
    assert settings.dead_letter_queue_url == "ConsumerDeadLetterQueue-after-deployment"
    assert settings.idempotency_ttl_seconds == 7 * 24 * 3600


def test_function_logs_to_its_own_log_group_with_bounded_retention(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    # Its logging config alone: the environment's mistakes are test_environment_is_what_the_code_reads's to name.
    logging = resolver.resolve(properties(transformed_template, "ConsumerFunction")["LoggingConfig"])
    assert logging["LogGroup"] == ResourceRef("ConsumerLogGroup")
    log_group = properties(transformed_template, "ConsumerLogGroup")
    assert resolver.resolve(log_group["RetentionInDays"]) == 30
    retention_parameter = parameter_name(log_group["RetentionInDays"])
    assert read(transformed_template, **{retention_parameter: 90}).resolve(log_group["RetentionInDays"]) == 90
