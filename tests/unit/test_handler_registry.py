"""Every handler file is registered: an unregistered one would only show as UnknownEventType dead letters."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import consumer.handlers
from consumer.handlers import build_handlers
from consumer.handlers.base import MessageHandler
from tests.utils import settings_for_tests


def _handler_classes() -> dict[str, type[MessageHandler[Any]]]:
    """Each concrete MessageHandler defined in a module under src/consumer/handlers/, by event type."""
    found = {}
    for module_info in pkgutil.iter_modules(consumer.handlers.__path__):
        module = importlib.import_module(f"consumer.handlers.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, MessageHandler) and not inspect.isabstract(cls) and cls.__module__ == module.__name__:
                found[cls.event_type] = cls
    return found


def test_every_handler_file_is_registered_in_build_handlers() -> None:
    defined = _handler_classes()
    registered = build_handlers(settings_for_tests())
    assert defined, "no handler found under consumer.handlers: the scan is broken"
    assert sorted(registered) == sorted(defined), "register each handler file in consumer.handlers.build_handlers"
    for event_type, handler in registered.items():
        assert type(handler) is defined[event_type]
