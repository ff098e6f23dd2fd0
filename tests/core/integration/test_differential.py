"""The proof sees both ways (issue 47): a message comes to the same end whether or not it shares a transaction.

Each scenario of the contract (duplicates, key reuse, guards, refusals, 4xx, 5xx, crashes, lost answers, zombies,
FIFO) is run twice on DynamoDB Local behind the conflict emulation, on fresh tables each time: once with
``GROUP_COMMIT=false`` (each message's transition its own write) and once grouped (transitions of different messages
ready at the same moment share one ``TransactWriteItems``), both with ten workers, so every lane of a batch runs at
once. The consumer is wired as the function is, on the core's test handlers.

Group commit is an optimisation below the store: each message still lives its own life (claim, handler under its own
lease, commit or release; or its one apply), and a shared transaction's answer is read per message. So what can be
observed of a message must not depend on it: each delivery's outcomes, the dead letters, every idempotency record,
the business items (holds among them) and the webhook calls (a repeated call shows) are compared whole. Two equally
broken runs would agree too, so each scenario also holds the runs to a fact or two it expects (a tally's total, the
number of calls). Outcomes are built, not raced for: the hooks of the handlers and the test's clock order them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.exceptions import ConnectionClosedError

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.errors import ErrorType
from consumer.handler import MessageContext, MessageHandler
from consumer.idempotency.record import Attr
from consumer.outcome import Outcome
from consumer.webhook import signing_key
from testkit.lambda_sqs import FIFO_QUEUE_ARN, sqs_record
from testkit.servers import LocalServers
from testkit.webhook import Answer, WebhookSink
from tests.core.handlers import (
    CALL_EVENT,
    CALL_TABLE,
    HOLD_EVENT,
    REFUSALS,
    TALLY_EVENT,
    TALLY_TABLE,
    CallHandler,
    HoldHandler,
    TallyHandler,
    call_body,
    hold_body,
    hold_key,
    refusals,
    tally_body,
)
from tests.kit import Clock, Remaining, drain, reasons
from tests.utils import settings_on_local_servers

# Below the invocation's 30 s less the lease margin, so every claim's lease is exactly this.
LEASE_MS = 10_000
LOG = logging.getLogger("tests.differential")
APPLIED, DUPLICATE, RETRIED = Outcome.APPLIED, Outcome.DUPLICATE, Outcome.RETRIED
Record = dict[str, Any]


class Crash(BaseException):
    """The Lambda environment dies inside a handler (a timeout): nothing of the consumer catches it."""


@dataclass(frozen=True)
class Observation:
    deliveries: tuple[dict[str, Outcome], ...]  # per delivery: message id -> outcome
    dead_letters: dict[str, str | None]  # message id -> ErrorType
    records: dict[str, str]  # idempotency record id -> status
    items: dict[str, str]  # "tally/entry" -> amount (TOTAL: the total); call or hold id -> its status
    calls: tuple[str, ...]  # the webhook's Idempotency-Keys, sorted: a repeated call shows twice


class Run:
    """One run of a scenario: the template's tables and queues deployed afresh, a consumer wired as the function is
    (grouping on or off) on a clock of its own, and the hooks a scenario sets."""

    def __init__(self, servers: LocalServers, webhook: WebhookSink, group_commit: bool) -> None:
        self.settings = settings_on_local_servers(
            servers, max_workers=10, group_commit=group_commit, lease_max_ms=LEASE_MS
        )
        self.webhook, self.clock = webhook, Clock()
        self.session = boto3.session.Session()
        self.dynamodb = self.session.client("dynamodb")
        self.crash: set[str] = set()  # hold keys whose handler dies, once each
        self.signing: list[Callable[[], None]] = []  # run once, by the next call's handler as it signs its call
        self.lose: str | None = None  # a record id: the first transaction carrying it lands, and its answer is lost
        self.session.events.register("before-parameter-build.dynamodb.TransactWriteItems", self._carries)
        self.session.events.register("after-call.dynamodb.TransactWriteItems", self._lost)
        self.deliveries: list[dict[str, Outcome]] = []
        self.consumer = self.wire(self.clock)

    def wire(self, clock: Clock) -> BatchRunner:
        """A consumer of this deployment: the run's own, or another Lambda environment's."""
        settings = self.settings
        handlers: dict[str, MessageHandler[Any]] = {
            TALLY_EVENT: TallyHandler(settings),
            CALL_EVENT: CallHandler(settings, self.webhook.url, signing_key=self._sign),
            HOLD_EVENT: HoldHandler(settings, self._during),
        }
        return wire(settings, self.session, clock, handlers=handlers, logger=LOG)

    def _during(self, context: MessageContext) -> None:
        if context.idempotency_key in self.crash:
            self.crash.discard(context.idempotency_key)
            raise Crash(context.idempotency_key)

    def _sign(self) -> tuple[bytes, ...]:
        # Called inside a call's handler, after its claim and before its POST.
        if self.signing:
            self.signing.pop()()
        return (signing_key(self.webhook.secret, "the sink's secret"),)

    def _carries(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        keys = [next(iter(item.values())).get("Key", {}).get(Attr.ID) for item in params["TransactItems"]]
        context["lose"] = self.lose is not None and {"S": self.lose} in keys

    def _lost(self, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        """The transaction was applied, and its answer is lost: the consumer sees a dropped connection."""
        if context.get("lose") and self.lose is not None and http_response.status_code == 200:
            self.lose = None
            raise ConnectionClosedError(endpoint_url="http://dynamodb")

    def deliver(self, batch: list[Record], consumer: BatchRunner | None = None) -> dict[str, Outcome]:
        results = (consumer or self.consumer).process(batch, Remaining()).results
        outcomes = {result.message_id: result.outcome for result in results}
        self.deliveries.append(outcomes)
        return outcomes

    def hold_taken(self, hold_id: str) -> None:
        """Another message's hold stands on ``hold_id``."""
        item = {**hold_key(hold_id), "status": "HELD", "holdToken": "another"}
        table = self.settings.table_names[CALL_TABLE]
        self.dynamodb.put_item(TableName=table, Item={name: {"S": value} for name, value in item.items()})

    def observe(self, skip: int = 0) -> Observation:
        def scan(table: str) -> list[dict[str, Any]]:
            return list(self.dynamodb.scan(TableName=table, ConsistentRead=True)["Items"])

        def value(attribute: dict[str, Any]) -> str:
            return str(next(iter(attribute.values())))

        tables = self.settings.table_names
        items = {
            f"{i['tallyId']['S']}/{i['entryId']['S']}": value(i.get("tallied") or i["amount"])
            for i in scan(tables[TALLY_TABLE])
        }
        items |= {i["callId"]["S"]: value(i["status"]) for i in scan(tables[CALL_TABLE])}
        return Observation(
            deliveries=tuple(self.deliveries[skip:]),
            dead_letters=reasons(drain(self.session.client("sqs"), self.settings.dead_letter_queue_url)),
            records={i[Attr.ID]["S"]: i[Attr.STATUS]["S"] for i in scan(self.settings.idempotency_table_name)},
            items=items,
            calls=tuple(sorted(map(str, self.webhook.keys()))),
        )


