"""Root fixtures: the local stack's servers, started once per session and always stopped.

Tests that use them are marked ``integration`` automatically, so ``pytest -m "not
integration"`` runs without Java or the npm install.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local.dynamodb_local import DynamoDBLocal
from local.servers import LocalServers

_STACK_FIXTURES = frozenset({"dynamodb_local", "local_stack"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _STACK_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def dynamodb_local() -> Iterator[DynamoDBLocal]:
    """Amazon's DynamoDB Local, in memory on 127.0.0.1; ``.endpoint_url``, ``.client()``."""
    with DynamoDBLocal() as server:
        yield server


@pytest.fixture(scope="session")
def local_stack(dynamodb_local: DynamoDBLocal) -> Iterator[LocalServers]:
    """DynamoDB Local and moto's SQS server, both on loopback, shared by the session.

    ``.dynamodb_endpoint_url``, ``.sqs_endpoint_url``, ``.client("sqs"|"dynamodb")``, and
    ``.deploy(stack_name=..., parameter_overrides=...)``, which creates the template's
    queues and tables under a fresh stack name so tests never see each other's data.
    """
    with LocalServers(dynamodb=dynamodb_local) as servers:
        yield servers
