"""Python values to DynamoDB attribute values (``{"S": ...}``, ``{"N": ...}``...).

The function talks to DynamoDB through botocore's low-level client, and importing
boto3 only for its serializer would drag its S3 transfer manager into every cold start.
Floats are refused, as boto3 refuses them: money is counted in integers here.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from decimal import Decimal
from typing import Any


def attribute_value(value: Any) -> dict[str, Any]:  # noqa: PLR0911 (one return per DynamoDB type)
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | Decimal):
        return {"N": str(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, bytes | bytearray):
        return {"B": bytes(value)}
    if isinstance(value, Mapping):
        return {"M": attribute_map(value)}
    if isinstance(value, list | tuple):
        return {"L": [attribute_value(item) for item in value]}
    if isinstance(value, Set) and value:
        if all(isinstance(item, str) for item in value):
            return {"SS": sorted(value)}
        if all(isinstance(item, int | Decimal) and not isinstance(item, bool) for item in value):
            return {"NS": sorted(str(item) for item in value)}
    raise TypeError(f"no DynamoDB attribute value for {type(value).__name__}: {value!r}")


def attribute_map(values: Mapping[str, Any]) -> dict[str, Any]:
    return {name: attribute_value(value) for name, value in values.items()}
