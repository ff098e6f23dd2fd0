"""The seed articles' pattern: one record after another, put the key, read it on conflict.

Per message: a conditional ``PutItem`` of the key as IN_PROGRESS; on
``ConditionalCheckFailed`` a ``GetItem`` to read its status (COMPLETED: a duplicate,
skip; otherwise in flight: retry later); then the business writes, then an
``UpdateItem`` to COMPLETED.
"""

from __future__ import annotations

import time
from typing import Any

import boto3
from botocore.exceptions import ClientError

from bench.systems.business import LedgerBusiness
from consumer.config import Settings
from testkit.lambda_sqs import LambdaContext


class InFlightElsewhere(Exception):
    """The key is IN_PROGRESS under another delivery."""


class SeedPattern:
    name = "seed pattern"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client = boto3.session.Session().client("dynamodb")
        self._table = settings.idempotency_table_name
        self._ttl_seconds = settings.idempotency_ttl_seconds
        self._business = LedgerBusiness(self._client, settings)

    def handle(self, event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        failures = []
        for record in event["Records"]:
            try:
                self._process(record, context)
            except Exception:
                failures.append({"itemIdentifier": record["messageId"]})
        return {"batchItemFailures": failures}

    def _process(self, record: dict[str, Any], context: LambdaContext) -> None:
        parsed = self._business.parse(record)
        key = {"id": {"S": parsed.message.record_id}}
        try:
            self._client.put_item(
                TableName=self._table,
                Item={
                    **key,
                    "status": {"S": "IN_PROGRESS"},
                    "expiresAt": {"N": str(int(time.time()) + self._ttl_seconds)},
                },
                ConditionExpression="attribute_not_exists(id)",
            )
        except ClientError as error:
            if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            existing = self._client.get_item(TableName=self._table, Key=key, ConsistentRead=True).get("Item", {})
            if existing.get("status", {}).get("S") == "COMPLETED":
                return
            raise InFlightElsewhere(parsed.message.record_id) from None
        self._business.apply(parsed, context.get_remaining_time_in_millis)
        self._client.update_item(
            TableName=self._table,
            Key=key,
            UpdateExpression="SET #status = :completed",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={":completed": {"S": "COMPLETED"}},
        )
