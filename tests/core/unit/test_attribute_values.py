"""The function's own serializer gives what boto3's gives, and refuses what boto3 refuses."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from boto3.dynamodb.types import TypeSerializer
from hypothesis import example, given
from hypothesis import strategies as st

from consumer.idempotency.attribute_values import attribute_value

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.decimals(allow_nan=False, allow_infinity=False, places=4),
    # Past DynamoDB's 38 significant digits, on purpose: boto3 refuses these rather than round them.
    st.integers(10**37, 10**40).map(lambda digits: Decimal(digits).scaleb(-4)),
    st.integers(-(10**40), -(10**37)),
    st.text(max_size=20),
    st.binary(min_size=1, max_size=8),
)
_values = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
        st.frozensets(st.text(max_size=6), min_size=1, max_size=4),
        st.frozensets(st.integers(-1000, 1000), min_size=1, max_size=4),
    ),
    max_leaves=12,
)


def _canonical(value: Any) -> Any:
    """boto3 keeps set order and bytes wrappers as they come; compare as sets and bytes."""
    if isinstance(value, dict):
        return {key: (sorted(item) if key in ("SS", "NS") else _canonical(item)) for key, item in value.items()}
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    return bytes(value) if hasattr(value, "value") and isinstance(getattr(value, "value", None), bytes) else value


@given(_values)
@example(Decimal("10000000000000000000000000000000000.0001"))
@example(Decimal("12345678901234567890123456789012345678"))
def test_every_value_serializes_as_boto3_serializes_it(value: Any) -> None:
    try:
        expected = TypeSerializer().serialize(value)
    except (TypeError, ArithmeticError):
        with pytest.raises(TypeError):
            attribute_value(value)
    else:
        assert _canonical(attribute_value(value)) == _canonical(expected)


@pytest.mark.parametrize("value", [1.5, float("nan"), object(), set(), {1, "a"}])
def test_what_dynamodb_cannot_hold_exactly_is_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        attribute_value(value)


@pytest.mark.parametrize(
    "value",
    [
        Decimal("10000000000000000000000000000000000.0001"),  # 39 significant digits: DynamoDB would round it
        10**38,  # 39 digits as written: boto3 refuses it as rounded too
        Decimal("1E+200"),
        Decimal("1E-200"),
        {Decimal("123456789012345678901234567890123456789")},
    ],
)
def test_a_number_dynamodb_would_round_is_refused_not_stored_rounded(value: Any) -> None:
    with pytest.raises(TypeError, match=r"DynamoDB cannot hold .* exactly: at most 38 significant digits"):
        attribute_value(value)


@pytest.mark.parametrize("value", [Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity"), {Decimal("NaN")}])
def test_a_number_that_is_not_finite_is_refused(value: Any) -> None:
    with pytest.raises(TypeError, match="no DynamoDB number for"):
        attribute_value(value)


def test_numbers_keep_their_exact_digits() -> None:
    assert attribute_value(Decimal("1250.0010")) == {"N": "1250.0010"}
    assert attribute_value(10**20) == {"N": "100000000000000000000"}
