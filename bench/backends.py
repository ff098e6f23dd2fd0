"""Where the systems' DynamoDB calls go: moto in process, or Amazon's DynamoDB Local.

Each yields a ``Backend`` whose environment points boto3 at it, the way the function is
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
from local.aws import DUMMY_CREDENTIALS_ENV
from local.dynamodb_local import DynamoDBLocal
from testkit.lambda_sqs import REGION
from testkit.tables import IDEMPOTENCY_TABLE, LEDGER_TABLE, create_template_tables

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
class Backend:
    name: str
    # The benchmark's own client: tables, item sizes. Its calls are never counted.
    reader: Any
    dead_letter_queue_url: str

    def create_tables(self, prefix: str) -> Tables:
        """The template's two tables, under names of their own for one system."""
        suffix = uuid.uuid4().hex[:6]
        tables = Tables(idempotency=f"{prefix}-idempotency-{suffix}", ledger=f"{prefix}-ledger-{suffix}")
        with unobserved():
            create_template_tables(self.reader, {IDEMPOTENCY_TABLE: tables.idempotency, LEDGER_TABLE: tables.ledger})
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
def moto_backend() -> Iterator[Backend]:
    with scoped_environment(DUMMY_CREDENTIALS_ENV, unset=_ENDPOINT_VARIABLES), mock_aws():
        session = boto3.session.Session()
        with unobserved():
            queue_url = session.client("sqs").create_queue(QueueName="bench-dead-letters")["QueueUrl"]
        yield Backend("moto in-process", session.client("dynamodb"), queue_url)


@contextmanager
def dynamodb_local_backend() -> Iterator[Backend]:
    with DynamoDBLocal() as server:
        environment = {**DUMMY_CREDENTIALS_ENV, "AWS_ENDPOINT_URL_DYNAMODB": server.endpoint_url}
        with scoped_environment(environment, unset=_ENDPOINT_VARIABLES):
            yield Backend("DynamoDB Local", boto3.session.Session().client("dynamodb"), _UNUSED_QUEUE_URL)
