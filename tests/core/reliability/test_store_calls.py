"""The harness names fault points after the state machine's steps, read from the requests on the
transport: the real store's requests must be recognised, or faults would silently stop being injected."""

from __future__ import annotations

import uuid
from typing import cast

import pytest

from chaos.store_calls import Step, StoreCall, classify
from chaos.transport_faults import TransportCall, TransportPlan, install_faults
from consumer.idempotency import Applied, Claimed, IdempotencyStore
from consumer.idempotency.answers import ApplyRequest, ClaimRequest
from consumer.idempotency.apply import Apply
from consumer.idempotency.claim import Claim
from consumer.idempotency.commit import Commit
from consumer.idempotency.writes import Put, Update
from testkit.aws import session as local_session
from testkit.dynamodb_local import DynamoDBLocal
from tests.conftest import TableFactory
from tests.utils import together


@pytest.fixture(scope="module")
def table(id_table: TableFactory) -> str:
    return id_table("calls")


def recording(
    dynamodb_local: DynamoDBLocal, table: str, group_commit_wait_ms: int | None = None
) -> tuple[IdempotencyStore, list[StoreCall]]:
    """A store whose every request is classified as the harness classifies it, in ``seen``."""
    seen: list[StoreCall] = []

    def record(call: TransportCall) -> TransportPlan | None:
        seen.append(classify(call, table))
        return None

    session = local_session()
    install_faults(session, record)
    client = session.client("dynamodb", endpoint_url=dynamodb_local.endpoint_url)
    return IdempotencyStore(client, table, ttl_seconds=3600, group_commit_wait_ms=group_commit_wait_ms), seen


def test_every_step_of_the_real_store_is_recognised(dynamodb_local: DynamoDBLocal, table: str) -> None:
    store, seen = recording(dynamodb_local, table)
    effect = Update(table=table, key={"id": "effect"}, expression="ADD n :one", values={":one": 1})
    first, second, third, fourth = (f"k-{uuid.uuid4().hex[:8]}" for _ in range(4))

    claim = store.claim(first, "h", lease_ms=5_000)
    assert isinstance(claim, Claimed)
    store.commit(claim, None, (effect,))
    claim = store.claim(second, "h", lease_ms=5_000)
    assert isinstance(claim, Claimed)
    store.commit(claim)
    claim = store.claim(third, "h", lease_ms=5_000)
    assert isinstance(claim, Claimed)
    assert store.release(claim)
    # A release with a guard's undo is a transaction: its record's Delete names the step.
    guarded = store.claim(fourth, "h", lease_ms=5_000)
    assert isinstance(guarded, Claimed)
    assert store.release(guarded, (effect,))
    applied = store.apply_once(f"{first}-optimistic", "h", None, (effect,))
    assert isinstance(applied, Applied)
    # A business Put beside the record is not the record's write.
    entry = Put(table=table, item={"id": f"{first}-entry"}, condition="attribute_not_exists(id)")
    with_entry = store.apply_once(f"{first}-with-entry", "h", None, (effect, entry))
    assert isinstance(with_entry, Applied)

    assert [(call.step, call.record_id) for call in seen] == [
        (Step.CLAIM, first),
        (Step.COMMIT, first),
        (Step.CLAIM, second),
        (Step.COMMIT, second),
        (Step.CLAIM, third),
        (Step.RELEASE, third),
        (Step.CLAIM, fourth),
        (Step.RELEASE, fourth),
        (Step.APPLY_ONCE, f"{first}-optimistic"),
        (Step.APPLY_ONCE, f"{first}-with-entry"),
    ]
    assert seen[-1].owner_token == with_entry.owner_token
    # The fencing token is read too: what a claim wrote is what its commit is conditioned on.
    assert seen[0].owner_token == seen[1].owner_token is not None
    assert seen[4].owner_token == seen[5].owner_token == claim.owner_token
    assert seen[7].owner_token == guarded.owner_token


def test_a_shared_transaction_is_its_first_records_step_carrying_the_others(
    dynamodb_local: DynamoDBLocal, table: str
) -> None:
    """A fault on a shared request befalls every message in it: the harness must know them all."""
    store, seen = recording(dynamodb_local, table, group_commit_wait_ms=2_000)
    first, second = (f"k-{uuid.uuid4().hex[:8]}" for _ in range(2))

    claims = together(store, [Claim(ClaimRequest(key, "h", 5_000), str(uuid.uuid4())) for key in (first, second)])
    together(store, [Commit(cast("Claimed", claim)) for claim in claims])
    together(store, [Apply(ApplyRequest(f"{key}-optimistic", "h"), str(uuid.uuid4())) for key in (first, second)])

    # Which message's record comes first is whichever reached the shared transaction first.
    assert [(call.step, {call.record_id, *call.others}) for call in seen] == [
        (Step.CLAIM, {first, second}),
        (Step.COMMIT, {first, second}),
        (Step.APPLY_ONCE, {f"{first}-optimistic", f"{second}-optimistic"}),
    ]
