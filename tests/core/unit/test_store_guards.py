"""The requests a guarded claim and a release with undo send (botocore's Stubber checks each against the API).

Their behaviour on DynamoDB Local is in tests/core/integration/test_guards.py; here, the shapes:
no guard is today's single ``UpdateItem``; a guard makes the claim one ``TransactWriteItems``
with the record first; a release with undo is one transaction fenced as the plain release is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from botocore.stub import ANY, Stubber

from consumer.idempotency import Claimed, IdempotencyStore, Refused
from consumer.idempotency.calls import CLAIM_UPDATE, OWNER
from consumer.idempotency.writes import ConditionCheck, Update
from tests.utils import offline_dynamodb

TABLE = "records"
GUARD = (
    ConditionCheck("accounts", {"id": "acc-1"}, "balanceCents >= :amount", values={":amount": 10}, reason="too low"),
    Update("accounts", {"id": "acc-2"}, "SET holdKey = :key", values={":key": "k-1"}),
)
UNDO = (Update("accounts", {"id": "acc-2"}, "REMOVE holdKey", condition="holdKey = :key", values={":key": "k-1"}),)


@pytest.fixture
def stubbed() -> Iterator[tuple[IdempotencyStore, Stubber]]:
    client = offline_dynamodb()
    with Stubber(client) as stubber:
        yield (
            IdempotencyStore(client, TABLE, ttl_seconds=3600, clock=lambda: 1_800_000_000.0, new_token=lambda: "t-1"),
            stubber,
        )
        stubber.assert_no_pending_responses()


def record_item(operation: str, **fields: Any) -> dict[str, Any]:
    return {operation: {"TableName": TABLE, "Key": {"id": {"S": "Ev#k-1"}}, **fields}}


def test_a_claim_without_a_guard_is_one_update_item(stubbed: tuple[IdempotencyStore, Stubber]) -> None:
    store, stubber = stubbed
    stubber.add_response(
        "update_item",
        {"Attributes": {"attempts": {"N": "1"}}},
        {
            "TableName": TABLE,
            "Key": {"id": {"S": "Ev#k-1"}},
            "UpdateExpression": CLAIM_UPDATE,
            "ConditionExpression": ANY,
            "ExpressionAttributeNames": ANY,
            "ExpressionAttributeValues": ANY,
            "ReturnValues": "UPDATED_NEW",
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        },
    )
    assert store.claim("Ev#k-1", "h", 1000) == Claimed("Ev#k-1", "t-1", 1_800_000_001_000, 1)


def test_a_guarded_claim_is_one_transaction_record_first(stubbed: tuple[IdempotencyStore, Stubber]) -> None:
    store, stubber = stubbed
    claim = record_item(
        "Update",
        UpdateExpression=CLAIM_UPDATE,
        ConditionExpression=ANY,
        ExpressionAttributeNames=ANY,
        ExpressionAttributeValues=ANY,
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )
    items = [claim, *(write.to_transact_item() for write in GUARD)]
    stubber.add_response("transact_write_items", {}, {"TransactItems": items, "ClientRequestToken": "t-1"})

    assert store.claim("Ev#k-1", "h", 1000, GUARD) == Claimed("Ev#k-1", "t-1", 1_800_000_001_000, None)


def test_a_guard_that_fails_on_a_free_key_is_refused_with_its_write(stubbed: tuple[IdempotencyStore, Stubber]) -> None:
    store, stubber = stubbed
    stubber.add_client_error(
        "transact_write_items",
        service_error_code="TransactionCanceledException",
        response_meta={},
        modeled_fields={
            "CancellationReasons": [{"Code": "None"}, {"Code": "ConditionalCheckFailed"}, {"Code": "None"}]
        },
    )
    # Then the record is read, consistently: a takeover's refusal would have an abandoned claim to release.
    stubber.add_response("get_item", {}, {"TableName": TABLE, "Key": {"id": {"S": "Ev#k-1"}}, "ConsistentRead": True})
    assert store.claim("Ev#k-1", "h", 1000, GUARD) == Refused(GUARD[0])


def test_a_release_with_undo_is_one_transaction_fenced_on_the_owner(stubbed: tuple[IdempotencyStore, Stubber]) -> None:
    store, stubber = stubbed
    claim = Claimed("Ev#k-1", "t-1", 1_800_000_001_000, None)
    delete = record_item(
        "Delete",
        ConditionExpression="#owner = :owner AND #status = :in_progress",
        ExpressionAttributeNames={"#owner": "ownerToken", "#status": "status"},
        ExpressionAttributeValues={OWNER: {"S": "t-1"}, ":in_progress": {"S": "IN_PROGRESS"}},
        ReturnValuesOnConditionCheckFailure="ALL_OLD",
    )
    items = [delete, *(write.to_transact_item() for write in UNDO)]
    tokens: list[str] = []
    for _ in range(2):
        stubber.add_response("transact_write_items", {}, {"TransactItems": items, "ClientRequestToken": ANY})

    def remember(params: dict[str, Any], **_: Any) -> None:
        tokens.append(params["ClientRequestToken"])

    stubber.client.meta.events.register("provide-client-params.dynamodb.TransactWriteItems", remember)

    assert store.release(claim, UNDO) is True
    assert store.release(claim, UNDO) is True
    # The same token each time: a release retried after its answer was lost is not applied twice.
    assert len(set(tokens)) == 1
    assert tokens[0] != "t-1"


HELD = Update(
    "accounts",
    {"id": "acc-2"},
    "SET holdToken = :token",
    condition="attribute_not_exists(holdToken) OR holdToken = :token",
    values={":token": "mine"},
    held_by="holdToken",
)


def test_a_write_marked_held_by_asks_for_its_item_when_its_condition_fails() -> None:
    assert HELD.to_transact_item()["Update"]["ReturnValuesOnConditionCheckFailure"] == "ALL_OLD"
    assert "ReturnValuesOnConditionCheckFailure" not in GUARD[1].to_transact_item()["Update"]


@pytest.mark.parametrize(
    ("item", "busy"),
    [
        ({"id": {"S": "acc-2"}, "holdToken": {"S": "another message's"}}, True),
        # Not held at all: the rule itself refused.
        ({"id": {"S": "acc-2"}}, False),
        (None, False),
    ],
)
def test_a_guard_whose_item_another_message_holds_is_busy_not_refused(
    stubbed: tuple[IdempotencyStore, Stubber], item: dict[str, Any] | None, busy: bool
) -> None:
    store, stubber = stubbed
    failed: dict[str, Any] = {"Code": "ConditionalCheckFailed"} | ({"Item": item} if item else {})
    stubber.add_client_error(
        "transact_write_items",
        service_error_code="TransactionCanceledException",
        response_meta={},
        modeled_fields={"CancellationReasons": [{"Code": "None"}, failed]},
    )
    if not busy:
        stubber.add_response(
            "get_item", {}, {"TableName": TABLE, "Key": {"id": {"S": "Ev#k-1"}}, "ConsistentRead": True}
        )

    assert store.claim("Ev#k-1", "h", 1000, (HELD,)) == Refused(HELD, busy=busy)


def test_a_write_without_held_by_is_refused_whoever_holds_its_item(stubbed: tuple[IdempotencyStore, Stubber]) -> None:
    store, stubber = stubbed
    unmarked = replace(HELD, held_by=None)
    held = {"Code": "ConditionalCheckFailed", "Item": {"id": {"S": "acc-2"}, "holdToken": {"S": "another message's"}}}
    stubber.add_client_error(
        "transact_write_items",
        service_error_code="TransactionCanceledException",
        response_meta={},
        modeled_fields={"CancellationReasons": [{"Code": "None"}, held]},
    )
    stubber.add_response("get_item", {}, {"TableName": TABLE, "Key": {"id": {"S": "Ev#k-1"}}, "ConsistentRead": True})

    assert store.claim("Ev#k-1", "h", 1000, (unmarked,)) == Refused(unmarked)
