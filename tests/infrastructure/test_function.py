"""The function, its event source mapping, its environment and its logs."""

from __future__ import annotations

import ast
import importlib
import re
from typing import Any

from consumer.config import Settings, is_secret_arn, table_variable
from consumer.handlers import declared_settings, declared_tables
from testkit.template import REPO_ROOT, ResourceRef, Template
from tests.infrastructure.lookups import parameter_name, properties, read
from tests.infrastructure.source_scan import package_modules

_VARIABLE_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
# The variables the function is documented to take from its stack, beside each declared table's.
STACK_PROVIDED_VARIABLES = {
    "IDEMPOTENCY_TABLE_NAME",
    "DEAD_LETTER_QUEUE_URL",
    "IDEMPOTENCY_TTL_SECONDS",
    "POWERTOOLS_SERVICE_NAME",
    "POWERTOOLS_METRICS_NAMESPACE",
    "POWERTOOLS_LOG_LEVEL",
}


def _handler_variables(only_stack_provided: bool = False) -> set[str]:
    """The variables of the registered handlers' own settings; ``only_stack_provided``: those the stack must
    give (a setting without a default, and one naming a secret, whose grant takes the same parameter)."""
    return {
        name.upper()
        for model in declared_settings()
        for name, field in model.model_fields.items()
        if not only_stack_provided or field.is_required() or is_secret_arn(model, name)
    }


def _variables_the_code_reads() -> set[str]:
    """Settings' fields (read as upper-case variables), the declared tables' variables, the handlers' own
    settings, and names passed to ``env.get`` or ``os.environ.get``."""
    names = {field.upper() for field in Settings.model_fields if field not in ("table_names", "handler_variables")}
    names.update(table_variable(table) for table in declared_tables())
    names.update(_handler_variables())
    for tree in package_modules().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                names.update(
                    arg.value
                    for arg in node.args
                    if isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and _VARIABLE_NAME.fullmatch(arg.value)
                )
    return names


def _as_environment_value(value: Any) -> str:
    """What Lambda would put in the variable, with a stand-in for values known only after deployment."""
    if isinstance(value, ResourceRef):
        return f"{value.logical_id}-after-deployment"
    return str(value)


def test_function_runs_the_handler_on_python_3_12_arm64(
    source_template: dict[str, Any], transformed_template: dict[str, Any]
) -> None:
    function = properties(transformed_template, "ConsumerFunction")
    assert function["Runtime"] == "python3.12"
    # arm64 unless the stack is deployed with Architecture=x86_64 (the build step reads the same parameter).
    assert function["Architectures"] == [{"Ref": "Architecture"}]
    architecture = source_template["Parameters"]["Architecture"]
    assert (architecture["Default"], architecture["AllowedValues"]) == ("arm64", ["arm64", "x86_64"])
    assert function["Role"] == {"Fn::GetAtt": ["ConsumerFunctionRole", "Arn"]}

    code_uri = properties(source_template, "ConsumerFunction")["CodeUri"]
    module_name, _, attribute = function["Handler"].rpartition(".")
    assert (REPO_ROOT / code_uri / (module_name.replace(".", "/") + ".py")).is_file()
    assert callable(getattr(importlib.import_module(module_name), attribute))


def test_environment_provides_what_the_function_reads_and_nothing_it_does_not(
    transformed_template: dict[str, Any],
) -> None:
    variables = set(properties(transformed_template, "ConsumerFunction")["Environment"]["Variables"])
    tables = {table_variable(table) for table in declared_tables()}
    assert variables >= STACK_PROVIDED_VARIABLES | tables | _handler_variables(only_stack_provided=True)
    # A misspelt name is silently ignored by the code; here it is an error.
    unread = {name for name in variables - _variables_the_code_reads() if not name.startswith("POWERTOOLS_")}
    assert unread == set()


def test_environment_at_the_defaults_is_accepted_by_the_settings(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    variables = resolver.resolve(properties(transformed_template, "ConsumerFunction")["Environment"]["Variables"])
    environment = {name: _as_environment_value(value) for name, value in variables.items()}
    settings = Settings.from_env(environment, tables=declared_tables(), handler_settings=declared_settings())
    assert settings.idempotency_table_name == "IdempotencyTable-after-deployment"
    assert settings.table_names == {table: f"{table}-after-deployment" for table in declared_tables()}
    assert settings.dead_letter_queue_url == "ConsumerDeadLetterQueue-after-deployment"
    assert settings.idempotency_ttl_seconds == 7 * 24 * 3600


def test_function_logs_to_its_own_log_group_with_bounded_retention(
    transformed_template: dict[str, Any], resolver: Template
) -> None:
    function = resolver.resolve(properties(transformed_template, "ConsumerFunction"))
    assert function["LoggingConfig"]["LogGroup"] == ResourceRef("ConsumerLogGroup")
    log_group = properties(transformed_template, "ConsumerLogGroup")
    assert resolver.resolve(log_group["RetentionInDays"]) == 30
    retention_parameter = parameter_name(log_group["RetentionInDays"])
    assert read(transformed_template, **{retention_parameter: 90}).resolve(log_group["RetentionInDays"]) == 90
