"""The functions' environments against what the code reads, as mistakes a user can act on: each names the
variable, the template's file:line, and the line to write there. The consumer's, and the relay's (one variable per
destination a handler declares)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cfnlint.decode import cfn_yaml

import service.handlers
from consumer.config import Settings, destination_variable, is_secret_arn, table_parameter, table_variable
from consumer.handler import MessageHandler, declared_settings, declared_tables
from service.registry import HANDLERS
from testkit.template import load_template
from tests.deployment.core_lines import core_variables, misspelt_as
from tests.deployment.lookups import CORE_TABLES
from tests.deployment.source_scan import package_modules

FUNCTION = "ConsumerFunction"
RELAY = "RelayFunction"
_VARIABLE_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
# The variables the core takes from its stack (core-lines.yaml), beside each declared table's and the handlers'.
STACK_PROVIDED_VARIABLES = set(core_variables())


def handler_classes() -> list[type[MessageHandler[Any]]]:
    """Each concrete MessageHandler defined in a module under src/service/handlers/."""
    found = []
    for module_info in pkgutil.iter_modules(service.handlers.__path__):
        module = importlib.import_module(f"service.handlers.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, MessageHandler) and not inspect.isabstract(cls) and cls.__module__ == module.__name__:
                found.append(cls)
    return found


def unregistered_handlers() -> list[str]:
    """The handler classes under src/service/handlers/ that HANDLERS leaves out (their messages would only show as
    UnknownEventType dead letters)."""
    return [cls.__name__ for cls in handler_classes() if cls not in HANDLERS]


def handler_variables(only_stack_provided: bool = False) -> set[str]:
    """The variables of the registered handlers' own settings; ``only_stack_provided``: those the stack must
    give (a setting without a default, and one naming a secret, whose grant takes the same parameter)."""
    return {
        name.upper()
        for model in declared_settings(HANDLERS)
        for name, field in model.model_fields.items()
        if not only_stack_provided or field.is_required() or is_secret_arn(model, name)
    }


def variables_the_code_reads() -> set[str]:
    """Settings' fields (read as upper-case variables), the declared tables' variables, the handlers' own
    settings, and names passed to ``env.get`` or ``os.environ.get``."""
    names = {field.upper() for field in Settings.model_fields if field not in ("table_names", "handler_variables")}
    names.update(table_variable(table) for table in (*CORE_TABLES, *declared_tables(HANDLERS)))
    names.update(handler_variables())
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


def _lines(template_path: Path, function: str) -> tuple[int, dict[str, int]]:
    """The line of the function's ``Variables:`` and of each variable in it (1-based)."""
    document = cfn_yaml.loads(template_path.read_text(encoding="utf-8"), str(template_path))
    environment = document["Resources"][function]["Properties"]["Environment"]
    (key,) = [key for key in environment if key == "Variables"]
    return key.start_mark.line + 1, {name: name.start_mark.line + 1 for name in environment["Variables"]}


def table_source(template_path: Path, table: str) -> str:
    """What a table's variable refers to: the table's resource, or the parameter naming an existing one, if the template
    has that parameter and no such resource."""
    document = load_template(template_path)
    parameter = table_parameter(table)
    return parameter if table not in document["Resources"] and parameter in document.get("Parameters", {}) else table


def environment_mistakes(template_path: Path, variables: Mapping[str, Any]) -> list[str]:
    """What is wrong with ``variables`` (the consumer's, from ``template_path``), one sentence per mistake."""
    wanted: dict[str, str | None] = dict.fromkeys(
        STACK_PROVIDED_VARIABLES | handler_variables(only_stack_provided=True)
    )
    wanted.update(
        {
            table_variable(table): table_source(template_path, table)
            for table in (*CORE_TABLES, *declared_tables(HANDLERS))
        }
    )
    return _mistakes(template_path, FUNCTION, variables, wanted, variables_the_code_reads())


def relay_environment_mistakes(
    template_path: Path, variables: Mapping[str, Any], destinations: tuple[str, ...]
) -> list[str]:
    """What is wrong with ``variables`` (the relay's): it reads one variable per destination, a ``!Ref`` of it (a
    queue's URL, a topic's ARN, a bus's name), and Powertools' own."""
    wanted: dict[str, str | None] = {destination_variable(destination): destination for destination in destinations}
    return _mistakes(template_path, RELAY, variables, wanted, set(wanted))


def _mistakes(
    template_path: Path, function: str, variables: Mapping[str, Any], wanted: dict[str, str | None], read: set[str]
) -> list[str]:
    """Each variable of ``wanted`` (with the resource it must refer to, or None for any value) that ``function`` lacks
    or sets to another value, and each it sets that no code ``read``s (Powertools' aside)."""
    variables_line, lines = _lines(template_path, function)
    unread = sorted(name for name in variables if name not in read and not name.startswith("POWERTOOLS_"))
    mistakes = []
    for name, resource in sorted(wanted.items()):
        line = f'"{name}: !Ref {resource}"' if resource else f'"{name}: <value>"'
        where = f"{template_path}:{lines.get(name, variables_line)}"
        if name not in variables:
            near = misspelt_as(name, unread)
            if near:
                unread.remove(near)
                where = f"{template_path}:{lines[near]}"
                mistakes.append(f"{where}: {function} sets {near}, which no code reads: rename it to {line}")
            else:
                mistakes.append(f"{where}: {function}'s Environment.Variables lacks {name}: add {line} under it")
        elif resource and variables[name] != {"Ref": resource}:
            mistakes.append(f"{where}: {name} is {variables[name]}; the function needs {line}")
    mistakes += [
        f"{template_path}:{lines[name]}: {function} sets {name}, which no code reads (a misspelt name is silently "
        "ignored): remove the line or correct the name"
        for name in unread
    ]
    return mistakes
