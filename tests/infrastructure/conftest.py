from __future__ import annotations

from typing import Any

import pytest

from testkit.template import Template, load_template, transform
from tests.infrastructure.lookups import read


@pytest.fixture(scope="session")
def source_template() -> dict[str, Any]:
    return load_template()


@pytest.fixture(scope="session")
def transformed_template(source_template: dict[str, Any]) -> dict[str, Any]:
    return transform(source_template)


@pytest.fixture(scope="session")
def resolver(transformed_template: dict[str, Any]) -> Template:
    """The transformed template read with every parameter at its default."""
    return read(transformed_template)
