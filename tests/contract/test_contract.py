"""The contract, executable: the README's guarantees as one table of scenarios.

Each row is deliveries (batches, one invocation each, in order) and what must hold after
them: which records were reported for retry, the balances, the ledger entries, the dead
letters and their ``ErrorType``, the webhook calls. The function runs wired exactly as in
Lambda (``consumer.app.wire``) against DynamoDB Local behind the conflict emulation and
moto's SQS; every row on a stack of its own. An optimisation that changes a row fails here,
whatever it saves. README's guarantee table and this table name the same guarantees
(``test_the_readme_and_the_table_name_the_same_guarantees``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from consumer.app import wire
from consumer.config import Settings
from consumer.envelope import parse_message
from consumer.errors import LeaseLost
from consumer.idempotency.record import Status
from consumer.idempotency.store import Claimed, IdempotencyStore
from testkit import dead_letters
from testkit.lambda_sqs import FIFO_QUEUE_ARN, sqs_record
from testkit.messages import envelope, ledger_balance, payment_payload, receipt_payload
from testkit.servers import LocalServers
from testkit.webhook import Answer, WebhookSink
from tests.utils import Remaining, settings_for_tests

README = Path(__file__).resolve().parents[2] / "README.md"
Record = dict[str, Any]


def pay(message_id: str, payment_id: str, *, key: str | None = "", account: str = "acc-1", amount: int = 100) -> Record:
    """A PaymentReceived record; ``key=""`` keys it by its payment, ``None`` leaves the body without a key."""
    body = envelope(
        "PaymentReceived", f"k-{payment_id}" if key == "" else key, payment_payload(payment_id, account, amount)
    )
    return sqs_record(message_id, body)


def receipt(message_id: str, receipt_id: str) -> Record:
    return sqs_record(message_id, envelope("ReceiptRequested", f"k-{receipt_id}", receipt_payload(receipt_id)))


def grouped(record: Record, group: str, *, fifo: bool) -> Record:
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
        self.function = wire(self.settings, boto3.session.Session())
        self.store = IdempotencyStore(self.dynamodb, self.settings.idempotency_table_name, ttl_seconds=3600)

    def deliver(self, records: list[Record]) -> list[str]:
        response = self.function.process(records, Remaining()).response()
        return [failure["itemIdentifier"] for failure in response["batchItemFailures"]]

    def balance(self, account: str) -> int:
        return ledger_balance(self.dynamodb, self.settings.table_names["LedgerTable"], account)

    def entries(self) -> set[str]:
        items = self.dynamodb.scan(TableName=self.settings.table_names["LedgerTable"], ConsistentRead=True)["Items"]
        return {f"{i['accountId']['S']}/{i['entryId']['S']}" for i in items if i["entryId"]["S"] != "BALANCE"}

    def dead_letters(self) -> dict[str, str | None]:
        letters = dead_letters.drain(self.sqs, self.settings.dead_letter_queue_url)
        return {letter.original_message_id: letter.error_type for letter in letters}


@dataclass(frozen=True)
class Row:
    name: str
    guarantee: str  # the README guarantee-table row it proves
    deliveries: list[list[Record]]
    failed: list[list[str]]  # reported for retry, per delivery
    balances: dict[str, int] = field(default_factory=dict)
    entries: set[str] | None = None
    dead: dict[str, str] = field(default_factory=dict)
    webhook: list[Answer] = field(default_factory=list)  # the sink's next answers
    calls: int | None = None  # webhook calls expected
    before: Callable[[Stack], None] | None = None  # what another worker did first
    after: Callable[[Stack], None] | None = None  # further checks


def _claimed_by_another_worker(record: Record, lease_ms: int, then_wait_s: float = 0.0) -> Callable[[Stack], None]:
    """Another worker claimed the record's key (and, with ``then_wait_s`` past its lease, crashed holding it)."""
    message = parse_message(record)

    def hold(stack: Stack) -> None:
        claim = stack.store.claim(message.record_id, message.payload_hash, lease_ms)
        assert isinstance(claim, Claimed)
        time.sleep(then_wait_s)

    return hold


