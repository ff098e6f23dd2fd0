"""The contract, executable: the README's guarantees as one table of scenarios.

Each row is deliveries (batches, one invocation each, in order) and what must hold after
them: which records were reported for retry, the tallies' totals, their entries and the
recorded calls, the dead letters and their ``ErrorType``, the webhook calls. The function
runs wired as in Lambda (``consumer.app.wire``), on the core's test handlers (tests/core/handlers.py:
a tally, optimistic; a webhook call, lock mode), against DynamoDB Local behind the conflict
emulation and moto's SQS; every row on a stack of its own. An optimisation that changes a row fails here,
whatever it saves. README's guarantee table and this table name the same guarantees
(``test_the_readme_and_the_table_name_the_same_guarantees``).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from consumer.app import wire
from consumer.config import Settings, destination_variable
from consumer.envelope import parse_message
from consumer.idempotency import Claimed, Fenced, IdempotencyStore
from consumer.idempotency.record import Status
from consumer.outbox import OUTBOX_TABLE
from consumer.relay import RelayHandler
from local.stream_poller import StreamPoller
from testkit.invocation import InProcess
from testkit.lambda_sqs import FIFO_QUEUE_ARN, record_from_message, sqs_record
from testkit.resources import FunctionSpec, StreamTrigger
from testkit.servers import LocalServers
from testkit.webhook import Answer, WebhookSink
from tests.core.handlers import (
    CALL_EVENT,
    CALL_TABLE,
    LOCKED_NOTICE_EVENT,
    NOTICE_EVENT,
    NOTICE_QUEUE,
    TALLY_EVENT,
    TALLY_TABLE,
    LockedNoticeHandler,
    NoticeHandler,
    call_payload,
    envelope,
    handlers_for_tests,
    notice_body,
    tally_payload,
    tally_total,
)
from tests.kit import Remaining, drain
from tests.utils import settings_on_local_servers

README = Path(__file__).resolve().parents[2] / "README.md"
SqsMessage = dict[str, Any]


def add(message_id: str, entry_id: str, *, key: str | None = "", tally: str = "t-1", amount: int = 100) -> SqsMessage:
    """A tally entry's record; ``key=""`` keys it by its entry, ``None`` leaves the body without a key."""
    body = envelope(TALLY_EVENT, f"k-{entry_id}" if key == "" else key, tally_payload(entry_id, tally, amount))
    return sqs_record(message_id, body)


def call(message_id: str, call_id: str) -> SqsMessage:
    return sqs_record(message_id, envelope(CALL_EVENT, f"k-{call_id}", call_payload(call_id)))


def grouped(record: SqsMessage, group: str, *, fifo: bool) -> SqsMessage:
    """The record as a FIFO queue (or, ``fifo=False``, a fair queue's tenant) delivers it."""
    attributes = {**record["attributes"], "MessageGroupId": group}
    return {**record, "attributes": attributes, **({"eventSourceARN": FIFO_QUEUE_ARN} if fifo else {})}


