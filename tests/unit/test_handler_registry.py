"""Every handler file is registered: an unregistered one would turn its messages into UnknownEventType dead letters."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import consumer.handlers
from consumer.handlers import MessageHandler, build_handlers
from tests.utils import make_settings

NOT_HANDLERS = {"base"}


def handler_classes_in_files() -> dict[str, type[MessageHandler[Any]]]:
    found = {}
    for module_info in pkgutil.iter_modules(consumer.handlers.__path__):
        if module_info.name in NOT_HANDLERS:
            continue
        module = importlib.import_module(f"consumer.handlers.{module_info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, MessageHandler):
                found[f"{module_info.name}.py:{name}"] = cls
    return found


def test_each_handler_file_defines_a_handler() -> None:
    modules = {name.split(":")[0] for name in handler_classes_in_files()}
    files = {f"{m.name}.py" for m in pkgutil.iter_modules(consumer.handlers.__path__) if m.name not in NOT_HANDLERS}
    assert files - modules == set(), "a file under consumer/handlers/ defines no MessageHandler"


def test_every_handler_class_is_registered_in_build_handlers() -> None:
    registered = {type(handler) for handler in build_handlers(make_settings()).values()}
    unregistered = [where for where, cls in handler_classes_in_files().items() if cls not in registered]
    assert unregistered == [], f"add these to build_handlers in consumer/handlers/__init__.py: {unregistered}"
