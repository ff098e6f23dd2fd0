"""The types a handler author reads document themselves: each field named, what the core does with it, an example."""

from __future__ import annotations

import dataclasses

import pytest

import consumer.api as api

# What an IDE shows a handler author first: the dataclasses of consumer.api.
DOCUMENTED = ("MessageContext", "Effect", "Guard", "Put", "Update", "Delete", "ConditionCheck", "WebhookResponse")


@pytest.mark.parametrize("name", DOCUMENTED)
def test_each_public_type_names_every_field_and_shows_an_example(name: str) -> None:
    kind = getattr(api, name)
    doc = kind.__doc__ or ""
    assert not doc.startswith(f"{name}("), f"{name} has only the docstring dataclasses makes up"
    assert "Example" in doc, f"{name}'s docstring shows no example"
    # Each field is an entry of its own ("<field>:"), not a word in passing.
    unnamed = [field.name for field in dataclasses.fields(kind) if f"{field.name}:" not in doc]
    assert not unnamed, f"{name}'s docstring leaves out {unnamed}"


def test_the_docstrings_say_how_a_reserved_attribute_name_is_written() -> None:
    assert '{"#status": "status"}' in (api.Update.__doc__ or "")
