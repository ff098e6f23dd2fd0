"""Group commit in lock mode, on DynamoDB Local behind the conflict emulation: the lanes' lock messages claimed
at the same moment share a transaction, their handlers run side by side, and each commits as its own handler ends
(sharing a transaction with whatever else is ready then); each message's outcome, dead letter and webhook call are
what it gets alone.

The same batch (two new calls and a new hold beside a duplicate, a key in flight, a key reused and a refused hold)
is run by a consumer wired as the function is, grouping off and on. A shared claim's lost answer is each message's
own; one handler's failure releases only its own claim; a claim taken over meanwhile fences only its own commit.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import boto3
import pytest
from botocore.exceptions import ConnectionClosedError

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.config import Settings
from consumer.handler import MessageContext
from consumer.idempotency import IdempotencyStore
from consumer.outcome import Outcome
from consumer.prepared import Parsed, prepare
from testkit.lambda_sqs import sqs_record
from testkit.servers import LocalServers
from testkit.webhook import Answer, WebhookSink
from tests.core.handlers import (
    CALL_TABLE,
    HOLD_EVENT,
    TALLY_TABLE,
    HoldHandler,
    call_body,
    handlers_for_tests,
    hold_body,
    hold_key,
    tally_body,
    tally_total,
)
from tests.kit import Remaining, drain
from tests.utils import settings_on_local_servers


class Run:
    """A consumer wired as the function is, with grouping on or off, counting its DynamoDB writes by operation."""

    def __init__(
        self, servers: LocalServers, webhook: WebhookSink, on: bool, during: Callable[[MessageContext], None] | None
    ) -> None:
        # A lane each: every message's claim is ready at the same moment.
        self.settings: Settings = settings_on_local_servers(servers, max_workers=10, group_commit=on)
        self.calls: Counter[str] = Counter()
        # TransactWriteItems by the transition of its first item ("claim", "commit").
        self.kinds: Counter[str] = Counter()
        self.session = boto3.session.Session()
        self.session.events.register("before-call.dynamodb", lambda model, **_: self.calls.update([model.name]))
        # Transactions of a kind ("claim", "commit") to apply and then lose the answer of, as many as it says.
        self.lose: Counter[str] = Counter()
        self.session.events.register("before-parameter-build.dynamodb.TransactWriteItems", self._kind)
        self.session.events.register("after-call.dynamodb.TransactWriteItems", self._lose)
        self.handlers = {
            **handlers_for_tests(self.settings, webhook.url),
            HOLD_EVENT: HoldHandler(self.settings, during),
        }
        self.consumer: BatchRunner = wire(self.settings, self.session, handlers=self.handlers)
        self.dynamodb = self.session.client("dynamodb")
        self.store = IdempotencyStore(self.dynamodb, self.settings.idempotency_table_name, ttl_seconds=3600)
        self.webhook = webhook

    def _kind(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        condition = params["TransactItems"][0].get("Update", {}).get("ConditionExpression", "")
        context["kind"] = "claim" if condition.startswith("attribute_not_exists") else "commit" if condition else ""
        self.kinds[context["kind"]] += 1

    def _lose(self, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        """The request was applied, and its answer is lost: the consumer sees a dropped connection."""
        kind = context.get("kind", "")
        if self.lose[kind] > 0 and http_response.status_code == 200:
            self.lose[kind] -= 1
            raise ConnectionClosedError(endpoint_url="http://dynamodb")

    def process(self, batch: list[dict[str, Any]]) -> dict[str, Outcome]:
        self.calls.clear()
        self.kinds.clear()
        return {result.message_id: result.outcome for result in self.consumer.process(batch, Remaining()).results}

    def parsed(self, record: dict[str, Any]) -> Parsed:
        state = prepare(record, self.handlers, logging.getLogger("test")).state
        assert isinstance(state, Parsed)
        return state

    def dead_letters(self) -> list[str]:
        letters = drain(self.session.client("sqs"), self.settings.dead_letter_queue_url)
        return sorted(letter.original_message_id for letter in letters)

    def calls_table(self) -> str:
        return self.settings.table_names[CALL_TABLE]


@pytest.fixture(params=[False, True], ids=["alone", "grouped"])
def on(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def make(local_aws: LocalServers, webhook: WebhookSink, on: bool) -> Callable[..., Run]:
    def build(during: Callable[[MessageContext], None] | None = None) -> Run:
        return Run(local_aws, webhook, on, during)

    return build


# What each message of the refusals batch comes to, alone or grouped.
LOCK_REFUSALS = {
    "new-1": Outcome.APPLIED,
    "duplicate": Outcome.DUPLICATE,
    "key-reused": Outcome.POISON,
    "in-flight": Outcome.IN_FLIGHT,
    "refused": Outcome.POISON,
    "new-hold": Outcome.APPLIED,
    "new-7": Outcome.APPLIED,
}


def test_refusals_beside_new_lock_messages_give_each_its_own_outcome_in_fewer_transactions(
    make: Callable[..., Run], on: bool
) -> None:
    run = make()
    before = [
        sqs_record("earlier-dup", call_body("c-2", key="k-2")),
        sqs_record("earlier-reused", call_body("c-3", key="k-3")),
    ]
    assert set(run.process(before).values()) == {Outcome.APPLIED}
    run.webhook.clear()
    in_flight = sqs_record("in-flight", call_body("c-4", key="k-4"))
    held = run.parsed(in_flight).message
    assert type(run.store.claim(held.record_id, held.payload_hash, 600_000)).__name__ == "Claimed"
    # Another message's hold stands on h-5: the guard of the hold below is refused.
    run.dynamodb.put_item(
        TableName=run.calls_table(),
        Item={"callId": {"S": hold_key("h-5")["callId"]}, "status": {"S": "HELD"}, "holdToken": {"S": "another"}},
    )
    batch = [
        sqs_record("new-1", call_body("c-1", key="k-1")),
        sqs_record("duplicate", call_body("c-2", key="k-2")),
        sqs_record("key-reused", call_body("c-3", key="k-3", tally_id="t-other")),
        in_flight,
        sqs_record("refused", hold_body("h-5")),
        sqs_record("new-hold", hold_body("h-6")),
        sqs_record("new-7", call_body("c-7", key="k-7")),
    ]
    assert run.process(batch) == LOCK_REFUSALS
    assert run.dead_letters() == ["key-reused", "refused"]
    assert sorted(map(str, run.webhook.keys())) == ["k-1", "k-7"]
    for record_id in ("CallRequested#k-1", "CallRequested#k-7", "HoldRequested#hold-h-6"):
        record = run.store.get(record_id)
        assert record is not None and record.status.value == "COMPLETED"
    assert run.store.get("HoldRequested#hold-h-5") is None
    # Alone: seven claims (five single updates, two with their guard) and three commits. Grouped: the seven claimed
    # in one call, cancelled on four; the refused hold again alone (looking for an abandoned claim of its own); the
    # three new ones claimed again together; then each commits as its handler ends, with those ready at that moment.
    if on:
        assert (run.kinds["claim"], run.calls["UpdateItem"]) == (3, 0)
        assert 1 <= run.kinds["commit"] <= 3
    else:
        assert (run.calls["TransactWriteItems"], run.calls["UpdateItem"]) == (5, 5)


# Alone, a call's claim is no transaction. (A shared commit whose answer was lost: tests/core/unit/test_group_commit.py,
# where commits are made ready at one moment; here each commits as its own handler ends, shared or not.)
@pytest.mark.parametrize("on", [True], ids=["grouped"])
def test_a_lost_shared_claim_answer_is_each_messages_own(make: Callable[..., Run]) -> None:
    run = make()
    transition = "claim"
    run.lose[transition] = 1
    batch = [sqs_record(f"m-{n}", call_body(f"c-{n}", key=f"k-{n}")) for n in range(1, 4)]
    assert run.process(batch) == dict.fromkeys(["m-1", "m-2", "m-3"], Outcome.APPLIED)
    # The webhook was called once per message: no claim was taken for another's, and no commit ran twice.
    assert sorted(map(str, run.webhook.keys())) == ["k-1", "k-2", "k-3"]
    assert run.dead_letters() == []
    assert run.lose[transition] == 0
    records = [run.store.get(f"CallRequested#k-{n}") for n in range(1, 4)]
    assert [record.status.value if record else None for record in records] == ["COMPLETED"] * 3


def test_a_handler_failure_releases_only_its_own_claim(make: Callable[..., Run], webhook: WebhookSink) -> None:
    run = make()
    webhook.answer_next(Answer(status=503), key="k-2")
    batch = [sqs_record(f"m-{n}", call_body(f"c-{n}", key=f"k-{n}")) for n in range(1, 4)]
    outcomes = run.process(batch)
    assert outcomes == {"m-1": Outcome.APPLIED, "m-2": Outcome.RETRIED, "m-3": Outcome.APPLIED}
    assert run.store.get("CallRequested#k-2") is None
    for n in (1, 3):
        record = run.store.get(f"CallRequested#k-{n}")
        assert record is not None and record.status.value == "COMPLETED"
    # Released, so its retry claims at once and calls again with the same key.
    assert run.process([sqs_record("m-2", call_body("c-2", key="k-2"))]) == {"m-2": Outcome.APPLIED}


def test_a_claim_taken_over_meanwhile_fences_only_its_own_commit(make: Callable[..., Run]) -> None:
    holder: list[Run] = []

    def take_over(context: MessageContext) -> None:
        # Another worker took h-2's claim over while its handler ran (its lease ran out, say).
        if context.idempotency_key == "hold-h-2":
            run = holder[0]
            run.dynamodb.update_item(
                TableName=run.settings.idempotency_table_name,
                Key={"id": {"S": "HoldRequested#hold-h-2"}},
                UpdateExpression="SET ownerToken = :other",
                ExpressionAttributeValues={":other": {"S": "another-worker"}},
            )

    run = make(take_over)
    holder.append(run)
    batch = [sqs_record(f"m-{n}", hold_body(f"h-{n}")) for n in range(1, 4)]
    assert run.process(batch) == {"m-1": Outcome.APPLIED, "m-2": Outcome.RETRIED, "m-3": Outcome.APPLIED}
    taken = run.store.get("HoldRequested#hold-h-2")
    assert taken is not None and taken.status.value == "IN_PROGRESS" and taken.owner_token == "another-worker"
    done = run.dynamodb.get_item(TableName=run.calls_table(), Key={"callId": {"S": "HOLD#h-1"}}, ConsistentRead=True)
    assert done["Item"]["status"]["S"] == "DONE"
    held = run.dynamodb.get_item(TableName=run.calls_table(), Key={"callId": {"S": "HOLD#h-2"}}, ConsistentRead=True)
    assert held["Item"]["status"]["S"] == "HELD"


def test_a_rejected_call_dead_letters_only_its_own_message(make: Callable[..., Run], webhook: WebhookSink) -> None:
    run = make()
    webhook.answer_next(Answer(status=422), key="k-2")
    batch = [sqs_record(f"m-{n}", call_body(f"c-{n}", key=f"k-{n}")) for n in range(1, 4)]
    assert run.process(batch) == {"m-1": Outcome.APPLIED, "m-2": Outcome.POISON, "m-3": Outcome.APPLIED}
    assert run.dead_letters() == ["m-2"]
    # Released before its dead letter: nothing of it is left to hold its key.
    assert run.store.get("CallRequested#k-2") is None
    assert sorted(map(str, webhook.keys())) == ["k-1", "k-2", "k-3"]


def test_a_refused_commit_dead_letters_only_its_own_message(make: Callable[..., Run]) -> None:
    holder: list[Run] = []

    def cancel_hold(context: MessageContext) -> None:
        # The hold of h-2 is cancelled while its handler runs: its commit, final only over its hold, is refused.
        if context.idempotency_key == "hold-h-2":
            run = holder[0]
            run.dynamodb.delete_item(TableName=run.calls_table(), Key={"callId": {"S": "HOLD#h-2"}})

    run = make(cancel_hold)
    holder.append(run)
    batch = [sqs_record(f"m-{n}", hold_body(f"h-{n}")) for n in range(1, 4)]
    assert run.process(batch) == {"m-1": Outcome.APPLIED, "m-2": Outcome.POISON, "m-3": Outcome.APPLIED}
    assert run.dead_letters() == ["m-2"]
    for n in (1, 3):
        item = run.dynamodb.get_item(
            TableName=run.calls_table(), Key={"callId": {"S": f"HOLD#h-{n}"}}, ConsistentRead=True
        )
        assert item["Item"]["status"]["S"] == "DONE"


def test_optimistic_and_lock_messages_ready_together_share_a_transaction(make: Callable[..., Run], on: bool) -> None:
    run = make()
    calls = [sqs_record(f"call-{n}", call_body(f"c-{n}", key=f"k-{n}")) for n in range(1, 3)]
    tallies = [sqs_record(f"tally-{n}", tally_body(f"e-{n}", tally_id=f"t-{n}")) for n in range(1, 3)]
    assert set(run.process([calls[0], tallies[0], calls[1], tallies[1]]).values()) == {Outcome.APPLIED}
    assert sorted(map(str, run.webhook.keys())) == ["k-1", "k-2"]
    assert [tally_total(run.dynamodb, run.settings.table_names[TALLY_TABLE], f"t-{n}") for n in (1, 2)] == [1250] * 2
    # Grouped: the tallies' applies and the calls' claims, ready at one moment, in one transaction; then each call
    # commits as its handler ends, with the other if it is ready then.
    if on:
        assert run.calls["UpdateItem"] == 0
        assert run.kinds["claim"] == 1
        assert 2 <= run.calls["TransactWriteItems"] <= 3
    else:
        assert (run.calls["TransactWriteItems"], run.calls["UpdateItem"]) == (4, 2)
