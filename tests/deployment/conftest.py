from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from consumer.handler import declared_destinations, declared_tables
from service.registry import HANDLERS
from testkit.aws import DUMMY_CREDENTIALS_ENV
from testkit.template import REPO_ROOT, TEMPLATE_PATH, Template, TemplateError, load_template
from tests.deployment.core_lines import lag
from tests.deployment.environment import FUNCTION, environment_mistakes, unregistered_handlers
from tests.deployment.lookups import destination_mistakes, properties, read, table_mistakes, transform

# The template the static checks read: template.yaml, or a copy (the test that a mistake stops `make test` early).
TEMPLATE_VARIABLE = "STATIC_CHECKS_TEMPLATE"


@pytest.fixture(scope="session")
def template_path() -> Path:
    return Path(os.environ.get(TEMPLATE_VARIABLE) or TEMPLATE_PATH)


def parameter_mistake(template_path: Path) -> str | None:
    """Why the template cannot be read with its parameters' values (one lacks a Default and a local value)."""
    try:
        Template.from_file(template_path)
    except TemplateError as error:
        return str(error)
    return None


@pytest.fixture(scope="session")
def source_template(template_path: Path) -> dict[str, Any]:
    # Every check reads the template with its parameters' values: one missing is test_outputs_and_config's one failure.
    if parameter_mistake(template_path):
        pytest.skip("a parameter has no value: test_every_parameter_has_a_value_for_the_checks names it")
    # A template that lags its core would fail many checks, each its own way: test_core_lines names what to merge.
    if lag(template_path):
        pytest.skip("the template lags its core: test_the_template_carries_every_line_its_core_needs names the lines")
    return load_template(template_path)


@pytest.fixture(scope="session")
def transformed_template(source_template: dict[str, Any]) -> dict[str, Any]:
    """The template as CloudFormation reads it."""
    return transform(source_template)


@pytest.fixture(scope="session")
def resolver(transformed_template: dict[str, Any]) -> Template:
    """The transformed template read with every parameter at its default."""
    return read(transformed_template)


# A mistake is reported once, by the check that names its cause: the checks that depend on what it breaks skip. In
# order: each parameter with a value (above), each handler file registered (tests/app/test_handler_registry.py),
# each table a handler declares in the template (test_tables.py), the function's environment what the code reads and
# the function able to start (test_function.py); for the relay's checks, each destination a handler declares in the
# template (test_relay.py).
@pytest.fixture(scope="session")
def registered_handlers(transformed_template: dict[str, Any]) -> None:
    """For the tests that read the handlers' needs from HANDLERS and the template: a handler file left out, or a table
    a handler declares that the template lacks, skips them."""
    if unregistered_handlers():
        pytest.skip("a handler file is not registered: test_every_handler_file_is_registered_in_handlers names it")
    if table_mistakes(transformed_template, declared_tables(HANDLERS)):
        pytest.skip(
            "a handler's table has a mistake: test_each_table_a_handler_declares_is_a_template_table_or_given"
            "_by_its_parameter names it"
        )


@pytest.fixture(scope="session")
def relay_destinations(registered_handlers: None, transformed_template: dict[str, Any]) -> tuple[str, ...]:
    """The destinations the handlers declare, for the relay's checks: one the template lacks skips them."""
    declared = declared_destinations(HANDLERS)
    if destination_mistakes(transformed_template, declared):
        pytest.skip(
            "a handler's destination is not in the template: test_each_destination_a_handler_declares_is_a_queue"
            "_topic_or_bus_of_the_template names it"
        )
    return declared


@pytest.fixture(scope="session")
def function_variables(
    registered_handlers: None, transformed_template: dict[str, Any], template_path: Path
) -> dict[str, Any]:
    """The function's environment variables, for the tests that need them right. With a mistake in them those
    tests skip: test_function's check of the environment is the one failure, and it names the line to fix."""
    variables: dict[str, Any] = properties(transformed_template, FUNCTION)["Environment"]["Variables"]
    if environment_mistakes(template_path, variables):
        pytest.skip("the function's environment has a mistake: test_environment_is_what_the_code_reads names it")
    return variables


# The real handler on an empty batch in a process of its own, with the function's environment, its tables in moto: as
# Lambda starts it, so what stops it starting (a handler's ConfigurationError) is its last line; it prints the EMF
# documents of an invocation (every outcome counted at zero, under the namespace and dimensions it deploys with).
_START = """
import boto3, moto
from consumer.config import Settings
from consumer.handler import declared_tables
from service.registry import HANDLERS
from testkit.tables import create_template_tables

moto.mock_aws().start()
create_template_tables(boto3.client("dynamodb"), Settings.from_env(tables=declared_tables(HANDLERS)).every_table())
from service.lambda_function import handler

class Context:
    function_name = "ConsumerFunction"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:ConsumerFunction"
    aws_request_id = "static-checks"
    def get_remaining_time_in_millis(self):
        return 30_000

handler({"Records": []}, Context())
"""


@pytest.fixture(scope="session")
def function_start(function_variables: dict[str, Any], resolver: Template) -> subprocess.CompletedProcess[str]:
    """The function started with its template's environment (the parameters at their defaults) and invoked once."""
    variables = resolver.resolve(function_variables)
    return subprocess.run(
        [sys.executable, "-c", _START],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO_ROOT,
        env={
            "PATH": os.environ.get("PATH", ""),
            "PYTHONPATH": f"{REPO_ROOT / 'src'}{os.pathsep}{REPO_ROOT}",
            **DUMMY_CREDENTIALS_ENV,
            **{name: str(value) for name, value in variables.items()},
        },
    )


def start_error(start: subprocess.CompletedProcess[str]) -> str | None:
    """Why the function cannot start (the last line of its traceback), or ``None`` when it started."""
    return (start.stderr.strip().splitlines() or ["no output"])[-1] if start.returncode else None


@pytest.fixture(scope="session")
def started_function(function_start: subprocess.CompletedProcess[str]) -> str:
    """What the started function printed, for the tests that need it to start; they skip when it cannot."""
    if start_error(function_start):
        pytest.skip("the function cannot start: test_the_function_starts names why")
    return function_start.stdout