def again(record: Record) -> Record:
    """SQS's next delivery of a message: the same message id and body, received once more."""
    attributes = record["attributes"]
    return {
        **record,
        "attributes": {**attributes, "ApproximateReceiveCount": str(int(attributes["ApproximateReceiveCount"]) + 1)},
    }


def tallies(*numbers: int) -> list[Record]:
    return [sqs_record(f"tally-{n}", tally_body(f"e-{n}", tally_id=f"t-{n}")) for n in numbers]


def calls(*numbers: int) -> list[Record]:
    return [sqs_record(f"call-{n}", call_body(f"c-{n}")) for n in numbers]


def holds(*numbers: int) -> list[Record]:
    return [sqs_record(f"hold-{n}", hold_body(f"h-{n}")) for n in numbers]


# -- the scenarios ------------------------------------------------------------------------------


def duplicates(run: Run) -> None:
    """New tallies and calls beside an in-batch copy; then an SQS redelivery and a producer's resend."""
    tally, call = tallies(1)[0], calls(1)[0]
    run.deliver(
        [
            tally,
            sqs_record("tally-copy", tally["body"]),
            call,
            sqs_record("call-copy", call["body"]),
            *tallies(2),
            *calls(2),
        ]
    )
    run.deliver([again(tally), sqs_record("call-resent", call["body"]), *tallies(3), *calls(3)])


def key_reuse(run: Run) -> None:
    """Keys reused with another payload (used before, and inside the batch) beside new messages."""
    run.deliver([sqs_record("earlier", tally_body("e-2", tally_id="t-2", key="k-2")), *calls(3)])
    run.deliver(
        [
            *tallies(1),
            sqs_record("reused-tally", tally_body("e-2", tally_id="t-2", amount=7, key="k-2")),
            sqs_record("reused-call", call_body("c-3", tally_id="t-other")),
            sqs_record("first-5", tally_body("e-5", tally_id="t-5", key="k-5")),
            sqs_record("reused-5", tally_body("e-5", tally_id="t-5", amount=9, key="k-5")),
            *calls(4),
        ]
    )


