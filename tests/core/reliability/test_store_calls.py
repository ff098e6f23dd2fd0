"""The harness names fault points after the state machine's steps, read from the requests on the
transport: the real store's requests must be recognised, or faults would silently stop being injected."""

from __future__ import annotations

import uuid

import pytest

from chaos.store_calls import Step, StoreCall, classify
from chaos.transport_faults import TransportCall, TransportPlan, install_faults
from consumer.idempotency.store import Applied, Claimed, IdempotencyStore
from consumer.idempotency.writes import Put, Update
from testkit.aws import session as local_session
from testkit.dynamodb_local import DynamoDBLocal
from tests.conftest import TableFactory


@pytest.fixture(scope="module")
def table(id_table: TableFactory) -> str:
    return id_table("calls")


def test_every_step_of_the_real_store_is_recognised(dynamodb_local: DynamoDBLocal, table: str) -> None:
    seen: list[StoreCall] = []

    def record(call: TransportCall) -> TransportPlan | None:
        seen.append(classify(call, table))
        return None

    session = local_session()
    install_faults(session, record)
    store = IdempotencyStore(
        session.client("dynamodb", endpoint_url=dynamodb_local.endpoint_url), table, ttl_seconds=3600
    )
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
