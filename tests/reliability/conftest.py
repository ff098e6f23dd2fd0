"""Tables keyed by ``id`` on DynamoDB Local, made on demand and deleted after the module."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from local.dynamodb_local import DynamoDBLocal

TableFactory = Callable[[str], str]


@pytest.fixture(scope="module")
def id_table(dynamodb_local: DynamoDBLocal) -> Iterator[TableFactory]:
    """``id_table(prefix)`` creates a PAY_PER_REQUEST table with partition key ``id`` (S)."""
    client = dynamodb_local.client()
    made: list[str] = []

    def create(prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        client.create_table(
            TableName=name,
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        made.append(name)
        return name

    yield create
    for name in made:
        client.delete_table(TableName=name)