def guards(run: Run) -> None:
    """New holds beside one refused (another message's hold stands) and one whose key is done."""
    run.hold_taken("h-2")
    done = holds(3)[0]
    run.deliver([done])
    run.deliver([*holds(1, 2, 4), sqs_record("hold-3-resent", done["body"]), *tallies(1)])


def refused(run: Run) -> None:
    """A tally whose entry exists under another key (BusinessConditionFailed) beside new ones (and a duplicate and a
    key reused)."""
    before, batch = refusals()
    run.deliver(before)
    run.deliver(batch)


def rejected(run: Run) -> None:
    """One call of a batch answered 422: dead-lettered, its claim released."""
    run.webhook.answer_next(Answer(status=422), key="call-c-2")
    run.deliver([*calls(1, 2, 3, 4), *tallies(1)])


def unavailable(run: Run) -> None:
    """One call answered 503: retried and released, so its next delivery applies at once."""
    run.webhook.answer_next(Answer(status=503), key="call-c-2")
    batch = [*calls(1, 2, 3), *holds(1), *tallies(1)]
    run.deliver(batch)
    run.deliver([again(batch[1])])


def crashes(run: Run) -> None:
    """A lock handler dies beside quick lock and optimistic messages; after its lease, its redelivery takes over."""
    run.crash.add("hold-h-9")
    crashed = holds(9)[0]
    with pytest.raises(Crash):
        # The batch waits for all its lanes before the crash escapes: the others' records are settled, their
        # outcomes never reported (this delivery's outcomes are not observed, the records and calls are).
        run.deliver([crashed, *holds(1, 2), *calls(1, 2), *tallies(1, 2)])
    run.clock.advance(LEASE_MS / 1000 + 1)
    run.deliver([again(crashed)])


def lost_answers(run: Run) -> None:
    """The first transaction carrying one call's record lands and its answer is lost; the failed are redelivered.

    Alone, that transaction is the call's own commit: its message is retried through SQS, and its redelivery finds
    it done (a duplicate). Grouped, it is usually the claim all the batch's messages shared: each one's own write
    finds its claim (or apply) landed, and the first delivery applies them all. So the first delivery's outcomes may
    differ, legitimately, and are not compared; whatever came after is. The call is redelivered either way (SQS may
    redeliver any message): its second delivery is a duplicate alone and grouped.
    """
    lost = sqs_record("lost", call_body("c-lost"))
    run.lose = "CallRequested#call-c-lost"
    batch = [lost, *calls(1, 2), *holds(1, 2), *tallies(1, 2)]
    outcomes = run.deliver(batch)
    assert run.lose is None, "no transaction carried the call's record"
    run.deliver([again(record) for record in batch if record is lost or outcomes[record["messageId"]].is_failure])


def zombies(run: Run) -> None:
    """A call's handler outlives its lease while another environment takes the key over and commits: the first one's
    call is made too, and its commit is fenced (retried); its next delivery is a duplicate."""
    zombie = sqs_record("zombie", call_body("c-z"))

    def take_over() -> None:
        # Inside the zombie's handler, before its call: SQS hands the message to another environment, whose clock
        # reads a lease later. The zombie does not know (its own clock has not moved, so its call keeps its deadline).
        later = Clock(run.clock() + LEASE_MS / 1000 + 1)
        run.deliver([again(zombie)], run.wire(later))

    run.signing.append(take_over)
    # The only call in the batch: no other handler can run the hook.
    run.deliver([zombie, *holds(1, 2), *tallies(1, 2)])
    run.deliver([again(again(zombie))])


def fifo(run: Run) -> None:
    """Two FIFO groups; one has a 503 in its middle: the rest of that group is reported, the other group applied."""

    def record(message_id: str, body: str) -> Record:
        return sqs_record(message_id, body, group_id=message_id[0], queue_arn=FIFO_QUEUE_ARN)

    run.webhook.answer_next(Answer(status=503), key="call-c-a2")
    a = [record("a-1", call_body("c-a1")), record("a-2", call_body("c-a2")), record("a-3", tally_body("a3", "t-a"))]
    b = [
        record("b-1", tally_body("b1", "t-b")),
        record("b-2", call_body("c-b2")),
        record("b-3", tally_body("b3", "t-b")),
    ]
    outcomes = run.deliver([a[0], b[0], a[1], b[1], a[2], b[2]])
    run.deliver([again(message) for message in a + b if outcomes[message["messageId"]].is_failure])


