"""What the consumer needs from its runtime and its account, checked at cold start.

The tables: every table the function writes must exist and be reachable with its role,
or the first invocation fails naming the table and its variable. Found per message instead,
a mistyped name would retry each message until the redrive, with an SDK error as reason.

The DynamoDB features, in the SDK the runtime loaded.

A duplicate costs one round trip only because a failed condition returns the old item
(``ReturnValuesOnConditionCheckFailure``), on ``UpdateItem``, ``DeleteItem`` (a release told a newer owner's record
from none) and inside ``TransactWriteItems``.
An older botocore does not know that parameter: with client-side validation off, it would
send requests whose failures come back without the item, and every duplicate would look like
an unreadable message. The Lambda runtime's botocore is not pinned by AWS, so the function
asks the service model it actually loaded, at cold start, instead of trusting a version string.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import botocore
import botocore.session
from botocore.exceptions import BotoCoreError, ClientError

from consumer.config import table_variable
from consumer.errors import ConfigurationError

if TYPE_CHECKING:
    from types_boto3_dynamodb import DynamoDBClient

PARAMETER = "ReturnValuesOnConditionCheckFailure"
# A release known to model the parameter on every operation below (it reached single-item writes in mid-2023).
MINIMUM_BOTOCORE = "1.31.0"
_SINGLE_ITEM_WRITES = ("UpdateItem", "DeleteItem")
_TRANSACTION_ITEMS = ("Update", "Put", "Delete", "ConditionCheck")


def missing_features(service_model: Any) -> list[str]:
    """Where ``service_model`` (DynamoDB's) lacks the parameter: ``UpdateItem``, ``DeleteItem``,
    ``TransactWriteItems.Update``..."""
    missing = [
        operation
        for operation in _SINGLE_ITEM_WRITES
        if PARAMETER not in service_model.operation_model(operation).input_shape.members
    ]
    transact_item = (
        service_model.operation_model("TransactWriteItems").input_shape.members["TransactItems"].member.members
    )
    missing.extend(
        f"TransactWriteItems.{kind}"
        for kind in _TRANSACTION_ITEMS
        if kind not in transact_item or PARAMETER not in transact_item[kind].members
    )
    return missing


def require_botocore(session: botocore.session.Session | None = None) -> None:
    """Raise ``ConfigurationError`` naming the botocore needed when the loaded model lacks the parameter."""
    service_model = (session or botocore.session.get_session()).get_service_model("dynamodb")
    missing = missing_features(service_model)
    if missing:
        raise ConfigurationError(
            f"botocore {botocore.__version__} does not support {PARAMETER} on {', '.join(missing)}: "
            f"bundle botocore>={MINIMUM_BOTOCORE} (and a matching boto3): add it to src/requirements.in,"
            " then run make lock"
        )


def require_tables(client: DynamoDBClient, names: Mapping[str, str]) -> None:
    """Raise ``ConfigurationError`` unless each table (logical id -> name) exists and the role may describe it."""
    for table, name in names.items():
        where = f"table {table} ({table_variable(table)}={name!r})"
        try:
            client.describe_table(TableName=name)
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code == "ResourceNotFoundException":
                raise ConfigurationError(f"{where} does not exist in this account and region") from None
            raise ConfigurationError(f"{where} cannot be reached: {code}: {error}") from None
        except BotoCoreError as error:
            raise ConfigurationError(f"{where} cannot be reached: {error}") from None
