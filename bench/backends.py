"""Where the systems' DynamoDB calls go: moto in process, or Amazon's DynamoDB Local.

Each yields a ``Backend`` whose environment points boto3 at it, the way the function is
pointed at local endpoints (``AWS_ENDPOINT_URL_DYNAMODB``), so the systems under test
have no benchmark-specific code path.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
from moto import mock_aws

from bench.hooks import unobserved
from bench.systems.this_consumer import scoped_environment
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
    # The conflict proxy's counts (transactions, cancelled, writes refused), where there is one.
    proxy_stats: Callable[[], dict[str, int]] | None = None
    # The server behind the proxy, for a second proxy of other settings (DynamoDB Local only).
    upstream_url: str | None = None

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
            reader = boto3.session.Session().client("dynamodb")
            assert server.proxy is not None
            yield Backend("DynamoDB Local", reader, _UNUSED_QUEUE_URL, server.proxy.stats, server.direct_endpoint_url)