def _zombie_cannot_overwrite(stack: Stack) -> None:
    """A worker whose lease ran out while the key was taken over and committed: its writes are refused."""
    zombie = stack.store.claim("ReceiptRequested#k-z1", parse_message(receipt("z1", "z1")).payload_hash, 1)
    assert isinstance(zombie, Claimed)
    time.sleep(0.01)
    assert stack.deliver([receipt("z1", "z1")]) == []

    with pytest.raises(LeaseLost):
        stack.store.commit(zombie)
    assert stack.store.release(zombie) is False
    record = stack.store.get("ReceiptRequested#k-z1")
    assert record is not None and record.status is Status.COMPLETED and record.owner_token != zombie.owner_token


def _record_completed(record_id: str) -> Callable[[Stack], None]:
    def check(stack: Stack) -> None:
        record = stack.store.get(record_id)
        assert record is not None and record.status is Status.COMPLETED, record

    return check


ATTRIBUTE_KEY = {"IdempotencyKey": {"stringValue": "attr-key-1", "dataType": "String"}}
NO_KEY = envelope("PaymentReceived", None, payment_payload("p-nokey"))

ROWS = [
    # -- Exactly-once DynamoDB effects ------------------------------------------------------------
    Row("a new payment is applied once", "Exactly-once DynamoDB effects",
        [[pay("m1", "p-1")]], [[]], {"acc-1": 100}, {"acc-1/PAYMENT#p-1"}),
    Row("an SQS redelivery (same messageId) applies nothing", "Exactly-once DynamoDB effects",
        [[pay("m1", "p-1")], [pay("m1", "p-1")]], [[], []], {"acc-1": 100}),
    Row("a producer resend (new messageId, same key) applies nothing", "Exactly-once DynamoDB effects",
        [[pay("m1", "p-1")], [pay("m2", "p-1")]], [[], []], {"acc-1": 100}),
    Row("a duplicate inside one batch applies nothing", "Exactly-once DynamoDB effects",
        [[pay("m1", "p-1"), pay("m2", "p-1")]], [[]], {"acc-1": 100}),
    Row("the key from the IdempotencyKey attribute", "Exactly-once DynamoDB effects",
        [[{**sqs_record("m1", NO_KEY), "messageAttributes": ATTRIBUTE_KEY}],
         [{**sqs_record("m2", NO_KEY), "messageAttributes": ATTRIBUTE_KEY}]],
        [[], []], {"acc-1": 1250}, after=_record_completed("PaymentReceived#attr-key-1")),
    Row("without a key, the messageId is the key", "Exactly-once DynamoDB effects",
        [[sqs_record("m1", NO_KEY)], [sqs_record("m1", NO_KEY)]], [[], []], {"acc-1": 1250},
        after=_record_completed("PaymentReceived#m1")),
    Row("the same payment under another key is refused by its ledger entry", "Exactly-once DynamoDB effects",
        [[pay("m1", "p-1", key="a")], [pay("m2", "p-1", key="b")]], [[], []], {"acc-1": 100},
        dead={"m2": "BusinessConditionFailed"}),
    # -- One key, one content ----------------------------------------------------------------------
    Row("a key reused for the same payment with another amount", "One key, one content",
        [[pay("m1", "p-1", key="k")], [pay("m2", "p-1", key="k", amount=999)]], [[], []], {"acc-1": 100},
        dead={"m2": "IdempotencyKeyReused"}),
    Row("a key used as its own paymentId, then for another payment on another account", "One key, one content",
        [[pay("m1", "p-17", key="p-17")], [pay("m2", "p-18", key="p-17", account="acc-2", amount=700)]],
        [[], []], {"acc-1": 100, "acc-2": 0}, {"acc-1/PAYMENT#p-17"}, dead={"m2": "IdempotencyKeyReused"}),
    # -- Nothing lost ------------------------------------------------------------------------------
    *(
        Row(f"poison: {error_type}", "Nothing lost", [[sqs_record("m1", body)]], [[]], dead={"m1": error_type})
        for error_type, body in [
            ("InvalidJson", '{"eventType": '),
            ("SchemaViolation", envelope("PaymentReceived", "k", {"paymentId": "p-1"})),
            ("UnknownEventType", envelope("NoSuchEvent", "k", {})),
            ("BodyTooLarge", " " * (1024 * 1024 + 1)),
            ("NestingTooDeep", "[" * 40 + "]" * 40),
        ]
    ),
    Row("a receipt the webhook accepts", "Nothing lost",
        [[receipt("m1", "r-1")]], [[]], entries={"acc-1/RECEIPT#r-1"}, calls=1),
    Row("a receipt after a 5xx, then a 200", "Nothing lost",
        [[receipt("m1", "r-1")], [receipt("m1", "r-1")]], [["m1"], []], entries={"acc-1/RECEIPT#r-1"},
        webhook=[Answer(503)], calls=2),
    Row("a receipt the webhook rejects (4xx)", "Nothing lost",
        [[receipt("m1", "r-1")]], [[]], entries=set(), dead={"m1": "WebhookRejected"}, webhook=[Answer(422)], calls=1),
    Row("a receipt in flight elsewhere is reported, not run", "Nothing lost",
        [[receipt("m1", "r-1")]], [["m1"]], entries=set(), calls=0,
        before=_claimed_by_another_worker(receipt("m1", "r-1"), 60_000)),
    # -- Fencing -----------------------------------------------------------------------------------
    Row("a zombie cannot overwrite or release the newer owner's record", "Fencing",
        [], [], entries={"acc-1/RECEIPT#z1"}, after=_zombie_cannot_overwrite),
    # -- No stuck records --------------------------------------------------------------------------
    Row("a crashed worker's claim ends with its lease", "No stuck records",
        [[receipt("m1", "r-1")]], [[]], entries={"acc-1/RECEIPT#r-1"}, calls=1,
        before=_claimed_by_another_worker(receipt("m1", "r-1"), 50, then_wait_s=0.2)),
    # -- One bad record never fails the batch --------------------------------------------------------
    Row("poison, a failure and good records in one batch", "One bad record never fails the batch",
        [[pay("m1", "p-1"), sqs_record("m2", "{"), receipt("m3", "r-1"), pay("m4", "p-2", account="acc-2")]],
        [["m3"]], {"acc-1": 100, "acc-2": 100}, dead={"m2": "InvalidJson"}, webhook=[Answer(503)]),
    # -- Order on FIFO queues, none on standard and fair queues -------------------------------------
    Row("FIFO: a group stops at its first failure; the rest of the group follows it", "Order only on FIFO queues",
        [[grouped(pay("a1", "p-1"), "A", fifo=True), grouped(receipt("a2", "r-1"), "A", fifo=True),
          grouped(pay("a3", "p-3"), "A", fifo=True), grouped(pay("b1", "p-4", account="acc-b"), "B", fifo=True)],
         [grouped(receipt("a2", "r-1"), "A", fifo=True), grouped(pay("a3", "p-3"), "A", fifo=True)]],
        [["a2", "a3"], []], {"acc-1": 200, "acc-b": 100}, webhook=[Answer(503)], calls=2),
    Row("fair queue: a tenant's failure holds back none of its records", "Order only on FIFO queues",
        [[grouped(pay("a1", "p-1"), "t-1", fifo=False), grouped(receipt("a2", "r-1"), "t-1", fifo=False),
          grouped(pay("a3", "p-3"), "t-1", fifo=False)]],
        [["a2"]], {"acc-1": 200}, webhook=[Answer(503)], calls=1),
]  # fmt: skip


@pytest.fixture
def make_stack(local_servers: LocalServers, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Stack]]:
    for name, value in {
        "AWS_ENDPOINT_URL_DYNAMODB": local_servers.dynamodb_endpoint_url,
        "AWS_ENDPOINT_URL_SQS": local_servers.sqs_endpoint_url,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
    }.items():
        monkeypatch.setenv(name, value)
    with WebhookSink() as sink:

        def make() -> Stack:
            resources = local_servers.deploy()
            settings = settings_for_tests(
                tables=resources.tables,
                dead_letter_queue_url=resources.queues["ConsumerDeadLetterQueue"].url,
                receipt_webhook_url=sink.receipts_url,
                webhook_timeout_ms=2_000,
            )
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
    assert {account: stack.balance(account) for account in row.balances} == row.balances
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
