"""The relay fed by a real stream: DynamoDB Local's, of an outbox table written by transactions as the consumer writes
it, sending to a FIFO queue on the local stack's moto server (reached through ``AWS_ENDPOINT_URL_SQS``, as the
function's environment would point it).

What a cancelled transaction would have written never reaches the stream, so it is never sent: that is the outbox's
promise, and this is where it is checked end to end.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from botocore.exceptions import ClientError

from consumer.outbox import Attr, QueueMessage, derived_key, outbox_writes
from consumer.relay import RelayHandler
from local.stream_poller import parents_first
from testkit.aws import client
from testkit.lambda_sqs import LambdaContext
from testkit.servers import LocalServers
from tests.conftest import TableFactory
from tests.kit import drain

pytestmark = pytest.mark.integration

APPLIED = "PaymentReceived#p-1"
CANCELLED = "PaymentReceived#p-2"
NOW_MS = 1_800_000_000_000


def outbox_table(dynamodb: Any) -> tuple[str, str]:
    """An outbox table (key ``id``, TTL on ``expiresAt``) whose stream carries new images: its name and stream ARN."""
    name = f"outbox-{uuid.uuid4().hex[:8]}"
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": Attr.ID.value, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": Attr.ID.value, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_IMAGE"},
    )
    ttl = {"AttributeName": Attr.EXPIRES_AT.value, "Enabled": True}
    dynamodb.update_time_to_live(TableName=name, TimeToLiveSpecification=ttl)
    return name, dynamodb.describe_table(TableName=name)["Table"]["LatestStreamArn"]


def stream_records(streams: Any, stream_arn: str) -> list[dict[str, Any]]:
    """Every record of the stream so far, in order. DynamoDB Local rolls a shard over every 4 hours: its children
    follow it."""
    shards = streams.describe_stream(StreamArn=stream_arn)["StreamDescription"]["Shards"]
    records: list[dict[str, Any]] = []
    for shard in parents_first(shards):
        iterator = streams.get_shard_iterator(
            StreamArn=stream_arn, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = streams.get_records(ShardIterator=iterator)
            records += page["Records"]
            # An open shard always gives a next iterator: an empty page means it was read to its end.
            iterator = page.get("NextShardIterator") if page["Records"] else None
    return records


def test_exactly_the_committed_transactions_messages_are_relayed_in_order_with_their_keys(
    local_aws: LocalServers, id_table: TableFactory
) -> None:
    dynamodb = local_aws.client("dynamodb")
    sqs = local_aws.client("sqs")
    records_table = id_table("records")
    outbox, stream_arn = outbox_table(dynamodb)
    queue_url = sqs.create_queue(QueueName=f"receipts-{uuid.uuid4().hex[:8]}.fifo", Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]

    def writes(record_id: str, *payloads: int, now_ms: int = NOW_MS) -> list[dict[str, Any]]:
        messages = [QueueMessage("ReceiptQueue", "ReceiptRequested", {"n": n}, group_id="payments") for n in payloads]
        puts = outbox_writes(
            messages,
            table=outbox,
            destinations=["ReceiptQueue"],
            record_id=record_id,
            now_ms=now_ms,
            ttl_seconds=3600,
        )
        return [put.to_transact_item() for put in puts]

    def record(record_id: str) -> dict[str, Any]:
        return {
            "TableName": records_table,
            "Item": {"id": {"S": record_id}, "status": {"S": "COMPLETED"}},
            "ConditionExpression": "attribute_not_exists(id)",
        }

    applied = writes(APPLIED, 1, 2)
    dynamodb.transact_write_items(TransactItems=[{"Put": record(APPLIED)}, *applied])
    # Another message's effect whose condition fails (a business condition, here on the first's record): the whole
    # transaction is cancelled, its outbox item with it.
    refused = {
        "TableName": records_table,
        "Key": {"id": {"S": APPLIED}},
        "ConditionExpression": "attribute_not_exists(id)",
    }
    with pytest.raises(ClientError, match="TransactionCanceled"):
        dynamodb.transact_write_items(
            TransactItems=[{"Put": record(CANCELLED)}, *writes(CANCELLED, 3), {"ConditionCheck": refused}]
        )
    # The first item put again, as once its source's record expired and the message was applied again: a MODIFY.
    dynamodb.put_item(TableName=outbox, Item=writes(APPLIED, 1, now_ms=NOW_MS + 60_000)[0]["Put"]["Item"])

    records = stream_records(client("dynamodbstreams", local_aws.dynamodb_endpoint_url), stream_arn)
    assert [r["eventName"] for r in records] == ["INSERT", "INSERT", "MODIFY"]

    response = RelayHandler({"RECEIPT_QUEUE_DESTINATION": queue_url})({"Records": records}, LambdaContext())

    assert response == {"batchItemFailures": []}
    received = drain(sqs, queue_url)
    assert [letter.attributes["IdempotencyKey"]["StringValue"] for letter in received] == [
        derived_key(APPLIED, 0),
        derived_key(APPLIED, 1),
    ]
    assert [letter.body for letter in received] == [put["Put"]["Item"][Attr.BODY]["S"] for put in applied]
    assert {letter.group_id for letter in received} == {"payments"}
