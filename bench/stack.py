"""Where the systems' DynamoDB calls go: moto in process, or Amazon's DynamoDB Local.

Each yields a ``Stack`` whose environment points boto3 at it, the way the function is
pointed at local endpoints (``AWS_ENDPOINT_URL_DYNAMODB``), so the systems under test
have no benchmark-specific code path.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
from moto import mock_aws

from bench.hooks import unobserved
from bench.records import REGION
from local.aws import DUMMY_CREDENTIALS_ENV
from local.dynamodb_local import DynamoDBLocal

_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SQS", "AWS_PROFILE")
# DynamoDB Local has no SQS. The dead-letter queue is only for poison messages, which the
# benchmark never sends; any record that fails stops the run (see bench.scenarios).
_BATCH_WRITE_LIMIT = 25
_UNUSED_QUEUE_URL = f"https://sqs.{REGION}.amazonaws.com/000000000000/bench-dead-letters-unused"


@dataclass(frozen=True)
class Tables:
    idempotency: str
    ledger: str


@dataclass(frozen=True)
class Stack:
    name: str
    # The benchmark's own client: tables, item sizes. Its calls are never counted.
    reader: Any
    dead_letter_queue_url: str

    def create_tables(self, prefix: str) -> Tables:
        """The template's two table shapes, under names of their own for one system."""
        suffix = uuid.uuid4().hex[:6]
        tables = Tables(idempotency=f"{prefix}-idempotency-{suffix}", ledger=f"{prefix}-ledger-{suffix}")
        with unobserved():
            self._create(tables.idempotency, [("id", "HASH")])
            self._create(tables.ledger, [("accountId", "HASH"), ("entryId", "RANGE")])
        return tables

    def empty_tables(self, names: Iterable[str]) -> None:
        """Delete every item: moto's ``TransactWriteItems`` copies whole tables, so keep them small."""
        with unobserved():
            for name in names:
                key_names = [
                    key["AttributeName"] for key in self.reader.describe_table(TableName=name)["Table"]["KeySchema"]
                ]
                projection = {f"#k{index}": key for index, key in enumerate(key_names)}
                pages = self.reader.get_paginator("scan").paginate(
                    TableName=name, ProjectionExpression=", ".join(projection), ExpressionAttributeNames=projection
                )
                keys = [item for page in pages for item in page["Items"]]
                for start in range(0, len(keys), _BATCH_WRITE_LIMIT):
                    chunk = keys[start : start + _BATCH_WRITE_LIMIT]
                    self.reader.batch_write_item(
                        RequestItems={name: [{"DeleteRequest": {"Key": key}} for key in chunk]}
                    )

    def _create(self, name: str, keys: list[tuple[str, str]]) -> None:
        self.reader.create_table(
            TableName=name,
            KeySchema=[{"AttributeName": attribute, "KeyType": role} for attribute, role in keys],
            AttributeDefinitions=[{"AttributeName": attribute, "AttributeType": "S"} for attribute, _ in keys],
            BillingMode="PAY_PER_REQUEST",
        )
        self.reader.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1})


@contextmanager
def scoped_environment(values: Mapping[str, str], *, unset: tuple[str, ...] = ()) -> Iterator[None]:
    """Set and unset environment variables for the block, then put everything back."""
    saved = {name: os.environ.get(name) for name in (*values, *unset)}
    for name in unset:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def moto_stack() -> Iterator[Stack]:
    with scoped_environment(DUMMY_CREDENTIALS_ENV, unset=_ENDPOINT_VARIABLES), mock_aws():
        session = boto3.session.Session()
        with unobserved():
            queue_url = session.client("sqs").create_queue(QueueName="bench-dead-letters")["QueueUrl"]
        yield Stack("moto in-process", session.client("dynamodb"), queue_url)


@contextmanager
def dynamodb_local_stack() -> Iterator[Stack]:
    with DynamoDBLocal() as server:
        environment = {**DUMMY_CREDENTIALS_ENV, "AWS_ENDPOINT_URL_DYNAMODB": server.endpoint_url}
        with scoped_environment(environment, unset=_ENDPOINT_VARIABLES):
            yield Stack("DynamoDB Local", boto3.session.Session().client("dynamodb"), _UNUSED_QUEUE_URL)
