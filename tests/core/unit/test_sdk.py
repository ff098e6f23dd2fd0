"""The cold-start checks: the runtime's botocore (against the real model and older ones) and the tables."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, cast

import botocore.session
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError
from botocore.model import ServiceModel

from consumer.errors import ConfigurationError
from consumer.sdk import MINIMUM_BOTOCORE, PARAMETER, missing_features, require_botocore, require_tables


class _SessionWith:
    """A botocore session stand-in whose DynamoDB model is an edited copy of the installed one."""

    def __init__(self, edit: Callable[[dict[str, Any]], None]) -> None:
        loader = botocore.session.get_session().get_component("data_loader")
        description = copy.deepcopy(loader.load_service_model("dynamodb", "service-2"))
        edit(description["shapes"])
        self._model = ServiceModel(description, service_name="dynamodb")

    def get_service_model(self, service_name: str) -> ServiceModel:
        assert service_name == "dynamodb"
        return self._model


def _drop_from(*shapes: str) -> Callable[[dict[str, Any]], None]:
    def edit(described: dict[str, Any]) -> None:
        for shape in shapes:
            del described[shape]["members"][PARAMETER]

    return edit


def test_installed_botocore_has_everything_the_store_uses() -> None:
    assert missing_features(botocore.session.get_session().get_service_model("dynamodb")) == []
    require_botocore()


@pytest.mark.parametrize("operation", ["UpdateItem", "DeleteItem"])
def test_a_model_without_the_parameter_on_a_single_item_write_is_refused_with_the_version_needed(
    operation: str,
) -> None:
    with pytest.raises(ConfigurationError, match=rf"on {operation}: bundle botocore>={MINIMUM_BOTOCORE}"):
        require_botocore(_SessionWith(_drop_from(f"{operation}Input")))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("shape", "named"),
    [
        ("Update", "TransactWriteItems.Update"),
        ("Put", "TransactWriteItems.Put"),
        ("Delete", "TransactWriteItems.Delete"),
        ("ConditionCheck", "TransactWriteItems.ConditionCheck"),
    ],
)
def test_a_model_without_the_parameter_inside_a_transaction_names_the_item_kind(shape: str, named: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"on {named}:"):
        require_botocore(_SessionWith(_drop_from(shape)))  # type: ignore[arg-type]


def test_an_old_model_lists_every_place_it_lacks_the_parameter() -> None:
    old = _SessionWith(_drop_from("UpdateItemInput", "DeleteItemInput", "Update", "Put", "Delete", "ConditionCheck"))
    assert missing_features(old.get_service_model("dynamodb")) == [
        "UpdateItem",
        "DeleteItem",
        "TransactWriteItems.Update",
        "TransactWriteItems.Put",
        "TransactWriteItems.Delete",
        "TransactWriteItems.ConditionCheck",
    ]


class _Describing:
    """A DynamoDB client whose DescribeTable fails as given."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def describe_table(self, TableName: str) -> dict[str, Any]:  # noqa: N803 (boto3's parameter name)
        raise self.error


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (ClientError({"Error": {"Code": "ResourceNotFoundException"}}, "DescribeTable"), "does not exist"),
        (ClientError({"Error": {"Code": "AccessDeniedException"}}, "DescribeTable"), "cannot be reached: Access"),
        (EndpointConnectionError(endpoint_url="https://dynamodb.example"), "cannot be reached: Could not connect"),
    ],
    ids=["missing", "not-granted", "unreachable"],
)
def test_a_table_the_function_cannot_use_is_a_configuration_error_naming_it(error: Exception, said: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"table InventoryTable \(INVENTORY_TABLE_NAME='inv'\) {said}"):
        require_tables(cast(Any, _Describing(error)), {"InventoryTable": "inv"})
