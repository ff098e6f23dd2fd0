"""Unit fixtures: moto in process, a clock the test moves, and the function's wiring.

moto does not serialize concurrent writes, so nothing here claims anything about
concurrency: those tests run against DynamoDB Local (tests/integration).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from moto import mock_aws

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.handlers import MessageHandler
from consumer.idempotency.store import IdempotencyStore

REGION = "us-east-1"
IDEMPOTENCY_TABLE = "idempotency"
LEDGER_TABLE = "ledger"


class Clock:
    """Wall time the test controls: leases and TTLs expire when the test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def create_tables(client: Any) -> None:
    client.create_table(
        TableName=IDEMPOTENCY_TABLE,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.create_table(
        TableName=LEDGER_TABLE,
        KeySchema=[{"AttributeName": "accountId", "KeyType": "HASH"}, {"AttributeName": "entryId", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "accountId", "AttributeType": "S"},
            {"AttributeName": "entryId", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SQS", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        yield


@pytest.fixture
def dynamodb(aws: None) -> Any:
    client = boto3.client("dynamodb", region_name=REGION)
    create_tables(client)
    return client


@pytest.fixture
def sqs(aws: None) -> Any:
    return boto3.client("sqs", region_name=REGION)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(dynamodb: Any, clock: Clock) -> IdempotencyStore:
    return IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=3600, clock=clock)


def balance(dynamodb: Any, account_id: str) -> int:
    item = dynamodb.get_item(
        TableName=LEDGER_TABLE, Key={"accountId": {"S": account_id}, "entryId": {"S": "BALANCE"}}, ConsistentRead=True
    ).get("Item")
    return int(item["balanceCents"]["N"]) if item else 0


def ledger_entries(dynamodb: Any, account_id: str) -> list[str]:
    items = dynamodb.query(
        TableName=LEDGER_TABLE,
        KeyConditionExpression="accountId = :a",
        ExpressionAttributeValues={":a": {"S": account_id}},
        ConsistentRead=True,
    )["Items"]
    return sorted(item["entryId"]["S"] for item in items)


# -- SQS records and batches -------------------------------------------------------------


def payment_body(payment_id: str, account_id: str = "acc-1", amount: int = 1250, key: str | None = None) -> str:
    return json.dumps(
        {
            "eventType": "PaymentReceived",
            "metadata": {"idempotencyKey": key or f"pay-{payment_id}"},
            "payload": {"paymentId": payment_id, "accountId": account_id, "amountCents": amount, "currency": "EUR"},
        }
    )


def receipt_body(receipt_id: str, key: str | None = None) -> str:
    return json.dumps(
        {
            "eventType": "ReceiptRequested",
            "metadata": {"idempotencyKey": key or f"receipt-{receipt_id}"},
            "payload": {
                "receiptId": receipt_id,
                "paymentId": f"p-{receipt_id}",
                "accountId": "acc-1",
                "amountCents": 1250,
                "currency": "EUR",
            },
        }
    )


def sqs_record(
    message_id: str,
    body: str,
    *,
    group_id: str | None = None,
    receive_count: int = 1,
    message_attributes: dict[str, Any] | None = None,
    queue_arn: str = "arn:aws:sqs:us-east-1:123456789012:consumer-queue",
) -> dict[str, Any]:
    attributes = {
        "ApproximateReceiveCount": str(receive_count),
        "SentTimestamp": "1700000000000",
        "SenderId": "AIDAEXAMPLE",
        "ApproximateFirstReceiveTimestamp": "1700000000001",
    }
    if group_id is not None:
        attributes["MessageGroupId"] = group_id
        attributes["MessageDeduplicationId"] = message_id
    return {
        "messageId": message_id,
        "receiptHandle": f"handle-{message_id}",
        "body": body,
        "attributes": attributes,
        "messageAttributes": message_attributes or {},
        "md5OfBody": "",
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": REGION,
    }


class Remaining:
    """A Lambda context's remaining time: fixed, or read from a script then its last value."""

    def __init__(self, ms: int = 30_000, then: list[int] | None = None) -> None:
        self.ms = ms
        self._script = list(then or [])

    def __call__(self) -> int:
        if self._script:
            self.ms = self._script.pop(0)
        return self.ms


@dataclass
class Consumer:
    batch: BatchRunner
    store: IdempotencyStore
    dynamodb: Any
    sqs: Any
    dlq_url: str
    settings: Settings
    remaining: Remaining = field(default_factory=Remaining)

    def process(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return self.batch.process(records, self.remaining).response()

    def failed_ids(self, records: list[dict[str, Any]]) -> list[str]:
        return [failure["itemIdentifier"] for failure in self.process(records)["batchItemFailures"]]

    def dead_letters(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        while True:
            batch = self.sqs.receive_message(
                QueueUrl=self.dlq_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=0
            ).get("Messages", [])
            if not batch:
                return messages
            messages.extend(batch)
            for message in batch:
                self.sqs.delete_message(QueueUrl=self.dlq_url, ReceiptHandle=message["ReceiptHandle"])


def make_consumer(
    dynamodb: Any,
    sqs: Any,
    clock: Clock,
    webhook_url: str = "",
    dlq_url: str | None = None,
    extra_handlers: dict[str, MessageHandler[Any]] | None = None,
    session: boto3.session.Session | None = None,
    **overrides: Any,
) -> Consumer:
    dlq_url = dlq_url or sqs.create_queue(QueueName="consumer-dlq")["QueueUrl"]
    # moto in process is not thread-safe (it raises or loses updates under threads), so
    # unit tests run lanes one at a time; parallel lanes are tested on DynamoDB Local.
    overrides.setdefault("max_workers", 1)
    settings = Settings(
        idempotency_table_name=IDEMPOTENCY_TABLE,
        ledger_table_name=LEDGER_TABLE,
        dead_letter_queue_url=dlq_url,
        receipt_webhook_url=webhook_url,
        **overrides,
    )
    batch = wire(
        settings,
        session or boto3.session.Session(region_name=REGION),
        clock=clock,
        logger=_quiet_logger(),
        handlers=extra_handlers,
    )
    # The test's own view of the same table, to read records and play other workers.
    store = IdempotencyStore(dynamodb, IDEMPOTENCY_TABLE, ttl_seconds=settings.idempotency_ttl_seconds, clock=clock)
    return Consumer(batch, store, dynamodb, sqs, dlq_url, settings)


def _quiet_logger() -> Any:
    logger = logging.getLogger("consumer.tests")
    logger.addHandler(logging.NullHandler())
    return logger


@pytest.fixture
def consumer(dynamodb: Any, sqs: Any, clock: Clock) -> Consumer:
    return make_consumer(dynamodb, sqs, clock)


os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "IdempotentConsumerTests")
