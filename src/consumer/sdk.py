"""The DynamoDB features this consumer needs, checked in the SDK the runtime loaded.

A duplicate costs one round trip only because a failed condition returns the old item
(``ReturnValuesOnConditionCheckFailure``), on ``UpdateItem`` and inside ``TransactWriteItems``.
An older botocore does not know that parameter: with client-side validation off, it would
send requests whose failures come back without the item, and every duplicate would look like
an unreadable record. The Lambda runtime's botocore is not pinned by AWS, so the function
asks the service model it actually loaded, at cold start, instead of trusting a version string.
"""

from __future__ import annotations

from typing import Any

import botocore
import botocore.session

from consumer.errors import ConfigurationError

PARAMETER = "ReturnValuesOnConditionCheckFailure"
# A release known to model the parameter on every operation below (it reached single-item writes in mid-2023).
MINIMUM_BOTOCORE = "1.31.0"
_TRANSACTION_ITEMS = ("Update", "Put", "Delete", "ConditionCheck")


def missing_features(service_model: Any) -> list[str]:
    """Where ``service_model`` (DynamoDB's) lacks the parameter: ``UpdateItem``, ``TransactWriteItems.Update``..."""
    missing = []
    if PARAMETER not in service_model.operation_model("UpdateItem").input_shape.members:
        missing.append("UpdateItem")
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
