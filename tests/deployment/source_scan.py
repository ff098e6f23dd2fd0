"""What the deployed code asks of AWS, read from its source (no import, no execution).

The function's permissions are derived from this, so a new boto3 call or a new kind of
business write shows up here before it shows up as AccessDenied in production.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import botocore.session
from botocore import xform_name

from testkit.template import REPO_ROOT

# The deployed code: the core and the application beside it (src/consumer, src/service).
PACKAGE_ROOT = REPO_ROOT / "src"

# A TransactWriteItems item kind -> the IAM action that authorizes it (IAM checks each item).
TRANSACTION_ITEM_ACTIONS = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}


@dataclass(frozen=True)
class OperationUse:
    service: str  # botocore service name, e.g. "dynamodb"
    operation: str  # API operation, e.g. "UpdateItem"
    module: str  # path relative to src/, e.g. "consumer/idempotency/store.py"
    function: str  # the enclosing function or method, e.g. "IdempotencyStore.claim"


def package_modules(root: Path = PACKAGE_ROOT) -> dict[str, ast.Module]:
    """Each module of the packages under ``root`` (src/), by its path relative to it (``consumer/app.py``)."""
    return {
        path.relative_to(root).as_posix(): _parsed(path.read_text(encoding="utf-8"), str(path))
        for path in sorted(root.rglob("*.py"))
    }


@cache
def _parsed(source: str, filename: str) -> ast.Module:
    """One parse per file content: the static checks scan the package hundreds of times, and read its trees only."""
    return ast.parse(source, filename)


def client_services(root: Path = PACKAGE_ROOT) -> set[str]:
    """Services the code creates clients for: the service named in a call of ``client``,
    ``create_client`` or the package's own ``_client(session, "<service>", ...)``."""
    creators = {"client", "create_client", "_client"}
    services: set[str] = set()
    for tree in package_modules(root).values():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            named = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
            if name in creators and named:
                services.add(named[0])
    return services


@cache
def _operations_by_method_name(service: str) -> dict[str, str]:
    model = botocore.session.get_session().get_service_model(service)
    return {xform_name(operation): operation for operation in model.operation_names}


def operation_uses(root: Path = PACKAGE_ROOT) -> list[OperationUse]:
    """Every reference to a client operation (``client.update_item``, called or passed on)."""
    services = sorted(client_services(root))
    uses: list[OperationUse] = []
    for module, tree in package_modules(root).items():
        for function, node in _attributes_with_enclosing_function(tree):
            for service in services:
                operation = _operations_by_method_name(service).get(node.attr)
                if operation is not None:
                    uses.append(OperationUse(service, operation, module, function))
    return uses


def _attributes_with_enclosing_function(tree: ast.Module) -> list[tuple[str, ast.Attribute]]:
    found: list[tuple[str, ast.Attribute]] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            scope = (*scope, node.name)
        if isinstance(node, ast.Attribute):
            found.append((".".join(scope) or "<module>", node))
        for child in ast.iter_child_nodes(node):
            visit(child, scope)

    visit(tree, ())
    return found


def transaction_item_kinds(package: str, root: Path = PACKAGE_ROOT, *, excluding: str = "") -> set[str]:
    """Item kinds the modules under ``package`` (but ``excluding``) build as transaction items: ``{"Update": ...}``,
    ``{"Delete": ...}`` literally (a transition's record item, which its transaction's ``TransactItems`` carries)."""
    kinds: set[str] = set()
    for module, tree in package_modules(root).items():
        if not module.startswith(package) or module == excluding:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict) and len(node.keys) == 1:
                (key,) = node.keys
                if isinstance(key, ast.Constant) and key.value in TRANSACTION_ITEM_ACTIONS:
                    kinds.add(key.value)
    return kinds


def business_write_kinds(package: str, root: Path = PACKAGE_ROOT) -> dict[str, set[str]]:
    """Write classes (Put, Update, ...) each module under ``package`` constructs, by module."""
    kinds: dict[str, set[str]] = defaultdict(set)
    for module, tree in package_modules(root).items():
        if not module.startswith(package):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in TRANSACTION_ITEM_ACTIONS
            ):
                kinds[module].add(node.func.id)
    return dict(kinds)


def declared_tables(package: str, root: Path = PACKAGE_ROOT) -> dict[str, tuple[str, ...]]:
    """The ``tables = ("...",)`` that handler classes in each module under ``package`` declare, by module."""
    declared: dict[str, tuple[str, ...]] = {}
    for module, tree in package_modules(root).items():
        if not module.startswith(package):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(target, ast.Name) and target.id == "tables" for target in targets):
                    declared[module] = (*declared.get(module, ()), *ast.literal_eval(node.value))
    return declared
