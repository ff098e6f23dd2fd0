"""Messages for any registered handler: payloads drawn from its ``payload_model``, payloads it must refuse, and
the seed items its author gives for the business state it needs (``<snake_event_type>_seeds.py``, docs/local-stack.md).

Draws are polyfactory's, deterministic from a seed, and each is checked against the model the way the consumer reads a
body (JSON): a valid draw the model refuses, or an invalid one it accepts, raises ``GeneratorError`` saying so.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from boto3.dynamodb.types import TypeSerializer
from polyfactory.factories.pydantic_factory import ModelFactory
from pydantic import BaseModel, ValidationError

from consumer.handler import MessageHandler
from testkit import application

Handler = type[MessageHandler[Any]]
SeedItem = tuple[str, dict[str, Any]]  # (the table's logical id, the item in plain Python values)
REPO = Path(__file__).resolve().parent.parent
# Values of every JSON type, tried in turn for a field until the model refuses one (a wrong type for that field).
_WRONG_TYPES: tuple[Any, ...] = ([["not", "this"]], {"not": "this"}, 12.5, "not-this", True, None)
_EXTRA_FIELD = "unexpectedField"


class GeneratorError(AssertionError):
    """This generator's bug, not the handler's: a draw its own model refuses, or an invalid payload it accepts."""


@dataclass(frozen=True)
class Invalid:
    payload: dict[str, Any]
    defect: str  # what was done to a valid payload: "amountCents dropped", "extra field unexpectedField", ...


def registered() -> tuple[Handler, ...]:
    # Read when asked for, not at import: a chaos run on the core's handlers alone (the core's proof) uses this kit
    # and never reads the application, which a user replaces.
    return application.registered()


def refusal(model: type[BaseModel], payload: Any) -> str | None:
    """Why the model refuses this payload, read from JSON as the consumer reads it; ``None`` if it accepts it."""
    try:
        model.model_validate_json(json.dumps(payload))
    except ValidationError as error:
        return str(error)
    return None


def valid_payloads(handler: Handler, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` payloads drawn from the handler's model, the same ones for the same seed."""
    model = handler.payload_model
    factory = ModelFactory.create_factory(model, __random_seed__=seed)
    drawn = [factory.build().model_dump(mode="json", by_alias=True) for _ in range(count)]
    for payload in drawn:
        if (why := refusal(model, payload)) is not None:
            raise GeneratorError(
                f"{handler.event_type}: polyfactory drew {payload} and {model.__name__} refuses it: {why}"
            )
    return drawn


def invalid_payloads(handler: Handler, seed: int = 0) -> list[Invalid]:
    """From one valid draw: each required field dropped, each field given a wrong type (where some JSON type is
    wrong for it), and an extra field where the model forbids extras; each checked to be refused."""
    model, (valid,) = handler.payload_model, valid_payloads(handler, 1, seed)
    made = [Invalid({k: v for k, v in valid.items() if k != name}, f"{name} dropped") for name in _required(model)]
    for name in valid:
        wrong = next((w for w in _WRONG_TYPES if refusal(model, {**valid, name: w}) is not None), _WRONG_TYPES)
        if wrong is not _WRONG_TYPES:
            made.append(Invalid({**valid, name: wrong}, f"{name} given {json.dumps(wrong)}"))
    if model.model_config.get("extra") == "forbid":
        made.append(Invalid({**valid, _EXTRA_FIELD: 1}, f"extra field {_EXTRA_FIELD}"))
    for invalid in made:
        if refusal(model, invalid.payload) is None:
            raise GeneratorError(f"{handler.event_type}: {invalid.defect} ({invalid.payload}) is accepted by the model")
    return made


def _required(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items() if field.is_required()]


def seeds_file(event_type: str, root: Path = REPO) -> Path | None:
    """Where the handler's author keeps its seed items: ``<event_type in snake case>_seeds.py`` under ``tests/``."""
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", event_type).lower() + "_seeds.py"
    found = sorted((root / "tests").rglob(name))
    if len(found) > 1:
        raise GeneratorError(f"{event_type}: more than one seeds file: {[str(path) for path in found]}")
    return found[0] if found else None


def seed_items(handler: Handler, payload: Mapping[str, Any], root: Path = REPO) -> list[SeedItem]:
    """The items to write before this payload is sent, so that it can apply; none without a seeds file."""
    if (path := seeds_file(handler.event_type, root)) is None:
        return []
    items = list(load_module(path).seed_items(dict(payload)))
    if undeclared := {table for table, _ in items} - set(handler.tables):
        raise GeneratorError(f"{path} seeds {sorted(undeclared)}, not among {handler.event_type}'s tables")
    return items


@cache
def load_module(path: Path) -> Any:
    """A module of the author's under ``tests/`` (seed items, an example's own checks), loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"seeds_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise GeneratorError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def put_seeds(dynamodb: Any, table_names: Mapping[str, str], items: Iterable[SeedItem]) -> None:
    """Write seed items to the deployed tables (``table_names``: logical id -> name)."""
    serialize = TypeSerializer().serialize
    for table, item in items:
        dynamodb.put_item(TableName=table_names[table], Item={k: serialize(v) for k, v in item.items()})