@dataclass
class Stack:
    """One row's stack: the function as Lambda wires it, and what a test may read or do beside it."""

    settings: Settings
    sink: WebhookSink
    dynamodb: Any = field(default_factory=lambda: boto3.client("dynamodb"))
    sqs: Any = field(default_factory=lambda: boto3.client("sqs"))

    def __post_init__(self) -> None:
        handlers = {
            **handlers_for_tests(self.settings, f"{self.sink.url}/calls", timeout_ms=2_000),
            NOTICE_EVENT: NoticeHandler(self.settings),
            LOCKED_NOTICE_EVENT: LockedNoticeHandler(self.settings),
        }
        self.function = wire(self.settings, boto3.session.Session(), handlers=handlers)
        self.store = IdempotencyStore(self.dynamodb, self.settings.idempotency_table_name, ttl_seconds=3600)
        # Where the relay sends the notices' messages: a queue of this row's own.
        notices = self.sqs.create_queue(QueueName=f"notices-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        self.notices = (notices, self.sqs.get_queue_attributes(QueueUrl=notices, AttributeNames=["QueueArn"]))

    def relay(self) -> None:
        """The outbox's stream through the relay, from its oldest record, as Lambda's mapping runs it."""
        outbox = self.settings.table_names[OUTBOX_TABLE]
        stream_arn = self.dynamodb.describe_table(TableName=outbox)["Table"]["LatestStreamArn"]
        trigger = StreamTrigger(OUTBOX_TABLE, stream_arn, 100, True, True, 10)
        relay = RelayHandler({destination_variable(NOTICE_QUEUE): self.notices[0]})
        spec = FunctionSpec("RelayFunction", "relay", "", "consumer.relay.handler", Path(), 60, 512)
        StreamPoller(boto3.client("dynamodbstreams"), self.sqs, trigger, InProcess(spec, relay), idle_s=0).drain()

    def relayed(self) -> list[SqsMessage]:
        """What the relay sent, taken from its queue as Lambda's SQS mapping would hand it to this consumer."""
        url, attributes = self.notices
        taken: list[SqsMessage] = []
        while answer := self.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=0
        ).get("Messages"):
            for message in answer:
                taken.append(record_from_message(message, queue_arn=attributes["Attributes"]["QueueArn"]))
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return taken

    def deliver(self, records: list[SqsMessage]) -> list[str]:
        response = self.function.process(records, Remaining()).response()
        return [failure["itemIdentifier"] for failure in response["batchItemFailures"]]

    def total(self, tally: str) -> int:
        return tally_total(self.dynamodb, self.settings.table_names[TALLY_TABLE], tally)

    def entries(self) -> set[str]:
        """Each tally's entries (``t-1/ENTRY#e-1``) and each recorded call (``CALL#c-1``)."""
        tallies = self._scan(TALLY_TABLE)
        calls = self._scan(CALL_TABLE)
        return {f"{i['tallyId']['S']}/{i['entryId']['S']}" for i in tallies if i["entryId"]["S"] != "TOTAL"} | {
            f"CALL#{i['callId']['S']}" for i in calls
        }

    def _scan(self, table: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.dynamodb.scan(
            TableName=self.settings.table_names[table], ConsistentRead=True
        )["Items"]
        return items

    def dead_letters(self) -> dict[str, str | None]:
        letters = drain(self.sqs, self.settings.dead_letter_queue_url)
        return {letter.original_message_id: letter.error_type for letter in letters}


@dataclass(frozen=True)
class Row:
    name: str
    guarantee: str  # the README guarantee-table row it proves
    deliveries: list[list[SqsMessage]]
    failed: list[list[str]]  # reported for retry, per delivery
    totals: dict[str, int] = field(default_factory=dict)
    entries: set[str] | None = None
    dead: dict[str, str] = field(default_factory=dict)
    webhook: list[Answer] = field(default_factory=list)  # the sink's next answers
    calls: int | None = None  # webhook calls expected
    before: Callable[[Stack], None] | None = None  # what another worker did first
    after: Callable[[Stack], None] | None = None  # further checks


def _claimed_by_another_worker(record: SqsMessage, lease_ms: int, then_wait_s: float = 0.0) -> Callable[[Stack], None]:
    """Another worker claimed the record's key (and, with ``then_wait_s`` past its lease, crashed holding it)."""
    message = parse_message(record)

    def hold(stack: Stack) -> None:
        claim = stack.store.claim(message.record_id, message.payload_hash, lease_ms)
        assert isinstance(claim, Claimed)
        time.sleep(then_wait_s)

    return hold


def _zombie_cannot_overwrite(stack: Stack) -> None:
    """A worker whose lease ran out while the key was taken over and committed: its writes are refused."""
    zombie = stack.store.claim(f"{CALL_EVENT}#k-z1", parse_message(call("z1", "z1")).payload_hash, 1)
    assert isinstance(zombie, Claimed)
    time.sleep(0.01)
    assert stack.deliver([call("z1", "z1")]) == []

    assert isinstance(stack.store.commit(zombie), Fenced)
    assert stack.store.release(zombie) is False
    record = stack.store.get(f"{CALL_EVENT}#k-z1")
    assert record is not None and record.status is Status.COMPLETED and record.owner_token != zombie.owner_token


def _record_completed(record_id: str) -> Callable[[Stack], None]:
    def check(stack: Stack) -> None:
        record = stack.store.get(record_id)
        assert record is not None and record.status is Status.COMPLETED, record

    return check


def notice(message_id: str, notice_id: str, count: int, **fields: Any) -> SqsMessage:
    """A notice that emits ``count`` tally messages, each adding 1 to ``t-1``."""
    return sqs_record(message_id, notice_body(notice_id, count, **fields))


def _relayed_twice_then_applied(stack: Stack) -> None:
    """The relay runs the stream twice from its start (it died before its checkpoint), then everything it sent is
    delivered to this consumer in one batch, copies and all."""
    stack.relay()
    stack.relay()
    assert stack.deliver(stack.relayed()) == []


ATTRIBUTE_KEY = {"IdempotencyKey": {"stringValue": "attr-key-1", "dataType": "String"}}
NO_KEY = envelope(TALLY_EVENT, None, tally_payload("e-nokey"))

ROWS = [
    # -- Exactly-once DynamoDB effects ------------------------------------------------------------
    Row("a new message is applied once", "Exactly-once DynamoDB effects",
        [[add("m1", "p-1")]], [[]], {"t-1": 100}, {"t-1/ENTRY#p-1"}),
    Row("an SQS redelivery (same messageId) applies nothing", "Exactly-once DynamoDB effects",
        [[add("m1", "p-1")], [add("m1", "p-1")]], [[], []], {"t-1": 100}),
    Row("a producer resend (new messageId, same key) applies nothing", "Exactly-once DynamoDB effects",
        [[add("m1", "p-1")], [add("m2", "p-1")]], [[], []], {"t-1": 100}),
    Row("a duplicate inside one batch applies nothing", "Exactly-once DynamoDB effects",
        [[add("m1", "p-1"), add("m2", "p-1")]], [[]], {"t-1": 100}),
    Row("the key from the IdempotencyKey attribute", "Exactly-once DynamoDB effects",
        [[{**sqs_record("m1", NO_KEY), "messageAttributes": ATTRIBUTE_KEY}],
         [{**sqs_record("m2", NO_KEY), "messageAttributes": ATTRIBUTE_KEY}]],
        [[], []], {"t-1": 1250}, after=_record_completed(f"{TALLY_EVENT}#attr-key-1")),
    Row("without a key, the messageId is the key", "Exactly-once DynamoDB effects",
        [[sqs_record("m1", NO_KEY)], [sqs_record("m1", NO_KEY)]], [[], []], {"t-1": 1250},
        after=_record_completed(f"{TALLY_EVENT}#m1")),
    Row("the same entry under another key is refused by its condition", "Exactly-once DynamoDB effects",
        [[add("m1", "p-1", key="a")], [add("m2", "p-1", key="b")]], [[], []], {"t-1": 100},
        dead={"m2": "BusinessConditionFailed"}),
    # -- One key, one content ----------------------------------------------------------------------
    Row("a key reused for the same entry with another amount", "One key, one content",
        [[add("m1", "p-1", key="k")], [add("m2", "p-1", key="k", amount=999)]], [[], []], {"t-1": 100},
        dead={"m2": "IdempotencyKeyReused"}),
    Row("a key used as its own entryId, then for another entry on another tally", "One key, one content",
        [[add("m1", "p-17", key="p-17")], [add("m2", "p-18", key="p-17", tally="t-2", amount=700)]],
        [[], []], {"t-1": 100, "t-2": 0}, {"t-1/ENTRY#p-17"}, dead={"m2": "IdempotencyKeyReused"}),
    # -- Nothing lost ------------------------------------------------------------------------------
    *(
        Row(f"poison: {error_type}", "Nothing lost", [[sqs_record("m1", body)]], [[]], dead={"m1": error_type})
        for error_type, body in [
            ("InvalidJson", '{"eventType": '),
            ("SchemaViolation", envelope(TALLY_EVENT, "k", {"entryId": "e-1"})),
            ("UnknownEventType", envelope("NoSuchEvent", "k", {})),
            ("BodyTooLarge", " " * (1024 * 1024 + 1)),
            ("NestingTooDeep", "[" * 40 + "]" * 40),
        ]
    ),
    Row("a call the webhook accepts", "Nothing lost",
        [[call("m1", "r-1")]], [[]], entries={"CALL#r-1"}, calls=1),
    Row("a call after a 5xx, then a 200", "Nothing lost",
        [[call("m1", "r-1")], [call("m1", "r-1")]], [["m1"], []], entries={"CALL#r-1"},
        webhook=[Answer(503)], calls=2),
    Row("a call the webhook rejects (4xx)", "Nothing lost",
        [[call("m1", "r-1")]], [[]], entries=set(), dead={"m1": "WebhookRejected"}, webhook=[Answer(422)], calls=1),
    Row("a call in flight elsewhere is reported, not run", "Nothing lost",
        [[call("m1", "r-1")]], [["m1"]], entries=set(), calls=0,
        before=_claimed_by_another_worker(call("m1", "r-1"), 60_000)),
    # -- Fencing -----------------------------------------------------------------------------------
    Row("a zombie cannot overwrite or release the newer owner's record", "Fencing",
        [], [], entries={"CALL#z1"}, after=_zombie_cannot_overwrite),
    # -- No stuck records --------------------------------------------------------------------------
    Row("a crashed worker's claim ends with its lease", "No stuck records",
        [[call("m1", "r-1")]], [[]], entries={"CALL#r-1"}, calls=1,
        before=_claimed_by_another_worker(call("m1", "r-1"), 50, then_wait_s=0.2)),
    # -- One bad message never fails the batch -------------------------------------------------------
    Row("poison, a failure and good messages in one batch", "One bad message never fails the batch",
        [[add("m1", "p-1"), sqs_record("m2", "{"), call("m3", "r-1"), add("m4", "p-2", tally="t-2")]],
        [["m3"]], {"t-1": 100, "t-2": 100}, dead={"m2": "InvalidJson"}, webhook=[Answer(503)]),
    # -- Each message as if alone -----------------------------------------------------------------------
    Row("messages sharing transactions each get their own outcome", "Each message as if alone",
        [[add("m1", "p-1"), add("m2", "p-2", tally="t-2"), call("m3", "r-1"), sqs_record("m4", "{"),
          add("m5", "p-1", key="k-p-1", amount=999), call("m6", "r-2")]],
        [[]], {"t-1": 100, "t-2": 100}, {"t-1/ENTRY#p-1", "t-2/ENTRY#p-2", "CALL#r-1", "CALL#r-2"},
        dead={"m4": "InvalidJson", "m5": "IdempotencyKeyReused"}, calls=2),
    # -- Messages out, exactly once -------------------------------------------------------------------
    Row("an applied message's messages, relayed twice, are applied once downstream", "Messages out, exactly once",
        [[notice("m1", "n-1", 2)], [notice("m2", "n-1", 2)]], [[], []], {"t-1": 2},
        {"t-1/NOTICE#n-1", "t-1/ENTRY#n-1.0", "t-1/ENTRY#n-1.1"}, after=_relayed_twice_then_applied),
    Row("a lock-mode message emits with its commit, once", "Messages out, exactly once",
        [[notice("m1", "n-1", 1, locked=True)], [notice("m1", "n-1", 1, locked=True)]], [[], []], {"t-1": 1},
        {"t-1/NOTICE#n-1", "t-1/ENTRY#n-1.0"}, after=_relayed_twice_then_applied),
    Row("a message refused by its condition emits nothing", "Messages out, exactly once",
        [[notice("m1", "n-1", 1)], [notice("m2", "n-1", 3, key="another-key")]], [[], []], {"t-1": 1},
        {"t-1/NOTICE#n-1", "t-1/ENTRY#n-1.0"}, dead={"m2": "BusinessConditionFailed"},
        after=_relayed_twice_then_applied),
    Row("a message to an undeclared destination is dead-lettered and emits nothing", "Messages out, exactly once",
        [[notice("bad", "n-1", 1, destination="ElsewhereQueue"), notice("good", "n-2", 1)]], [[]], {"t-1": 1},
        {"t-1/NOTICE#n-2", "t-1/ENTRY#n-2.0"}, dead={"bad": "UndeclaredDestination"},
        after=_relayed_twice_then_applied),
    # -- Order on FIFO queues, none on standard and fair queues -------------------------------------
    Row("FIFO: a group stops at its first failure; the rest of the group follows it", "Order only on FIFO queues",
        [[grouped(add("a1", "p-1"), "A", fifo=True), grouped(call("a2", "r-1"), "A", fifo=True),
          grouped(add("a3", "p-3"), "A", fifo=True), grouped(add("b1", "p-4", tally="t-b"), "B", fifo=True)],
         [grouped(call("a2", "r-1"), "A", fifo=True), grouped(add("a3", "p-3"), "A", fifo=True)]],
        [["a2", "a3"], []], {"t-1": 200, "t-b": 100}, webhook=[Answer(503)], calls=2),
    Row("fair queue: a tenant's failure holds back none of its records", "Order only on FIFO queues",
        [[grouped(add("a1", "p-1"), "t-1", fifo=False), grouped(call("a2", "r-1"), "t-1", fifo=False),
          grouped(add("a3", "p-3"), "t-1", fifo=False)]],
        [["a2"]], {"t-1": 200}, webhook=[Answer(503)], calls=1),
]  # fmt: skip


@pytest.fixture
def make_stack(local_servers: LocalServers, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Stack]]:
    for name, value in {
        "AWS_ENDPOINT_URL_DYNAMODB": local_servers.dynamodb_endpoint_url,
        "AWS_ENDPOINT_URL_SQS": local_servers.sqs_endpoint_url,
        "AWS_ENDPOINT_URL_DYNAMODB_STREAMS": local_servers.dynamodb_endpoint_url,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
    }.items():
        monkeypatch.setenv(name, value)
    with WebhookSink() as sink:

        def make() -> Stack:
            settings = settings_on_local_servers(local_servers)
            return Stack(settings, sink)

        yield make


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_contract(row: Row, make_stack: Callable[[], Stack]) -> None:
    stack = make_stack()
    stack.sink.clear()
    if row.webhook:
        stack.sink.answer_next(*row.webhook)
    if row.before:
        row.before(stack)
    failed = [stack.deliver(batch) for batch in row.deliveries]
    if row.after:
        row.after(stack)

    assert failed == row.failed
    assert {tally: stack.total(tally) for tally in row.totals} == row.totals
    if row.entries is not None:
        assert stack.entries() == row.entries
    assert stack.dead_letters() == row.dead
    if row.calls is not None:
        assert len(stack.sink.received()) == row.calls


def _readme_guarantees() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## What it guarantees") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"^\| \*\*(.+?)\*\* \|", section, flags=re.MULTILINE)


def test_the_readme_and_the_table_name_the_same_guarantees() -> None:
    readme = _readme_guarantees()
    assert readme, "README's guarantee table was not found"
    assert sorted(set(readme)) == sorted({row.guarantee for row in ROWS})


def test_every_row_has_a_name_of_its_own() -> None:
    assert len({row.name for row in ROWS}) == len(ROWS)
