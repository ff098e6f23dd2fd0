from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from testkit.template import TEMPLATE_PATH, Template, TemplateError, load_template, transform
from tests.deployment.environment import FUNCTION, environment_mistakes
from tests.deployment.lookups import properties, read

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
    return load_template(template_path)


@pytest.fixture(scope="session")
def transformed_template(source_template: dict[str, Any]) -> dict[str, Any]:
    return transform(source_template)


@pytest.fixture(scope="session")
def resolver(transformed_template: dict[str, Any]) -> Template:
    """The transformed template read with every parameter at its default."""
    return read(transformed_template)


@pytest.fixture(scope="session")
def function_variables(transformed_template: dict[str, Any], template_path: Path) -> dict[str, Any]:
    """The function's environment variables, for the tests that need them right. With a mistake in them those
    tests skip: test_function's check of the environment is the one failure, and it names the line to fix."""
    variables: dict[str, Any] = properties(transformed_template, FUNCTION)["Environment"]["Variables"]
    if environment_mistakes(template_path, variables):
        pytest.skip("the function's environment has a mistake: test_environment_is_what_the_code_reads names it")
    return variables
