"""Python values to DynamoDB attribute values (``{"S": ...}``, ``{"N": ...}``...).

The function talks to DynamoDB through botocore's low-level client, and importing
boto3 only for its serializer would drag its S3 transfer manager into every cold start.
Floats are refused, as boto3 refuses them: money is counted in integers here. A number
DynamoDB would round (past 38 significant digits) or cannot hold (out of its exponent
range, NaN, infinities) is refused too, with boto3's context, rather than stored other
than it was given.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from decimal import Clamped, Context, Decimal, DecimalException, Inexact, Overflow, Rounded, Underflow
from typing import Any

_DYNAMODB_NUMBERS = Context(Emin=-128, Emax=126, prec=38, traps=[Clamped, Overflow, Inexact, Rounded, Underflow])


def attribute_value(value: Any) -> dict[str, Any]:  # noqa: PLR0911 (one return per DynamoDB type)
    if value is None:
        return {"NULL": True}
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int | Decimal):
        return {"N": _number(value)}
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
            return {"NS": sorted(_number(item) for item in value)}
    raise TypeError(f"no DynamoDB attribute value for {type(value).__name__}: {value!r}")


def _number(value: int | Decimal) -> str:
    try:
        number = _DYNAMODB_NUMBERS.create_decimal(value)
    except DecimalException:
        raise TypeError(
            f"DynamoDB cannot hold {value!r} exactly: at most 38 significant digits, within its exponent range"
        ) from None
    if not number.is_finite():
        raise TypeError(f"no DynamoDB number for {value!r}")
    return str(number)


def attribute_map(values: Mapping[str, Any]) -> dict[str, Any]:
    return {name: attribute_value(value) for name, value in values.items()}
