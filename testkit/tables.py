"""DynamoDB tables made from ``template.yaml``'s own definitions, so no test or benchmark types a schema out: the name
is the caller's (tests and benchmarks need several per server); SSE, point-in-time recovery and deletion protection
have no meaning on DynamoDB Local or moto and are left out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from testkit.template import LOCAL_TABLES, Template

TABLE_TYPE = "AWS::DynamoDB::Table"
IDEMPOTENCY_TABLE = "IdempotencyTable"
_CREATE_TABLE_PARAMETERS = (
    "AttributeDefinitions",
    "KeySchema",
    "BillingMode",
    "ProvisionedThroughput",
    "GlobalSecondaryIndexes",
    "LocalSecondaryIndexes",
)


def ttl_attribute(properties: Mapping[str, Any]) -> str | None:
    ttl = properties.get("TimeToLiveSpecification") or {}
    return ttl.get("AttributeName") if str(ttl.get("Enabled", "")).lower() == "true" else None


def scan(dynamodb: Any, table: str) -> list[dict[str, Any]]:
    """Every item of ``table``, every page of a ``Scan``, as the low-level client returns them."""
    return [item for page in dynamodb.get_paginator("scan").paginate(TableName=table) for item in page["Items"]]


def count(dynamodb: Any, table: str) -> int:
    """How many items ``table`` holds, counted by the server (``Select=COUNT``): nothing of them is sent back."""
    return sum(int(page["Count"]) for page in dynamodb.get_paginator("scan").paginate(TableName=table, Select="COUNT"))


def create_table(dynamodb: Any, name: str, properties: Mapping[str, Any]) -> None:
    """Create ``name`` from a table's resolved template properties; an existing table is kept as it is."""
    request: dict[str, Any] = {"BillingMode": "PAY_PER_REQUEST"}  # unless given: LocalTables gives keys alone
    request |= {key: properties[key] for key in _CREATE_TABLE_PARAMETERS if key in properties}
    if stream := properties.get("StreamSpecification"):
        request["StreamSpecification"] = {"StreamEnabled": True, **stream}
    try:
        dynamodb.create_table(TableName=name, **request)
    except ClientError as error:
        # A running stack's table: the template is the same, so is the table.
        if error.response["Error"]["Code"] != "ResourceInUseException":
            raise
    dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.2})
    if attribute := ttl_attribute(properties):
        current = dynamodb.describe_time_to_live(TableName=name)["TimeToLiveDescription"]
        if current.get("TimeToLiveStatus") != "ENABLED":
            ttl = {"AttributeName": attribute, "Enabled": True}
            dynamodb.update_time_to_live(TableName=name, TimeToLiveSpecification=ttl)


def create_template_tables(dynamodb: Any, names: Mapping[str, str], template: Template | None = None) -> None:
    """Create each table of the template named in ``names`` (logical id -> table name), or of its LocalTables."""
    template = template or Template.from_file()
    for logical_id, name in names.items():
        if logical_id not in [*template.resources_of_type(TABLE_TYPE), *(local := template.local(LOCAL_TABLES))]:
            raise ValueError(f"{logical_id!r} is not a DynamoDB table of {template.path}")
        create_table(dynamodb, name, local[logical_id] if logical_id in local else template.properties(logical_id))
