from __future__ import annotations

from typing import Any

import pytest

from tests.infrastructure.template import Resolver, load_source_template, transform


@pytest.fixture(scope="session")
def source_template() -> dict[str, Any]:
    return load_source_template()


@pytest.fixture(scope="session")
def transformed_template(source_template: dict[str, Any]) -> dict[str, Any]:
    return transform(source_template)


@pytest.fixture(scope="session")
def resolver(transformed_template: dict[str, Any]) -> Resolver:
    """The transformed template evaluated with every parameter at its default."""
    return Resolver(transformed_template)