@dataclass(frozen=True)
class Scenario:
    play: Callable[[Run], None]
    facts: Callable[[Observation], object]  # a fact or two of the observation...
    expected: object  # ...and what they must be
    compare_from: int = 0  # the first delivery whose outcomes are compared (lost answers: 1)


SCENARIOS = [
    Scenario(
        duplicates,
        lambda o: (o.deliveries[0]["tally-copy"], o.deliveries[1], o.items["t-1/TOTAL"], o.calls),
        (
            DUPLICATE,
            {"tally-1": DUPLICATE, "call-resent": DUPLICATE, "tally-3": APPLIED, "call-3": APPLIED},
            "1250",
            ("call-c-1", "call-c-2", "call-c-3"),
        ),
    ),
    Scenario(
        key_reuse,
        lambda o: (o.dead_letters, o.items["t-2/TOTAL"], o.items["t-5/TOTAL"], o.calls),
        (
            dict.fromkeys(["reused-tally", "reused-call", "reused-5"], ErrorType.IDEMPOTENCY_KEY_REUSED),
            "1250",
            "1250",
            ("call-c-3", "call-c-4"),
        ),
    ),
    Scenario(
        guards,
        lambda o: (o.dead_letters, o.deliveries[1]["hold-3-resent"], [o.items[f"HOLD#h-{n}"] for n in range(1, 5)]),
        ({"hold-2": ErrorType.BUSINESS_CONDITION_FAILED}, DUPLICATE, ["DONE", "HELD", "DONE", "DONE"]),
    ),
    Scenario(
        refused,
        lambda o: (o.deliveries[1], [o.items[f"t-{n}/TOTAL"] for n in range(1, 6)]),
        (REFUSALS, ["1250"] * 5),
    ),
    Scenario(
        rejected,
        lambda o: (o.dead_letters, "CallRequested#call-c-2" in o.records, o.calls),
        ({"call-2": ErrorType.WEBHOOK_REJECTED}, False, ("call-c-1", "call-c-2", "call-c-3", "call-c-4")),
    ),
    Scenario(
        unavailable,
        lambda o: (o.deliveries[0]["call-2"], o.deliveries[1], o.calls),
        (RETRIED, {"call-2": APPLIED}, ("call-c-1", "call-c-2", "call-c-2", "call-c-3")),
    ),
    Scenario(
        crashes,
        lambda o: (o.deliveries, set(o.records.values()), o.items["HOLD#h-9"], o.calls),
        (({"hold-9": APPLIED},), {"COMPLETED"}, "DONE", ("call-c-1", "call-c-2")),
    ),
    Scenario(
        lost_answers,
        lambda o: (o.deliveries, len(o.records), set(o.records.values()), o.calls),
        (({"lost": DUPLICATE},), 7, {"COMPLETED"}, ("call-c-1", "call-c-2", "call-c-lost")),
        compare_from=1,
    ),
    Scenario(
        zombies,
        lambda o: (o.deliveries[0], o.deliveries[1]["zombie"], o.deliveries[2], o.items["c-z"], o.calls),
        ({"zombie": APPLIED}, RETRIED, {"zombie": DUPLICATE}, "200", ("call-c-z", "call-c-z")),
    ),
    Scenario(
        fifo,
        lambda o: (o.deliveries, o.items["t-b/TOTAL"], o.calls),
        (
            (
                {"a-1": APPLIED, "a-2": RETRIED, "a-3": RETRIED, "b-1": APPLIED, "b-2": APPLIED, "b-3": APPLIED},
                {"a-2": APPLIED, "a-3": APPLIED},
            ),
            "2500",
            ("call-c-a1", "call-c-a2", "call-c-a2", "call-c-b2"),
        ),
    ),
]


def observe(servers: LocalServers, scenario: Scenario, group_commit: bool) -> Observation:
    with WebhookSink() as webhook:
        run = Run(servers, webhook, group_commit)
        scenario.play(run)
        return run.observe(skip=scenario.compare_from)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[scenario.play.__name__ for scenario in SCENARIOS])
def test_each_message_as_if_alone(local_aws: LocalServers, scenario: Scenario) -> None:
    alone = observe(local_aws, scenario, group_commit=False)
    grouped = observe(local_aws, scenario, group_commit=True)
    assert grouped == alone
    assert scenario.facts(alone) == scenario.expected
